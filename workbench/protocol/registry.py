"""Where a user's sessions are found: one socket and one facts file per session, in a private folder.

`$XDG_RUNTIME_DIR/vram-bench/` (a per-user tmpfs that the login manager empties at
logout) when it is set, else `~/.local/state/vram-bench/sessions/`, else (a path too long
for a Unix socket) `/tmp/vram-bench-<uid>/`, checked to be this user's own. The folder is
0700 and each socket 0600: on this machine, only this user reaches a session.

A session is `NAME.sock` (its socket) beside `NAME.json` (its facts: pid, project,
entry, device, start time) and `NAME.log` (the session process's own stdout and stderr).
A session killed with SIGKILL leaves its socket behind: `stale()` finds it (nothing
answers and its pid is gone) and `remove()` cleans it up.

The folder can be shared by several machines (a home directory on NFS, without
XDG_RUNTIME_DIR: common on clusters). Each session's facts name its host, and only the
sessions of this host are listed or judged: another host's pid means nothing here, and its
socket does not answer across machines, so judging it would delete a live session's files.
Its names stay taken.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from workbench.errors import UserError

SOCKET_PATH_MAX = 107  # sun_path is 108 bytes on Linux, one of them the terminating NUL
NAME_ROOM = 48  # room left in a socket's path for "/<name>.sock"


def runtime_folder() -> Path:
    """The per-user folder of session sockets, created 0700 (and made 0700 if it was looser)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and Path(base).is_dir():
        folder = Path(base) / "vram-bench"
    else:
        state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        folder = Path(state) / "vram-bench" / "sessions"
    if len(os.fsencode(folder)) > SOCKET_PATH_MAX - NAME_ROOM:
        folder = Path(tempfile.gettempdir()) / f"vram-bench-{os.getuid()}"  # a socket's path must stay short
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = folder.stat()
    except OSError as exc:
        raise UserError(f"cannot make the sessions folder {folder} ({exc.strerror}).") from None
    if info.st_uid != os.getuid():
        raise UserError(f"the sessions folder {folder} belongs to another user (uid {info.st_uid}).",
                        hint="Set XDG_RUNTIME_DIR to a folder of your own.")
    if stat.S_IMODE(info.st_mode) != 0o700:
        folder.chmod(0o700)
    return folder


@dataclass(frozen=True)
class SessionFacts:
    """What `ls` shows without connecting, written by the session process when its socket is ready."""

    name: str
    pid: int
    project: str  # the project's folder
    entry: str  # its entry file
    device: str
    started: float  # time.time()
    log: str  # the session process's stdout/stderr
    host: str = ""  # the machine it runs on ("": written before facts named their host)


@dataclass(frozen=True)
class SessionEntry:
    name: str
    socket: Path
    facts: SessionFacts | None

    @property
    def facts_file(self) -> Path:
        return self.socket.with_suffix(".json")

    @property
    def log_file(self) -> Path:
        return self.socket.with_suffix(".log")


def socket_path(name: str, folder: Path | None = None) -> Path:
    path = (folder or runtime_folder()) / f"{name}.sock"
    if len(os.fsencode(path)) > SOCKET_PATH_MAX:
        raise UserError(f"the session socket's path {path} is longer than a Unix socket allows ({SOCKET_PATH_MAX} bytes).",
                        hint="Set XDG_RUNTIME_DIR to a shorter folder.")
    return path


def this_host() -> str:
    return socket.gethostname()


def entries(folder: Path | None = None) -> list[SessionEntry]:
    """Every session this user has on this machine, live or stale, by name (not those of other machines that share
    the folder: `elsewhere()`)."""
    return [entry for entry in _all_entries(folder) if not _elsewhere(entry)]


def elsewhere(folder: Path | None = None) -> list[SessionEntry]:
    """Sessions that other machines sharing this folder wrote: listed for what they are, never judged from here."""
    return [entry for entry in _all_entries(folder) if _elsewhere(entry)]


def _elsewhere(entry: SessionEntry) -> bool:
    return entry.facts is not None and entry.facts.host not in ("", this_host())


def _all_entries(folder: Path | None) -> list[SessionEntry]:
    folder = folder or runtime_folder()
    found: dict[str, SessionEntry] = {}
    for path in sorted(folder.glob("*.sock")) + sorted(folder.glob("*.json")):
        name = path.stem
        if name in found:
            continue
        found[name] = SessionEntry(name, folder / f"{name}.sock", read_facts(folder / f"{name}.json"))
    return list(found.values())


def read_facts(path: Path) -> SessionFacts | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return SessionFacts(**{k: data[k] for k in SessionFacts.__dataclass_fields__ if k in data})  # one missing: None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_facts(path: Path, facts: SessionFacts) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(facts)), encoding="utf-8")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def pid_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (dead, not yet reaped by a parent that is not init) is not running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: trust kill(0)
    return state != "Z"


def answers(path: Path, timeout: float = 1.0) -> bool:
    """True when something accepts a connection on the socket (it is then closed at once)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(os.fspath(path))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def stale(entry: SessionEntry) -> bool:
    """A session that died: its socket does not answer and its process is gone (or was never recorded)."""
    if entry.facts is not None and pid_alive(entry.facts.pid):
        return False
    return not (entry.socket.exists() and answers(entry.socket, 0.5))


def remove(entry: SessionEntry) -> None:
    """Clean up what a dead session left: its socket and facts (its log stays, for the post-mortem)."""
    for path in (entry.socket, entry.facts_file):
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def choose_name(project_root: Path, folder: Path | None = None) -> str:
    """The project folder's name, with a short suffix when a live session already has it."""
    folder = folder or runtime_folder()
    base = "".join(c if c.isalnum() or c in "-_." else "_" for c in project_root.name) or "session"
    taken = {e.name for e in entries(folder) if not stale(e)} | {e.name for e in elsewhere(folder)}
    if base not in taken:
        return base
    for n in range(2, 1000):
        if f"{base}-{n}" not in taken:
            return f"{base}-{n}"
    return f"{base}-{int(time.time())}"


def uptime(facts: SessionFacts, now: float | None = None) -> str:
    seconds = max(0, int((now or time.time()) - facts.started))
    hours, rest = divmod(seconds, 3600)
    if hours:
        return f"{hours}h{rest // 60:02d}m"
    return f"{rest // 60}m{rest % 60:02d}s"
