"""Two machines, simulated on one: two launchers (`run --nnodes 2 --rdzv-endpoint`), each with its own sessions
folder (as two hosts have), both in the same project folder (a shared filesystem).

The node that gets rank 0 hosts the session; the other's `run` says so and returns instead of waiting
for a socket its node never opens, while its rank trains on. A save is applied once, on both ranks, and
`stop` on rank 0's node ends both nodes.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.session_process_harness import Detached, Sessions, cli, wait_message, wait_until
from tests.test_distributed import PROJECT, save
from workbench.cli.session_process import NO_SESSION_HERE, ranks_only_note
from workbench.engine.distributed import RankInfo


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive_with(text: str) -> list[str]:
    done = subprocess.run(["pgrep", "-f", text], capture_output=True, text=True)
    return done.stdout.split()


def test_the_node_without_rank_0_says_where_the_session_is_and_stop_there_ends_both(tmp_path: Path):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text(PROJECT)
    endpoint = f"localhost:{free_port()}"
    nodes = [Sessions(), Sessions()]  # one sessions folder per "machine"
    try:
        argv = [sys.executable, "-m", "workbench", "run", str(project / "train.py"), "--detach", "--nproc-per-node", "1",
                "--nnodes", "2", "--rdzv-endpoint", endpoint]
        launched = [subprocess.Popen(argv, env=node.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    for node in nodes]
        said = [p.communicate(timeout=120) for p in launched]
        assert [p.returncode for p in launched] == [0, 0], said
        main = [i for i, (_, err) in enumerate(said) if "runs in the background" in err]
        other = [i for i, (_, err) in enumerate(said) if NO_SESSION_HERE in err]
        assert len(main) == 1 and len(other) == 1 and main != other, said  # rendezvous picks which node is which
        note = said[other[0]][1]
        assert "rank 1 (of 2) trains here" in note and "rank 0's node (localhost)" in note, note
        assert "launcher pid" in note, note
        assert not list(nodes[other[0]].runtime.glob("*.sock")), "no socket on the node without rank 0"

        host = nodes[main[0]]
        listed = cli(["ls"], host.env)
        name = listed.stdout.splitlines()[1].split()[0]
        facts = json.loads(next(host.runtime.glob("*.json")).read_text())
        live = Detached(facts["name"], facts["pid"], host.runtime, host.env, project)
        host.started.append(live)
        client = live.connect("watcher")
        wait_message(client, lambda m: m.get("event") == "step" and m.get("rank") == 1 and m["step"] >= 3, timeout=60,
                     what="the other node's rank 1 steps over rank 0's socket")
        save(project / "train.py", "LR = 0.05", "LR = 0.02")
        reload = wait_message(client, lambda m: m.get("event") == "reload", timeout=30, what="the reload")
        assert reload["ok"] and "LR" in reload["changed"], reload
        wait_message(client, lambda m: m.get("event") == "step" and m.get("rank") == 1 and m["code_version"] == 1,
                     timeout=30, what="rank 1 on code v1")
        time.sleep(1.0)  # a second save-free second: a save seen by both nodes is still applied once
        stopped = cli(["stop", name], host.env, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        wait_until(lambda: not alive_with(endpoint), 60, "both launchers and both ranks ending")
        logged = live.logged()
        assert [e["code_version"] for e in logged if e["event"] == "reload"] == [1], "one reload, applied once"
        assert logged[-1]["event"] == "exit" and logged[-1]["code"] == 0, logged[-1]
    finally:
        for pid in alive_with(endpoint):
            subprocess.run(["kill", "-9", pid], check=False)
        for node in nodes:
            node.close()


def test_only_the_first_rank_of_a_node_without_rank_0_has_a_note(tmp_path: Path):
    assert ranks_only_note(RankInfo(rank=0, local_rank=0, world_size=16, local_world_size=8), tmp_path) is None
    assert ranks_only_note(RankInfo(rank=3, local_rank=3, world_size=16, local_world_size=8), tmp_path) is None
    assert ranks_only_note(RankInfo(rank=9, local_rank=1, world_size=16, local_world_size=8), tmp_path) is None
    note = ranks_only_note(RankInfo(rank=8, local_rank=0, world_size=16, local_world_size=8), tmp_path, master="gpu-a")
    assert note is not None and note.startswith(NO_SESSION_HERE)
    assert "ranks 8-15 (of 16) train here" in note and "rank 0's node (gpu-a)" in note and str(tmp_path) in note
    assert "attach there" in note
    headless = ranks_only_note(RankInfo(rank=8, local_rank=0, world_size=16, local_world_size=8), tmp_path, master="gpu-a",
                               detached=False)
    assert headless is not None and "attach" not in headless and "out of the launcher on rank 0's node (gpu-a)" in headless
