"""A chapter's history (medddpm/report/history.py): rows appended once, atomically, and read per GPU, oldest first;
the committed store's histories are complete."""
import json
from pathlib import Path

import pytest

from medddpm.report import history

STORE = Path(__file__).resolve().parents[1] / "data" / "results"


def test_rows_are_appended_and_read_per_gpu_oldest_first(tmp_path):
    a, b = tmp_path / "gpu-a" / "ch" / history.FILE, tmp_path / "gpu-b" / "ch" / history.FILE
    a.parent.mkdir(parents=True)
    b.parent.mkdir(parents=True)
    history.append(a, {"date": "2026-01-02", "change": "second", "measured": "2 → 1 s", "run": "ch/x-2026-01-02"}, "r@1")
    history.append(a, {"date": "2026-01-01", "change": "first", "measured": "3 → 2 s", "run": "ch/y-2026-01-01"}, "r@1")
    history.append(b, {"date": "2026-01-01", "change": "elsewhere", "measured": "4 s", "run": "ch/z-2026-01-01"}, "r@2")
    t = history.table(tmp_path, ["gpu-a", "gpu-b"], "ch")
    assert list(t.columns) == history.COLUMNS
    assert list(t["change"]) == ["first", "elsewhere", "second"] and list(t["GPU"]) == ["gpu-a", "gpu-b", "gpu-a"]
    assert json.loads(a.read_text())["rows"][0]["frozen_by"] == "r@1" and not list(a.parent.glob("*.tmp"))
    assert history.table(tmp_path, ["gpu-c"], "ch").empty and list(history.table(tmp_path, [], "ch").columns) == history.COLUMNS
    with pytest.raises(ValueError, match="needs date, change, measured, run"):
        history.append(a, {"date": "d", "change": "c"}, "r")
    a.write_text(json.dumps({"rows": [{"date": "d"}]}))
    with pytest.raises(ValueError, match="lack one of"):
        history.table(tmp_path, ["gpu-a"], "ch")


def test_every_committed_history_names_runs_the_store_holds():
    files = sorted([*STORE.glob(f"*/{history.FILE}"), *STORE.glob(f"*/*/{history.FILE}")])
    assert files
    for f in files:
        gpu = f.parent if f.parent.parent == STORE else f.parents[1]  # a machine's history, or a chapter folder's
        for row in history.rows(f):
            assert row["measured"] and not row["measured"].startswith("—") and row["frozen_by"]
            for run in row["run"].split(", "):
                assert (gpu / run).exists(), (f, run)
