"""A sessions folder shared by several machines (a home directory on NFS, no XDG_RUNTIME_DIR): another host's
session is listed for what it is, and never judged dead from here, which would delete a live session's files."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.session_process_harness import cli
from workbench.protocol import registry


@pytest.fixture
def shared_folder():
    base = Path(tempfile.mkdtemp(prefix="vb", dir="/tmp"))  # short: a socket's path must fit in 107 bytes
    os.chmod(base, 0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(base)}
    folder = base / "vram-bench"
    folder.mkdir(mode=0o700)
    try:
        yield folder, env
    finally:
        shutil.rmtree(base, ignore_errors=True)


def write_entry(folder: Path, name: str, **facts: object) -> Path:
    (folder / f"{name}.sock").write_text("")  # what another host's socket is from here: a name nothing answers on
    data = {"name": name, "pid": 2**22 + 17, "project": f"/shared/{name}", "entry": f"/shared/{name}/train.py",
            "device": "cuda:0", "started": 0.0, "log": str(folder / f"{name}.log"), **facts}
    (folder / f"{name}.json").write_text(json.dumps(data))
    return folder / f"{name}.sock"


def test_another_hosts_session_is_listed_kept_and_its_name_stays_taken(shared_folder):
    folder, env = shared_folder
    foreign = write_entry(folder, "gpt", host="gpu-b-not-this-host")
    local_dead = write_entry(folder, "old", host=registry.this_host())  # a session of this host that was killed
    listed = cli(["ls"], env)
    assert listed.returncode == 0, listed.stderr
    assert "on other machines sharing this sessions folder" in listed.stdout, listed.stdout
    assert "gpt  on gpu-b-not-this-host" in listed.stdout, listed.stdout
    assert foreign.exists() and foreign.with_suffix(".json").exists(), "another host's live session was deleted"
    assert not local_dead.exists(), "this host's dead session is still cleaned up"
    assert "session old is gone" in listed.stderr, listed.stderr
    assert registry.choose_name(Path("/elsewhere/gpt"), folder) == "gpt-2"  # its files stay its own
    assert [e.name for e in registry.entries(folder)] == [] and [e.name for e in registry.elsewhere(folder)] == ["gpt"]


def test_facts_written_before_they_named_a_host_are_this_hosts():
    facts = {"name": "a", "pid": 1, "project": "/p", "entry": "/p/train.py", "device": "cpu", "started": 0.0, "log": "/l"}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "a.json"
        path.write_text(json.dumps(facts))
        read = registry.read_facts(path)
        assert read is not None and read.host == ""
        path.write_text(json.dumps({k: v for k, v in facts.items() if k != "pid"}))
        assert registry.read_facts(path) is None  # a required fact missing: not a session's facts
