"""The session as a process of its own: detached, reached over its private socket, never harmed by a client.

Real processes and real sockets throughout: `run --detach` starts the session process, the tests
speak the protocol with workbench.protocol.client, and `ls`/`stop`/`attach --json` run as commands.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import TRAIN_PY, make_project
from session_process_harness import Sessions, cli, sessions_fixture, wait_message, wait_until

pytestmark = pytest.mark.timeout(180)

sessions = pytest.fixture(sessions_fixture)


def is_event(kind: str, **fields: object):
    return lambda m: m.get("event") == kind and all(m.get(k) == v for k, v in fields.items())


def steps_of(logged: list[dict]) -> list[int]:
    return [m["step"] for m in logged if m.get("event") == "step"]


def test_detached_session_outlives_its_starter_and_is_private(tmp_path: Path, sessions: Sessions) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    live = sessions.start(root / "train.py")
    # Its own session and process group, no controlling terminal: a terminal's SIGHUP cannot reach it.
    assert os.getsid(live.pid) == live.pid and os.getpgid(live.pid) == live.pid
    tty_nr = int(Path(f"/proc/{live.pid}/stat").read_text().split(")")[-1].split()[4])
    assert tty_nr == 0
    assert stat.S_IMODE(sessions.runtime.stat().st_mode) == 0o700
    assert stat.S_IMODE(live.socket.stat().st_mode) == 0o600
    # It writes events.jsonl with nobody attached, and keeps stepping.
    wait_until(lambda: len(steps_of(live.logged())) >= 5, what="5 steps in events.jsonl")
    live.connect("watcher")
    listed = cli(["ls"], sessions.env)
    assert listed.returncode == 0
    header, row = listed.stdout.splitlines()[:2]
    assert header.split()[:4] == ["NAME", "PID", "STATE", "STEP"]
    assert row.split()[:3] == [live.name, str(live.pid), "running"]
    assert int(row.split()[3]) >= 5
    assert row.split()[7] == "1", "CLIENTS counts the attached watcher, not ls itself"


def test_attach_json_scripted_commands_and_the_log_names_the_client(tmp_path: Path, sessions: Sessions) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    live = sessions.start(root / "train.py")
    watcher = live.connect("watcher")
    wait_message(watcher, is_event("step"), what="a step")
    # A scripted attach: commands in on stdin, events out on stdout.
    import subprocess
    import sys

    attach = subprocess.Popen([sys.executable, "-m", "workbench", "attach", live.name, "--json"], env=sessions.env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        hello = json.loads(attach.stdout.readline())
        assert hello["wire"] == "hello" and hello["session"]["name"] == live.name and hello["status"]["state"] == "running"
        attach.stdin.write("pause\n")
        attach.stdin.flush()
        paused = wait_message(watcher, is_event("paused", reason="user"), what="paused")
        sent = [m for m in live.logged() if m.get("event") == "command"]
        assert sent and sent[-1]["command"] == "pause" and "attach --json" in sent[-1]["client"]
        for line in attach.stdout:  # the attach client saw it too
            if json.loads(line).get("event") == "paused":
                break
        status = wait_message(watcher, lambda m: m.get("wire") == "status" and m.get("state") == "paused", what="status")
        assert status["step"] == paused["step"] and status["clients"] == 2
        attach.stdin.write("resume\n")
        attach.stdin.flush()
        wait_message(watcher, is_event("resumed"), what="resumed")
    finally:
        attach.terminate()
        attach.wait(10)
    assert live.alive()


def test_bad_input_gets_an_error_to_that_client_and_harms_nothing(tmp_path: Path, sessions: Sessions) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    live = sessions.start(root / "train.py")
    watcher = live.connect("watcher")
    bad = live.connect("bad")
    cases = [
        b"\x00\xff\xfe garbage \x80\n",
        b"x" * (10 << 20) + b"\n",  # 10 MB on one line
        b"{not json\n",
        b'{"wire": "unknown-thing"}\n',
        b"frobnicate\n",
        b"profile many\n",
    ]
    for raw in cases:
        bad._sock.sendall(raw)
        error = wait_message(bad, is_event("error", where="command"), what=f"an error for {raw[:20]!r}")
        assert error["message"]
    # The other client saw none of those errors, and training went on.
    before = wait_message(watcher, is_event("step"), what="a step")["step"]
    wait_message(watcher, lambda m: m.get("event") == "step" and m["step"] >= before + 5, what="5 more steps")
    assert not any(m.get("event") == "error" and m.get("where") == "command" for m in live.logged())
    bad._sock.sendall(b"pause\n")  # the same connection still works
    wait_message(watcher, is_event("paused"), what="paused after the bad lines")


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_fifty_clients_killed_mid_message_leak_nothing_and_lose_no_step(tmp_path: Path, sessions: Sessions) -> None:
    import subprocess
    import sys

    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    live = sessions.start(root / "train.py")
    watcher = live.connect("watcher")
    wait_message(watcher, is_event("step"), what="a step")
    time.sleep(1.0)  # the sampler, watcher and reload threads are all up
    fds, threads = _open_fds(live.pid), _threads(live.pid)
    script = (
        "import socket, sys, time\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
        "s.sendall(b'{\"wire\":\"hello\",\"protocol\":1,\"client\":\"doomed\",\"history\":\"screen\"}\\n')\n"
        "s.recv(1)\n"
        "s.sendall(b'paus')  # half a command: then SIGKILL\n"
        "print('ready', flush=True); time.sleep(60)\n"
    )
    for _ in range(50):
        doomed = subprocess.Popen([sys.executable, "-c", script, str(live.socket)], stdout=subprocess.PIPE, text=True)
        assert doomed.stdout.readline().strip() == "ready"
        doomed.kill()
        doomed.wait()
    wait_until(lambda: _open_fds(live.pid) <= fds and _threads(live.pid) <= threads, 15,
               f"fds back to {fds} and threads to {threads} (now {_open_fds(live.pid)}, {_threads(live.pid)})")
    state = wait_message(watcher, lambda m: m.get("wire") == "status", what="status")
    assert state["state"] == "running", "a half-written 'paus' must not be taken as a command"
    steps = steps_of(live.logged())
    assert steps == list(range(1, len(steps) + 1)), "steps were lost or repeated"


def test_a_peer_with_another_uid_is_refused_and_logged(tmp_path: Path, start_session) -> None:
    """The check itself, with a fake credential: the test cannot switch users."""
    import tempfile

    from workbench.protocol.client import SessionClient, SessionGone
    from workbench.protocol.wire import ClientHello, Peer
    from workbench.engine.session_server import SessionServer

    live = start_session()
    live.wait_running()
    folder = Path(tempfile.mkdtemp(prefix="vb", dir="/tmp"))
    server = SessionServer(live.session, folder / "s.sock", facts={"name": "s"},
                           peer_credentials=lambda conn: Peer(pid=4242, uid=os.getuid() + 1, gid=0))
    server.start()
    try:
        with pytest.raises(SessionGone):
            SessionClient(folder / "s.sock", ClientHello(client="intruder"), timeout=5)
        refused = live.wait_for(lambda e: e.name == "error" and e.where == "client")
        assert f"uid {os.getuid() + 1}" in refused.message and "4242" in refused.message
        assert server.client_count == 0
    finally:
        server.close()
    assert not (folder / "s.sock").exists()


def test_a_second_run_of_the_same_project_offers_attach(tmp_path: Path, sessions: Sessions) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    live = sessions.start(root / "train.py")
    second = cli(["run", str(root / "train.py"), "--detach"], sessions.env)
    assert second.returncode == 2
    assert "already running" in second.stderr and f"vram-bench attach {live.name}" in second.stderr
    assert len(list(sessions.runtime.glob("*.sock"))) == 1


def test_a_killed_session_is_seen_by_its_client_and_cleaned_by_ls(tmp_path: Path, sessions: Sessions) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    live = sessions.start(root / "train.py")
    watcher = live.connect("watcher")
    wait_message(watcher, is_event("step"), what="a step")
    closed = threading.Event()

    def read_to_the_end() -> None:
        for _ in watcher.raw_lines():
            pass
        closed.set()

    threading.Thread(target=read_to_the_end, daemon=True).start()
    killed_at = time.monotonic()
    os.kill(live.pid, signal.SIGKILL)
    assert closed.wait(2.0), "the client did not see the session die within 2 s"
    assert time.monotonic() - killed_at < 2.0
    wait_until(lambda: not live.alive(), 10, "the session's death")
    assert live.socket.exists()  # SIGKILL leaves it behind...
    listed = cli(["ls"], sessions.env)
    assert f"session {live.name} is gone" in listed.stderr and "socket was removed" in listed.stderr
    assert not live.socket.exists()  # ...and ls cleans it up
    assert "no sessions" in listed.stdout


def test_stop_writes_a_snapshot_that_resume_latest_loads(tmp_path: Path, sessions: Sessions) -> None:
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    live = sessions.start(root / "train.py")
    watcher = live.connect("watcher")
    wait_message(watcher, lambda m: m.get("event") == "step" and m["step"] >= 5, what="5 steps")
    stopped = cli(["stop", live.name], sessions.env, timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    assert "final snapshot: " in stopped.stderr
    wait_until(lambda: not live.alive(), 10, "the session's end")
    assert not live.socket.exists()
    snapshot = [m for m in live.logged() if m.get("event") == "snapshot"][-1]
    last_step = steps_of(live.logged())[-1]
    resumed = cli(["run", str(root / "train.py"), "--headless", "--resume", "latest", "--max-steps", str(last_step + 2)],
                  sessions.env, input="", timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    events = [json.loads(line) for line in resumed.stdout.splitlines()]
    loaded = [e for e in events if e["event"] == "resume"]
    assert loaded and loaded[0]["path"] == snapshot["path"]
    assert [e["step"] for e in events if e["event"] == "step"][0] == last_step + 1


FAST_STEPS = TRAIN_PY.replace("    time.sleep(0.005)\n", "")


def test_a_stalled_client_never_slows_training_and_is_told_what_it_missed(tmp_path: Path, start_session) -> None:
    """A client that stops reading: its socket buffer fills, then its own queue drops its oldest events, and training
    goes on at its pace; when it reads again, a `dropped` line says how many it missed."""
    import tempfile

    from workbench.engine.session_server import SessionServer
    from workbench.protocol.client import SessionClient
    from workbench.protocol.wire import ClientHello

    live = start_session({"train.py": FAST_STEPS})
    live.wait_running()
    folder = Path(tempfile.mkdtemp(prefix="vb", dir="/tmp"))
    server = SessionServer(live.session, folder / "s.sock", facts={"name": "s"}, client_queue=100)
    server.start()
    try:
        stalled = SessionClient(folder / "s.sock", ClientHello(client="stalled", history="none"))
        stalled._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        rates = []
        for _ in range(3):  # training's pace while the client does not read at all
            before, started = live.session.status().step, time.monotonic()
            time.sleep(2.0)
            rates.append((live.session.status().step - before) / (time.monotonic() - started))
        assert min(rates) > 0.5 * max(rates), f"training slowed while a client stalled: {rates} steps/s"
        dropped = wait_message(stalled, lambda m: m.get("wire") == "dropped", timeout=20, what="a dropped line")
        assert dropped["count"] > 0
        wait_message(stalled, lambda m: m.get("event") == "step", what="steps again after the drop")
        stalled.close()
    finally:
        server.close()


def test_two_projects_of_one_name_get_two_sessions_and_a_bare_command_picks_this_folders(tmp_path: Path, sessions: Sessions) -> None:
    first = make_project(tmp_path / "a", {"train.py": TRAIN_PY})
    second = make_project(tmp_path / "b", {"train.py": TRAIN_PY})
    one = sessions.start(first / "train.py")
    two = sessions.start(second / "train.py")
    assert (one.name, two.name) == ("proj", "proj-2")
    elsewhere = cli(["attach", "--json"], sessions.env, input="", timeout=30, cwd=tmp_path)
    assert elsewhere.returncode == 2 and "2 sessions are running; name one" in elsewhere.stderr
    here = subprocess.Popen([sys.executable, "-m", "workbench", "attach", "--json"], env=sessions.env, cwd=second,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        hello = json.loads(here.stdout.readline())
        assert hello["session"]["name"] == "proj-2" and hello["session"]["pid"] == two.pid
    finally:
        here.kill()
        here.wait()


LOADER_WORKERS = '''\
import torch
from torch.utils.data import DataLoader, TensorDataset


def batches(loader):
    while True:
        yield from loader


def setup(bench):
    data = TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=8, num_workers=2, persistent_workers=True)
    model = torch.nn.Linear(4, 1)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01), "data": batches(loader)}


def step(state, bench):
    x, y = next(state["data"])
    loss = ((state["model"](x) - y) ** 2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return loss
'''


def test_forked_loader_workers_hold_no_socket_so_a_killed_session_is_still_seen(tmp_path: Path, sessions: Sessions) -> None:
    """DataLoader workers are forked from the session after its socket opened: they must not keep it (or a client's
    connection) open, or a client would not see the session die and its dead socket would still answer."""
    root = make_project(tmp_path, {"train.py": LOADER_WORKERS})
    live = sessions.start(root / "train.py")
    watcher = live.connect("watcher")
    wait_message(watcher, lambda m: m.get("event") == "step" and m["step"] >= 3, what="steps from the loader")
    import psutil

    workers = psutil.Process(live.pid).children()
    assert len(workers) >= 2, "the loader's workers did not start"
    closed = threading.Event()

    def read_to_the_end() -> None:
        for _ in watcher.raw_lines():
            pass
        closed.set()

    threading.Thread(target=read_to_the_end, daemon=True).start()
    os.kill(live.pid, signal.SIGKILL)
    assert closed.wait(2.0), "the client did not see the session die: a forked worker kept the connection open"
    wait_until(lambda: not live.alive(), 10, "the session's death")
    listed = cli(["ls"], sessions.env)
    assert f"session {live.name} is gone" in listed.stderr, listed.stderr



def test_attach_through_a_socket_path_as_ssh_forwards_it(tmp_path: Path, sessions: Sessions) -> None:
    """`ssh -L local.sock:remote.sock` gives a socket path of another name: `attach --socket PATH` uses it."""
    root = make_project(tmp_path, {"train.py": TRAIN_PY})
    live = sessions.start(root / "train.py")
    alias = sessions.runtime_base / "forwarded.sock"
    os.symlink(live.socket, alias)  # a path the registry does not know, as a forwarded socket would be
    attach = subprocess.Popen([sys.executable, "-m", "workbench", "attach", "--json", "--socket", str(alias)],
                              env=sessions.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        hello = json.loads(attach.stdout.readline())
        assert hello["session"]["pid"] == live.pid
        attach.stdin.write("pause\n")
        attach.stdin.flush()
        for line in attach.stdout:
            if json.loads(line).get("event") == "paused":
                break
    finally:
        attach.kill()
        attach.wait()
