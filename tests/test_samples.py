"""Where `vram-bench` with no arguments finds its sample: the checkout, or a user copy of the packaged one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from workbench.cli import samples

REPO_SAMPLE = Path(__file__).resolve().parent.parent / "sample_projects" / "tiny_gpt"


def test_a_checkout_uses_the_sample_in_place():
    entry, note = samples.sample_entry()
    assert entry == REPO_SAMPLE / "train.py" and note is None


def test_an_installed_wheel_copies_the_sample_once_to_the_user_data_folder(tmp_path, monkeypatch):
    packaged = tmp_path / "site" / "_samples"
    shutil.copytree(REPO_SAMPLE, packaged / "tiny_gpt", ignore=shutil.ignore_patterns(".vram-bench", "__pycache__"))
    monkeypatch.setattr(samples, "_checkout_samples", lambda: tmp_path / "no-checkout")
    monkeypatch.setattr(samples, "_packaged_samples", lambda: packaged)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    entry, note = samples.sample_entry()
    assert entry == tmp_path / "data" / "vram-bench" / "samples" / "tiny_gpt" / "train.py" and entry.is_file()
    assert note is not None and "edit it there" in note
    entry.write_text(entry.read_text() + "\n# my edit\n")
    again, second_note = samples.sample_entry()
    assert again == entry and second_note is None and "# my edit" in again.read_text(), "the user's edits are kept"


def test_a_missing_sample_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(samples, "_checkout_samples", lambda: tmp_path / "a")
    monkeypatch.setattr(samples, "_packaged_samples", lambda: tmp_path / "b")
    with pytest.raises(FileNotFoundError, match="missing from this installation"):
        samples.sample_entry()


def test_every_sample_is_listed_and_every_file_ships_in_the_wheel():
    from workbench.config import tomllib

    repo = REPO_SAMPLE.parent.parent
    folders = sorted(p.name for p in (repo / "sample_projects").iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    assert folders == sorted(samples.SAMPLES), "samples.SAMPLES lists every folder in sample_projects/"
    included = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    for folder in folders:
        for path in (repo / "sample_projects" / folder).rglob("*"):
            relative = path.relative_to(repo).as_posix()
            if path.is_dir() or "__pycache__" in relative or "/.vram-bench" in relative:
                continue
            shipped = any(relative == source or relative.startswith(source + "/") for source in included)
            assert shipped, f"{relative} is not in pyproject's force-include: a wheel would lack it"
    assert included["themes"] == "workbench/_themes"


def test_another_sample_is_copied_from_the_wheel_on_first_use(tmp_path, monkeypatch):
    packaged = tmp_path / "site" / "_samples"
    shutil.copytree(REPO_SAMPLE.parent / "leaky_loop", packaged / "leaky_loop", ignore=shutil.ignore_patterns(".vram-bench", "__pycache__"))
    monkeypatch.setattr(samples, "_checkout_samples", lambda: tmp_path / "no-checkout")
    monkeypatch.setattr(samples, "_packaged_samples", lambda: packaged)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    entry, note = samples.sample_entry("leaky_loop")
    assert entry == tmp_path / "data" / "vram-bench" / "samples" / "leaky_loop" / "train.py" and entry.is_file() and note


def test_an_unknown_sample_name_is_refused_with_the_choices(capsys):
    from workbench.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--sample", "nope"])
    assert exit_info.value.code == 2 and "leaky_loop" in capsys.readouterr().err
