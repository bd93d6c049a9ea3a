"""`vram-bench load-bench`: every loading method runs in its own process, loads the right weights,
and the memory figures show what the methods are for (mmap + assign holds no private copy).

The runs use the hidden `tiny` size (2 layers, 384 wide, GPT-2's vocabulary: 89 MiB of fp32
weights), large enough that "two copies" vs "none" cannot be noise. Most of the time is the
children importing torch (about 2.5 s each).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch

from workbench.tools import loadbench
from workbench.tools.loadbench import CONFIGS, HIDDEN_CONFIGS, METHODS, checkpoint_paths, format_table, main, reusable_checkpoint

TINY = HIDDEN_CONFIGS["tiny"]
ALL = [m.key for m in METHODS]


def run_main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """One full run (write the checkpoint, then all five methods), shared by the tests that read its results."""
    directory = tmp_path_factory.mktemp("loadbench")
    code, out, err = run_main(["--size", "tiny", "--device", "cpu", "--dir", str(directory), "--json"])
    return SimpleNamespace(code=code, out=out, err=err, report=json.loads(out), dir=directory)


def by_method(report: dict) -> dict[str, dict]:
    return {r["method"]: r for r in report["methods"]}


def test_every_method_runs_in_its_own_process_and_loads_the_saved_weights(tiny_run):
    assert tiny_run.code == 0, tiny_run.err
    report = tiny_run.report
    assert [r["method"] for r in report["methods"]] == ALL
    for r in report["methods"]:
        assert r["ok"], r
        assert r["tensors_checked"] == TINY.tensors() and r["mismatches"] == []
        assert r["load_s"] > 0 and r["ready_s"] >= r["load_s"]
        assert r["peak_device_bytes"] is None
        assert r["samples"] >= 2
    assert report["parameters"] == TINY.parameters()
    assert report["checkpoint_bytes"] >= TINY.model_bytes()
    assert report["per_tensor_files"] == TINY.tensors()
    assert report["machine"]["torch"] == torch.__version__


def test_mmap_assign_holds_no_private_copy_while_naive_holds_two(tiny_run):
    m = by_method(tiny_run.report)
    ckpt = tiny_run.report["checkpoint_bytes"]
    # naive: the random-init model and the loaded state dict, both anonymous
    assert m["naive"]["anon_x_checkpoint"] >= 1.8
    assert m["to_empty"]["anon_x_checkpoint"] >= 1.8  # skips the init, not the second copy
    # sequential: one private copy (the model) plus the mmap'd file
    assert 0.8 <= m["sequential"]["anon_x_checkpoint"] <= 1.5
    assert m["sequential"]["peak_file_bytes"] >= 0.8 * ckpt
    # mmap + assign and one file per tensor: the weights are the file's pages, file-backed
    for key in ("mmap_assign", "per_tensor"):
        assert m[key]["anon_x_checkpoint"] < 0.4, m[key]
        assert m[key]["peak_file_bytes"] >= 0.8 * ckpt, m[key]
        assert m[key]["peak_anon_bytes"] * 4 < m["naive"]["peak_anon_bytes"]
        assert m[key]["meta_warmup_s"] is not None  # the one-time meta cost is measured, not hidden


def test_json_keeps_stdout_clean_and_progress_goes_to_stderr(tiny_run):
    json.loads(tiny_run.out)  # the whole of stdout is one JSON document
    assert "[5/5] one file per tensor" in tiny_run.err
    assert "writing the tiny checkpoint" in tiny_run.err


def test_the_table_has_a_row_per_method_and_the_context(tiny_run):
    table = format_table(tiny_run.report)
    for header in ("load s", "peak anon", "peak file", "peak RSS", "peak device", "anon x ckpt"):
        assert header in table
    for m in METHODS:
        assert any(line.startswith(m.label) for line in table.splitlines()), m.label
    assert "n/a" in table and "GPT-2 tiny" in table and "checkpoint" in table and "torch" in table


def test_methods_runs_only_the_subset_and_reuses_the_checkpoint_in_dir(tiny_run):
    code, out, err = run_main(["--size", "tiny", "--device", "cpu", "--dir", str(tiny_run.dir),
                               "--methods", "per_tensor", "--json"])
    assert code == 0, err
    report = json.loads(out)
    assert [r["method"] for r in report["methods"]] == ["per_tensor"]
    assert report["methods"][0]["ok"]
    assert report["checkpoint_written_s"] is None  # reused, not written again
    assert "writing" not in err and "[1/1]" in err


def test_a_checkpoint_without_its_per_tensor_files_is_not_reused(tiny_run, tmp_path):
    single, _, manifest = checkpoint_paths(tiny_run.dir, TINY)
    for path in (single, manifest):
        shutil.copy(path, tmp_path / path.name)
    assert reusable_checkpoint(tmp_path, TINY, need_per_tensor=False) is not None
    assert reusable_checkpoint(tmp_path, TINY, need_per_tensor=True) is None
    (tmp_path / single.name).write_bytes(b"truncated")
    assert reusable_checkpoint(tmp_path, TINY, need_per_tensor=False) is None


def test_too_little_disk_is_one_line_and_exit_2_before_anything_runs(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(total=10 * 2**30, used=10 * 2**30 - 2**20, free=2**20))
    code = main(["--size", "124M", "--dir", str(tmp_path / "ckpt")])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "not enough free disk space" in lines[0] and "--dir" in lines[0]
    assert not (tmp_path / "ckpt").exists()


def test_too_little_ram_names_the_lighter_methods(monkeypatch, capsys):
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=2**30, total=2**30))
    code = main(["--size", "1558M"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "not enough RAM" in err[0] and "--methods mmap_assign,per_tensor" in err[0]


def test_usage_errors_and_help(capsys):
    assert main(["--methods", "naive,bogus"]) == 2
    assert "bogus" in capsys.readouterr().err
    assert main(["--size", "7B"]) == 2
    assert "124M" in capsys.readouterr().err
    assert main(["--help"]) == 0
    help_text = capsys.readouterr().out
    assert "examples:" in help_text and "--methods" in help_text and "mmap_assign" in help_text
    assert "tiny" not in help_text  # the test size stays out of the help


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_device_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    code, out, err = run_main(["--size", "tiny", "--device", "cuda", "--dir", str(tmp_path)])
    assert code == 2 and out == ""
    assert "CUDA is not available" in err.strip().splitlines()[-1]
    assert not checkpoint_paths(tmp_path, TINY)[0].exists()  # failed before writing


def test_configs_match_the_torch_model():
    from workbench.tools.loadbench_worker import GPT2

    assert CONFIGS["124M"].parameters() == 124_439_808
    for cfg in [*CONFIGS.values(), TINY]:
        with torch.device("meta"):
            model = GPT2(cfg)
        params = list(model.parameters())
        assert sum(p.numel() for p in params) == cfg.parameters(), cfg.name
        assert len(params) == cfg.tensors()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_device_peaks_are_reported(tmp_path):
    code, out, err = run_main(["--size", "tiny", "--device", "cuda", "--dir", str(tmp_path),
                               "--methods", "naive,mmap_assign,per_tensor", "--json"])
    assert code == 0, err
    report = json.loads(out)
    assert report["device"].startswith("cuda")
    for r in report["methods"]:
        assert r["ok"], r
        assert r["peak_device_bytes"] >= 0.9 * report["checkpoint_bytes"]
    m = by_method(report)
    assert m["per_tensor"]["peak_anon_bytes"] < 0.4 * report["checkpoint_bytes"]
    assert loadbench.format_table(report)


def test_a_model_that_kept_its_fresh_init_fails_the_check(tiny_run):
    """What makes "ok" mean something: every tensor of the checkpoint differs from a fresh init, biases included."""
    from workbench.tools.loadbench_worker import GPT2, SEED, check_model

    manifest = json.loads(checkpoint_paths(tiny_run.dir, TINY)[2].read_text())
    torch.manual_seed(SEED + 1)
    checked, problems = check_model(GPT2(TINY), manifest["tensors"], torch.device("cpu"))
    assert checked == TINY.tensors()
    assert len(problems) == TINY.tensors()


def test_repeated_runs_give_median_times_and_highest_peaks():
    from workbench.tools.loadbench import METHOD_BY_KEY, combine_runs

    def run(load_s: float, anon: int) -> dict:
        return {"ok": True, "load_s": load_s, "ready_s": load_s + 1, "peak_anon_bytes": anon, "peak_file_bytes": 0,
                "peak_rss_bytes": anon, "peak_device_bytes": None}

    row = combine_runs(METHOD_BY_KEY["naive"], [run(3.0, 10), run(1.0, 30), run(2.0, 20)], checkpoint_bytes=10)
    assert (row["load_s"], row["ready_s"], row["peak_anon_bytes"], row["anon_x_checkpoint"]) == (2.0, 3.0, 30, 3.0)
    assert row["repeat"] == 3 and len(row["runs"]) == 3
    failed = combine_runs(METHOD_BY_KEY["naive"], [run(1.0, 10), {"ok": False, "error": "boom"}], checkpoint_bytes=10)
    assert not failed["ok"] and failed["error"] == "boom"
