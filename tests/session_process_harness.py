"""Real detached session processes for tests: a private runtime folder, start, connect, always end.

The runtime folder is made under /tmp with a short name: a Unix socket's path must fit in 107 bytes,
and pytest's tmp_path can be longer than that.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.protocol.client import SessionClient
from workbench.protocol.wire import ClientHello


def cli(args: list[str], env: dict[str, str], *, input: str | None = None, timeout: float = 60.0, cwd: Path | None = None
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workbench", *args], env=env, input=input, capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


@dataclass
class Detached:
    """One session process started with `run --detach`."""

    name: str
    pid: int
    runtime: Path
    env: dict[str, str]
    root: Path
    clients: list[SessionClient] = field(default_factory=list)

    @property
    def socket(self) -> Path:
        return self.runtime / f"{self.name}.sock"

    def connect(self, client: str = "test", history: str = "none", **kwargs: Any) -> SessionClient:
        connection = SessionClient(self.socket, ClientHello(client=client, history=history, **kwargs))
        self.clients.append(connection)
        return connection

    def events_file(self) -> Path:
        runs = sorted((self.root / ".vram-bench" / "runs").iterdir())
        return runs[-1] / "events.jsonl"

    def logged(self) -> list[dict[str, Any]]:
        try:
            text = self.events_file().read_text(encoding="utf-8")
        except (OSError, IndexError):
            return []
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        try:  # a zombie is not alive: it is our grandchild only through setsid, so read its state
            return Path(f"/proc/{self.pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
        except OSError:
            return False


def wait_message(client: SessionClient, predicate: Callable[[dict[str, Any]], bool], timeout: float = 15.0,
                 what: str = "a message") -> dict[str, Any]:
    """Read the client's lines until one matches (the reads time out after `timeout`)."""
    client._sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    try:
        for message in client.messages():
            if predicate(message):
                return message
            seen.append(str(message.get("event") or message.get("wire")))
            if time.monotonic() > deadline:
                break
    except TimeoutError:
        pass
    raise AssertionError(f"no {what} within {timeout} s; saw {seen[-30:]}")


async def until(pilot: Any, condition: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    """In an app test: pause the pilot until `condition()` holds (an AssertionError naming `what` after `timeout`)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


def wait_until(condition: Callable[[], bool], timeout: float = 15.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {timeout} s")


class Sessions:
    """Starts detached sessions in one private runtime folder; `close()` kills whatever is left."""

    def __init__(self) -> None:
        self.runtime_base = Path(tempfile.mkdtemp(prefix="vb", dir="/tmp"))
        os.chmod(self.runtime_base, 0o700)
        self.env = {**os.environ, "XDG_RUNTIME_DIR": str(self.runtime_base), "PYTHONUNBUFFERED": "1"}
        self.started: list[Detached] = []

    @property
    def runtime(self) -> Path:
        return self.runtime_base / "vram-bench"

    def start(self, entry: Path, *extra: str) -> Detached:
        result = cli(["run", str(entry), "--detach", *extra], self.env, timeout=120)
        assert result.returncode == 0, result.stderr
        facts = sorted(self.runtime.glob("*.json"), key=lambda p: p.stat().st_mtime)[-1]
        data = json.loads(facts.read_text())
        detached = Detached(data["name"], data["pid"], self.runtime, self.env, entry.parent)
        self.started.append(detached)
        return detached

    def close(self) -> None:
        for detached in self.started:
            for client in detached.clients:
                client.close()
            if detached.alive():
                os.kill(detached.pid, signal.SIGKILL)
                wait_until(lambda: not detached.alive(), 10, "the session's death")
        shutil.rmtree(self.runtime_base, ignore_errors=True)


def sessions_fixture() -> Iterator[Sessions]:
    sessions = Sessions()
    try:
        yield sessions
    finally:
        sessions.close()
