"""scripts/equivalence.py: the equivalence gate's samples spread over workers, then measured."""
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]


def test_the_script_samples_every_run_and_seed_then_measures_them(ixi16, ixi_checkpoint, tmp_path):
    def call(runs: str, *extra: str) -> None:
        res = subprocess.run([sys.executable, "scripts/equivalence.py", "--data", str(ixi16), "--checkpoint",
                              str(ixi_checkpoint), "--out", str(tmp_path / "out"), "--name", "v-tiny", "--workers", "1",
                              "--runs", runs, "--gpus", "2", "--work", str(tmp_path / "w"), "--batch", "4", *extra],
                             cwd=REPO, capture_output=True, text=True,
                             env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""})
        assert res.returncode == 0, res.stderr

    # a first call samples part and measures nothing; the second samples the rest and measures all
    call("ddim2:baseline@0-1", "--sample-only")
    assert not (tmp_path / "out").exists() and len(list((tmp_path / "w").glob("ddim2-*"))) == 2
    call("ddim2:baseline@0-1;dpm1-sde2-logsnr-eta1.2:baseline@2,3")
    out = tmp_path / "out" / "equivalence"
    samples, diversity, runs = (pd.read_csv(out / f"{t}.csv") for t in ("samples", "diversity", "runs"))
    assert set(samples["run"]) == {"real", "template", "ddim2:baseline", "dpm1-sde2-logsnr-eta1.2:baseline"}
    assert sorted(samples.loc[samples["run"] == "dpm1-sde2-logsnr-eta1.2:baseline", "seed"]) == [2, 3]
    assert len(samples[samples["run"] == "template"]) == 1  # one validation subject, its baselines once
    # adjacent seeds only: (0, 1) and (2, 3)
    assert sorted(zip(diversity["seed_a"], diversity["seed_b"])) == [(0, 1), (2, 3)]
    assert runs["finished"].all() and len(runs) == 4 and sorted(runs["gpu"].unique()) == [0, 1]
    assert runs["seconds"].notna().all()  # the first call's units keep the seconds it recorded
    assert (samples["prediction"] == "v").all() and (samples["name"] == "v-tiny").all()


def test_a_run_that_is_not_spec_config_seeds_is_one_line_error(tmp_path):
    res = subprocess.run([sys.executable, "scripts/equivalence.py", "--data", str(tmp_path), "--checkpoint", "x",
                          "--out", str(tmp_path / "o"), "--name", "n", "--runs", "ddpm250:fast"],
                         cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "SPEC:CONFIG@SEEDS" in res.stderr
    assert not (tmp_path / "o").exists()
