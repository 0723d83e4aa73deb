"""``make gpu-book`` (medddpm/report/gpu_book.py): the plan, bad input, and the ncu skip."""
from __future__ import annotations

import pandas as pd
import pytest

from medddpm.report import gpu_book, measure


def test_dry_run_prints_the_plan_with_expected_minutes(capsys):
    assert gpu_book.main(["--dry-run", "--stages", "ladder,sampling", "--ladder-configs", "opt1,fast"]) == 0
    out = capsys.readouterr().out
    assert "2 stage(s)" in out and "ladder" in out and "06_beyond" in out and "opt1,fast" in out
    # an eager rung at the eager estimate, a compiled one at the compiled estimate
    st = gpu_book.STAGES["ladder"]
    assert gpu_book.expected_minutes("ladder", "opt1,fast") == pytest.approx(st.minutes_per_config + st.compiled_minutes)
    assert gpu_book.expected_minutes("sampling", "fast,opt1") == pytest.approx(2 * gpu_book.STAGES["sampling"].minutes_per_config)


def test_the_default_plan_fits_the_goal():
    total = sum(gpu_book.expected_minutes(s, st.configs) for s, st in gpu_book.STAGES.items())
    assert 0 < total <= 30


@pytest.mark.parametrize("argv, message", [
    (["--stages", "ladder,foo"], "unknown stage(s) ['foo']"),
    (["--stages", ","], "unknown stage(s)"),
    (["--ladder-configs", "opt1,nope"], "unknown configuration 'nope'"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    assert gpu_book.main([*argv, "--dry-run", "--results", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "store").exists()


def test_without_a_gpu_nothing_is_written(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert gpu_book.main(["--no-render", "--stages", "ladder", "--results", str(tmp_path / "store")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "store").exists()


def test_ncu_missing_skips_with_one_line_and_the_other_stages_run(capsys, tmp_path, monkeypatch):
    folder = tmp_path / "store" / "some-gpu"
    ran = []
    monkeypatch.setattr(measure, "local_gpu_folder", lambda root: folder)
    monkeypatch.setitem(measure.STAGES, "ladder", lambda results, size, configs: ran.append((size, configs)))
    monkeypatch.setenv("NCU", str(tmp_path / "no-such-ncu"))
    assert gpu_book.main(["--no-render", "--stages", "ncu,ladder", "--ladder-configs", "opt1", "--size", "32",
                          "--results", str(tmp_path / "store")]) == 0
    out = capsys.readouterr().out
    skipped = [ln for ln in out.splitlines() if "ncu: skipped —" in ln]
    assert len(skipped) == 1 and "ncu (Nsight Compute CLI) was not found" in skipped[0]
    assert "Traceback" not in out
    assert ran == [(32, "opt1")]
    rows = pd.read_csv(folder / gpu_book.TIMINGS)
    assert list(rows.columns) == gpu_book.COLUMNS
    assert rows.set_index("stage")["status"].to_dict() == {"ncu": "skipped", "ladder": "done"}
    assert "ncu: skipped" in (folder / gpu_book.LOG).read_text()


def test_a_failing_stage_is_recorded_and_the_exit_code_is_1(capsys, tmp_path, monkeypatch):
    folder = tmp_path / "store" / "some-gpu"
    monkeypatch.setattr(measure, "local_gpu_folder", lambda root: folder)

    def boom(results, size, configs):
        raise RuntimeError("CUDA out of memory\nTried to allocate 2 GiB")

    monkeypatch.setitem(measure.STAGES, "end_to_end", boom)
    monkeypatch.setitem(measure.STAGES, "sampling", lambda results, size, configs: None)
    assert gpu_book.main(["--no-render", "--stages", "end_to_end,sampling", "--end-to-end-configs", "opt1",
                          "--sampling-configs", "bf16-graphs", "--results", str(tmp_path / "store")]) == 1
    out = capsys.readouterr().out
    assert "end_to_end: failed — Tried to allocate 2 GiB" in out
    rows = pd.read_csv(folder / gpu_book.TIMINGS)
    assert rows["status"].tolist() == ["failed", "done"]
