"""A process forked from the session (a DataLoader worker) keeps none of the session socket's connections.

The session server lists its clients and closes their fds in a forked child; a connection the accept thread had
accepted but not listed yet when the user's code forked was missed, so that client did not see the session die
until the worker ended (seen once in the full suite: test_session_process's forked-workers test). The child now
closes every socket whose own address is the session's path. Real sockets, a real fork.
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
from pathlib import Path

import pytest

from workbench.engine.session_server import close_connections_to

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def unix_listener(path: Path) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.fspath(path))
    listener.listen(4)
    return listener


def test_a_forked_child_closes_every_connection_to_the_session_socket_listed_or_not(tmp_path: Path) -> None:
    session_path, other_path = tmp_path / "session.sock", tmp_path / "other.sock"
    listener, other = unix_listener(session_path), unix_listener(other_path)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(os.fspath(session_path))
    accepted, _ = listener.accept()  # in no server's list: as if the fork came between accept() and the listing
    others_client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    others_client.connect(os.fspath(other_path))
    others_accepted, _ = other.accept()
    report_r, report_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: close, say what is still open, and live on until told (as a worker would)
        try:
            closed = close_connections_to(os.fspath(session_path))
            still = {name: is_open(s.fileno()) for name, s in
                     {"listener": listener, "accepted": accepted, "other": other, "others_accepted": others_accepted,
                      "client": client}.items()}
            os.write(report_w, json.dumps({"closed": closed, "open": still}).encode())
            os.read(go_r, 1)
        finally:
            os._exit(0)
    try:
        report = json.loads(os.read(report_r, 4096))
        assert report["closed"] == 2, report  # the session's listener and the connection accepted on it
        assert report["open"] == {"listener": False, "accepted": False, "other": True, "others_accepted": True,
                                  "client": True}, report
        # The session dies (here: its own copy closes) while the child lives: the client sees the end at once.
        accepted.close()
        ready, _, _ = select.select([client], [], [], 5.0)
        assert ready and client.recv(1) == b"", "the forked child still holds the session's connection"
        # Another socket's connection is untouched in the child: closing the parent's copy ends nothing.
        others_accepted.close()
        ready, _, _ = select.select([others_client], [], [], 0.3)
        assert not ready, "the child closed a connection that was not the session's"
    finally:
        os.write(go_w, b"x")
        os.waitpid(pid, 0)
        for sock in (listener, other, client, others_client):
            sock.close()
        for fd in (report_r, report_w, go_r, go_w):
            os.close(fd)
