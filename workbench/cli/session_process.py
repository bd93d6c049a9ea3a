"""The session as a process of its own, that outlives the terminal which started it.

`vram-bench run` (and `vram-bench` with no arguments) starts it detached: its own session
and process group (`setsid`), stdin from /dev/null, stdout and stderr into its log file
beside its socket, no controlling terminal, so a closed terminal or a dropped SSH link
(SIGHUP to the terminal's process group) never reaches it. It runs the project like
`--headless` does (SIGTERM: final snapshot, clean exit), writes `events.jsonl` in its run
folder whether or not anyone is attached, and serves its Unix socket
(workbench/engine/session_server.py) until it ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from workbench.errors import UserError
from workbench.protocol import registry

if TYPE_CHECKING:
    from workbench.engine.distributed import RankInfo
    from workbench.engine.session import Session

START_TIMEOUT = 600.0  # importing a project may load a model at import time: minutes, not hours
SESSION_NAME_OPTION = "--session-name"
# The first line of what the first rank of a node without rank 0 says (several machines: `--nnodes`). The session's
# app, socket and events.jsonl are on rank 0's node; a `run` on this node reads this line in the session process's log
# and says it instead of waiting for a socket that this node never opens.
NO_SESSION_HERE = "vram-bench: no session on this node:"


def session_of(project_root: Path, say: Callable[[str], None]) -> registry.SessionEntry | None:
    """The live session of this project folder, if one runs (dead ones met on the way are cleaned up, and said)."""
    for entry in registry.entries():
        if registry.stale(entry):
            registry.remove(entry)
            say(f"vram-bench: session {entry.name} had died (its pid is gone); its socket was removed")
            continue
        if entry.facts is not None and Path(entry.facts.project) == project_root:
            return entry
    return None


def refuse_second_session(project_root: Path, say: Callable[[str], None]) -> None:
    """Two sessions of one project would train two copies of the model: the second `run` says so."""
    entry = session_of(project_root, say)
    if entry is not None and entry.facts is not None:
        raise UserError(
            f"a session of {project_root} is already running: {entry.name} (pid {entry.facts.pid}).",
            hint=f"Attach to it with: vram-bench attach {entry.name}   (or end it: vram-bench stop {entry.name})",
        )


def session_argv(argv: list[str], name: str) -> list[str]:
    """The session process's own command line: the user's, with the session's name before any `--`."""
    if "--" in argv:
        cut = argv.index("--")
        return [*argv[:cut], SESSION_NAME_OPTION, name, *argv[cut:]]
    return [*argv, SESSION_NAME_OPTION, name]


def start_detached(argv: list[str], name: str, say: Callable[[str], None], timeout: float = START_TIMEOUT
                   ) -> registry.SessionEntry | None:
    """Start the session process and wait until its socket answers (or it fails to start: its error, exit 2).

    None: this node trains ranks only (several machines, rank 0 on another): the session process said so in its log,
    this says it, and the ranks go on in the background."""
    folder = registry.runtime_folder()
    sock = registry.socket_path(name, folder)
    log = sock.with_suffix(".log")
    with open(log, "ab", buffering=0) as out:
        os.chmod(log, 0o600)
        news = _LogTail(log, out.tell())  # the log is appended to: only this start's lines count
        process = subprocess.Popen(
            [sys.executable, "-m", "workbench", *session_argv(argv, name)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,  # setsid: no controlling terminal, its own process group
            close_fds=True,
        )
    deadline = time.monotonic() + timeout
    told = False
    while time.monotonic() < deadline:
        code = process.poll()
        if code is not None:
            raise _start_failed(log, code)
        if sock.exists() and registry.answers(sock, 0.5):
            return registry.SessionEntry(name, sock, registry.read_facts(sock.with_suffix(".json")))
        if (line := news.line_starting(NO_SESSION_HERE)) is not None:
            say(line)
            say(f"vram-bench: this node's ranks run in the background (launcher pid {process.pid}; its output: {log})")
            return None
        if not told and time.monotonic() > deadline - timeout + 3.0:
            say(f"vram-bench: starting session {name} (importing the project; its output: {log})")
            told = True
        time.sleep(0.05)
    raise UserError(f"session {name} did not open its socket within {timeout:.0f} s (pid {process.pid} goes on).",
                    hint=f"See {log}; end it with: kill {process.pid}")


class _LogTail:
    """The lines added to a log file since an offset, read as they come."""

    def __init__(self, path: Path, offset: int) -> None:
        self._path = path
        self._offset = offset
        self._partial = b""

    def line_starting(self, prefix: str) -> str | None:
        """The first whole new line that starts with `prefix`, if one came since the last call."""
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return None
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", errors="replace").rstrip("\r")
            if line.startswith(prefix):
                return line
        return None


def _start_failed(log: Path, code: int) -> UserError:
    """The session process ended before serving: its last words (the CLI's one-line error) are the error."""
    try:
        lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    errors = [line for line in lines if line.startswith("vram-bench: error: ")]
    if errors:
        error = UserError(errors[-1].removeprefix("vram-bench: error: "))
    else:
        error = UserError(f"the session process ended at start (exit code {code}): {lines[-1] if lines else 'no output'}",
                          hint=f"Its output: {log}")
    error.exit_code = 2 if code == 2 else 1  # type: ignore[attr-defined]
    return error


def serve(session: Session, name: str) -> int:
    """In the session process: serve the socket while the session runs as headless does; the exit code."""
    from workbench import __version__
    from workbench.frontends.headless import run_headless
    from workbench.engine.session_server import SessionServer

    folder = registry.runtime_folder()
    sock = registry.socket_path(name, folder)
    facts = registry.SessionFacts(
        name=name,
        pid=os.getpid(),
        project=str(session.project.root),
        entry=str(session.project.entry),
        device=str(session.config.device),
        started=time.time(),
        log=str(sock.with_suffix(".log")),
        host=registry.this_host(),
    )
    server = SessionServer(
        session,
        sock,
        facts={
            **facts.__dict__,
            "version": __version__,
            "run_dir": str(session.run_dir),
            "memory_window": session.config.memory_window,
            "requeue_signal": session.config.requeue_signal,
            "time_limit": _time_limit_fact(session),
            "torchrun": _torchrun_fact(session),
        },
    )
    registry.write_facts(sock.with_suffix(".json"), facts)  # first: once the socket answers, `ls` and `stop` know the pid
    server.start()
    print(f"vram-bench: session {name} (pid {os.getpid()}) serves {sock}; run folder {session.run_dir}", file=sys.stderr, flush=True)
    try:
        return run_headless(session, _Discard(), None, flush=server.flush, telemetry=False)
    finally:
        server.close()
        registry.remove(registry.SessionEntry(name, sock, facts))


def serve_nothing(session: Session, detached: bool = False) -> int:
    """A rank other than 0 under torchrun: the session runs as headless does, with no socket and no printer
    (its events go to its own events-rankN.jsonl). The first rank of a node without rank 0 says where the session is
    (`detached`: in a session process, whose app attaches to rank 0's socket; else rank 0's --headless stdout)."""
    from workbench.frontends.headless import run_headless

    info = session.ranks.info if session.ranks is not None else None
    if info is not None and (note := ranks_only_note(info, session.run_dir, detached=detached)) is not None:
        print(note, file=sys.stderr, flush=True)
    return run_headless(session, _Discard(), None, telemetry=False)


def ranks_only_note(info: RankInfo, run_dir: Path, master: str | None = None, detached: bool = True) -> str | None:
    """What the first rank of a node without rank 0 tells its user (None for every other rank): nothing of the session
    is on this node, so its user knows where to go instead of waiting for an app here."""
    first = info.rank - info.local_rank
    if info.local_rank != 0 or first == 0:
        return None
    last = first + info.local_world_size - 1
    of = f"(of {info.world_size})"
    ranks = f"rank {first} {of} trains here and stops" if first == last else f"ranks {first}-{last} {of} train here and stop"
    host = master if master is not None else os.environ.get("MASTER_ADDR", "")
    where = f"rank 0's node ({host})" if host else "rank 0's node"
    there = ("Its app, socket and events.jsonl are on {}: attach there (vram-bench attach)." if detached else
             "Its events come out of the launcher on {}, and go to events.jsonl.").format(where)
    return f"{NO_SESSION_HERE} {ranks} with the session. {there} This node's events: {run_dir}/events-rankN.jsonl"


def _torchrun_fact(session: Session) -> dict[str, int] | None:
    """Under torchrun: whether its launcher may start the ranks again after one is lost (`--max-restarts`), so that an
    attached app waits for the restarted rank 0 rather than saying the session ended."""
    if session.ranks is None:
        return None
    info = session.ranks.info
    return {"launcher_pid": os.getppid(), "restart": info.restart, "max_restarts": info.max_restarts}


def _time_limit_fact(session: Session) -> dict[str, object] | None:
    limit = session.config.time_limit
    if limit is None:
        return None
    return {"source": limit.source, "ends_at": time.time() + (limit.deadline - time.monotonic())}


class _Discard:
    """The session process's event printer writes nowhere: events.jsonl and the socket carry them."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass
