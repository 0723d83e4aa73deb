"""Issue 76: run manifests (``run.json``): every dated run folder of the store has one, the code names no dated
folder, and ``fill`` writes them from provenance."""
import json
import re
from pathlib import Path

import pytest

from medddpm.report import manifests

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "data" / "results"


def test_every_dated_run_folder_of_the_store_has_a_complete_manifest():
    dated = [p for p in STORE.glob("*/**/*") if p.is_dir() and manifests.DATED.match(p.name)]
    assert dated and all((p / manifests.MANIFEST).exists() for p in dated), [
        str(p) for p in dated if not (p / manifests.MANIFEST).exists()]
    found = list(manifests.every(STORE))
    assert all(set(manifests.REQUIRED) <= set(m) and m["kind"] == manifests.kind_of(m.get("name", p.name.rsplit("-", 3)[0]))
               for _, p, m in found)
    names = {p.name for _, p, _ in found}
    assert all(m["supersedes"] in names for _, _, m in found if m.get("supersedes"))


def test_no_dated_run_folder_is_named_in_the_package_or_the_chapters():
    """The report layer finds runs by kind and content name through the manifests; dates live in the store."""
    date = re.compile(r"20\d\d-\d\d-\d\d")
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in [*ROOT.glob("medddpm/**/*.py"), *ROOT.glob("notebooks/*.py")]
            for i, line in enumerate(p.read_text().splitlines(), 1) if date.search(line)]
    assert not hits, hits


def test_fill_writes_manifests_from_provenance_and_chains_the_current_rows(tmp_path):
    tr = tmp_path / "g" / "time_to_result"
    for name in ("after-cut-2026-01-01", "default-rows-2026-01-02", "fused-residual-2026-01-02"):
        (tr / name).mkdir(parents=True)
        (tr / name / "time_to_result.csv").write_text("x\n")
    (tr / "provenance.json").write_text(json.dumps({"default-rows-2026-01-02": {
        "measured": "a fresh H200", "code": "abc123", "gpu": "NVIDIA H200", "device_reply": {"rc": 0}}}))
    written = manifests.fill(tmp_path)
    assert sorted(p.name for p in written) == ["after-cut-2026-01-01", "default-rows-2026-01-02",
                                               "fused-residual-2026-01-02"]
    m = manifests.read(tr / "default-rows-2026-01-02")
    assert (m["kind"], m["machine"], m["commits"], m["supersedes"], m["device_reply"]) == (
        "sample-rows", "a fresh H200", "abc123", "after-cut-2026-01-01", {"rc": 0})
    assert [p.name for _, p, _ in manifests.runs(tmp_path, "sample-rows")] == ["default-rows-2026-01-02"]
    assert manifests.fill(tmp_path) == []  # nothing left to write
    (tr / "mystery-2026-01-03").mkdir()
    with pytest.raises(ValueError, match="no kind for run 'mystery'"):
        manifests.fill(tmp_path)


def test_an_arms_global_batch_is_read_from_its_flags_with_trains_defaults():
    from medddpm.core.config import TrainConfig
    from medddpm.report.manifests import global_batch

    assert global_batch({"flags": "--size 128 --nproc 4 --grad-accum 1"}) == 4
    assert global_batch({"flags": "--nproc 1 --grad-accum 4 --batch 2"}) == 8
    assert global_batch({"flags": "--steps 10"}) == TrainConfig().grad_accum  # one process, train's --grad-accum
