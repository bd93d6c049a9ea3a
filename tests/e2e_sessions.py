"""Session processes for the terminal end-to-end tests: a private runtime folder per test, and nothing left running.

`vram-bench run` starts the training session as a detached process of its own (setsid) that
outlives the app, the terminal and the tmux server. Each test gets a short runtime folder under
/tmp (a Unix socket's path must fit in 107 bytes; pytest's tmp_path can be longer) as its
XDG_RUNTIME_DIR; at teardown `end_sessions` ends every session process started there, and
the children they started, then removes the folder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

TERM_GRACE = 20.0  # SIGTERM asks for a final snapshot first: give it this long before SIGKILL


def make_runtime_dir() -> Path:
    """A short private folder to serve as XDG_RUNTIME_DIR (0700, like the one a login manager makes)."""
    folder = Path(tempfile.mkdtemp(prefix="vb", dir="/tmp"))
    folder.chmod(stat.S_IRWXU)
    return folder


def sessions_folder(runtime_dir: Path) -> Path:
    """Where vram-bench keeps its sockets and facts under XDG_RUNTIME_DIR."""
    return runtime_dir / "vram-bench"


def session_facts(runtime_dir: Path) -> list[dict[str, Any]]:
    """The facts (`NAME.json`: name, pid, project, ...) of every session recorded in the runtime folder."""
    found = []
    for path in sorted(sessions_folder(runtime_dir).glob("*.json")):
        try:
            found.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue  # written atomically, but a test may race its removal
    return found


def wait_session_facts(runtime_dir: Path, timeout: float = 30.0) -> dict[str, Any]:
    """The one session's facts, once the session process has written them."""
    deadline = time.monotonic() + timeout
    while True:
        facts = session_facts(runtime_dir)
        if len(facts) == 1 and facts[0].get("pid"):
            return facts[0]
        if time.monotonic() > deadline:
            listing = sorted(p.name for p in sessions_folder(runtime_dir).glob("*")) if sessions_folder(runtime_dir).is_dir() else []
            raise AssertionError(f"expected one session's facts in {sessions_folder(runtime_dir)} within {timeout:.0f} s; "
                                 f"found {facts} (files: {listing})")
        time.sleep(0.1)


def pid_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie is gone for our purposes."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait up to `timeout` s for `pid` to end; whether it did."""
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _session_pids(runtime_dir: Path) -> set[int]:
    """Session processes of this runtime folder: from the facts files, and (a session still importing its
    project has written none yet) the processes of this user whose command line names a session and whose
    environment points at this folder."""
    pids = {int(facts["pid"]) for facts in session_facts(runtime_dir) if str(facts.get("pid", "")).isdigit()}
    marker = f"XDG_RUNTIME_DIR={runtime_dir}".encode()
    for process in psutil.process_iter(["pid", "uids", "cmdline"]):
        try:
            if process.info["uids"] is None or process.info["uids"].real != os.getuid():
                continue
            if "--session-name" not in (process.info["cmdline"] or ()):
                continue
            environ = Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
        except (psutil.Error, OSError):
            continue
        if marker in environ:
            pids.add(process.pid)
    return pids


def end_sessions(runtime_dir: Path, grace: float = TERM_GRACE) -> list[str]:
    """End every session process of this runtime folder and its children: SIGTERM, then SIGKILL after `grace` s.
    Removes the folder. Returns what had to be done by force (for the test's report)."""
    forced: list[str] = []
    sessions: list[psutil.Process] = []
    children: list[psutil.Process] = []
    for pid in _session_pids(runtime_dir):
        try:
            session = psutil.Process(pid)
            children.extend(session.children(recursive=True))  # a step's subprocesses, DataLoader workers
        except psutil.Error:
            continue
        sessions.append(session)
    for session in sessions:
        try:
            session.send_signal(signal.SIGTERM)  # the session's own meaning: final snapshot, end its children, exit
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(sessions + children, timeout=grace)
    for process in alive:
        try:
            forced.append(f"pid {process.pid} ({' '.join(process.cmdline())[:120]}) killed after {grace:.0f} s")
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)
    shutil.rmtree(runtime_dir, ignore_errors=True)
    return forced
