"""scripts/rename_configs.py: configuration names renamed through a results store at once."""
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "rename_configs.py"


@pytest.fixture
def rc():
    spec = importlib.util.spec_from_file_location("rename_configs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _store(root: Path) -> Path:
    g = root / "gpu"
    (g / "fast").mkdir(parents=True)
    (g / "fast-all").mkdir()
    (g / "fast" / "a.txt").write_text("old fast")
    (g / "fast-all" / "a.txt").write_text("old fast-all")
    (g / "bench.csv").write_text("gpu,config,step_ms\nG,fast,60.051\nG,fast-all,49.60\nG,opt1,232.3\n")
    pd.DataFrame({"source": ["ddim50-eta1-fast", "fast-long", "real", "ddpm250-eta1-s2-fast-all"],
                  "value": [1.0, 2.0, 3.0, 4.0]}).to_parquet(g / "slices.parquet", index=False)
    (g / "env.json").write_text(json.dumps({"commands": {"roofline/fast": "x", "roofline/fast-all": "y"},
                                            "knobs": {"fast": {"name": "fast"}}, "note": "fast"}))
    (g / "timing-fast-a1.csv").write_text("t\n1\n")
    (g / "log.txt").write_text("--config fast\n")
    return g


def test_a_swap_renames_tables_json_folders_and_run_files_and_keeps_logs(rc, tmp_path):
    g = _store(tmp_path)
    assert rc.main([str(tmp_path), "fast=bf16-graphs", "fast-all=fast"]) == 0
    assert (g / "bench.csv").read_text() == "gpu,config,step_ms\nG,bf16-graphs,60.051\nG,fast,49.60\nG,opt1,232.3\n"
    assert list(pd.read_parquet(g / "slices.parquet")["source"]) == [
        "ddim50-eta1-bf16-graphs", "bf16-graphs-long", "real", "ddpm250-eta1-s2-fast"]
    env = json.loads((g / "env.json").read_text())
    assert env["commands"] == {"roofline/bf16-graphs": "x", "roofline/fast": "y"}
    assert env["knobs"] == {"bf16-graphs": {"name": "bf16-graphs"}} and env["note"] == "fast"  # free text stays
    assert (g / "bf16-graphs" / "a.txt").read_text() == "old fast" and (g / "fast" / "a.txt").read_text() == "old fast-all"
    assert (g / "timing-bf16-graphs-a1.csv").exists() and not (g / "timing-fast-a1.csv").exists()
    assert (g / "log.txt").read_text() == "--config fast\n"


def test_dry_run_and_bad_input_change_nothing(rc, tmp_path, capsys):
    g = _store(tmp_path)
    before = {p: p.read_bytes() for p in g.rglob("*") if p.is_file()}
    assert rc.main([str(tmp_path), "fast=bf16-graphs", "--dry-run"]) == 0
    assert "move" in capsys.readouterr().out
    assert rc.main([str(tmp_path), "fast=fast-all"]) == 2  # the folder fast-all exists and is not moved away
    assert "exist already" in capsys.readouterr().err
    assert rc.main([str(tmp_path / "nowhere"), "a=b"]) == 2
    with pytest.raises(SystemExit, match="not OLD=NEW"):
        rc.main([str(tmp_path), "fast"])
    assert {p: p.read_bytes() for p in g.rglob("*") if p.is_file()} == before
