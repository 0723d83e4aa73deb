"""The samplers' quality gate (medddpm/sample/gate.py) and the few-step CLI surface."""
import itertools

import nibabel as nib
import numpy as np
import pandas as pd
import pytest

from medddpm.cli import main
from medddpm.data.nifti import Pair
from medddpm.core.errors import InputError
from medddpm.sample.gate import REFERENCE, RUN_COLUMNS, GateRun, gate_tables, passing, verdicts


def test_run_names_parse_and_round_trip():
    r = GateRun.parse("dpm2m-sde10-logsnr", "fast-x", 3)
    assert (r.sampler, r.steps, r.spacing, r.config, r.seed) == ("dpm2m-sde", 10, "logsnr", "fast-x", 3)
    assert r.name == "dpm2m-sde10-logsnr-s3-fast-x" and r.spec == "dpm2m-sde10-logsnr"
    assert GateRun.parse("dpm2m10-logsnr-full", "c").spacing == "logsnr-full"
    assert GateRun.parse("ddpm250", "baseline").key() == REFERENCE
    for bad, needle in (("euler10-logsnr", "is not a run"), ("dpm2m10", "names its spacing"),
                        ("ddim50-time", "names its spacing"), ("dpm2m0-time", "is not a run")):
        with pytest.raises(InputError, match=needle):
            GateRun.parse(bad, "c")


def _tables(candidate, ref=((0.95, -0.5, 0.10), (0.97, -0.3, 0.14), (0.96, -0.4, 0.12)), ref_ssim=(0.5, 0.6, 0.55),
            cand_ssim=(0.5, 0.5, 0.5)):
    """Sample and diversity tables of one subject: the reference's seeds and a candidate's."""
    rows, div = [], []
    for key, values, ssims in ((REFERENCE, ref, ref_ssim), (("dpm2m-sde", 12, "logsnr", "fast"), candidate, cand_ssim)):
        for seed, (r, bg, w1) in enumerate(values):
            rows.append({**dict(zip(RUN_COLUMNS, key)), "seed": seed, "subject": "s1", "brain_corr": r,
                         "background_mean": bg, "hist_w1": w1})
        for (a, b), s in zip(itertools.combinations(range(len(values)), 2), ssims):
            div.append({**dict(zip(RUN_COLUMNS, key)), "subject": "s1", "seed_a": a, "seed_b": b, "ssim_between_seeds": s})
    return pd.DataFrame(rows), pd.DataFrame(div)


def _verdict(*args, **kw):
    v = verdicts(*_tables(*args, **kw))
    return v.loc[v["sampler"] == "dpm2m-sde", "verdict"].iloc[0], v


def test_a_candidate_inside_the_band_passes_and_the_reference_is_named():
    verdict, v = _verdict(((0.96, -0.4, 0.11), (0.955, -0.45, 0.12), (0.97, -0.35, 0.13)))
    assert verdict == "pass"
    assert v.loc[v["sampler"] == "ddpm", "verdict"].iloc[0] == "reference"
    row = v[v["sampler"] == "dpm2m-sde"].iloc[0]
    assert row["corr_low"] == 0.95 and row["w1_high"] == 0.14 and (row["background_low"], row["background_high"]) == (-0.5, -0.3)


@pytest.mark.parametrize("candidate,ssim,failed", [
    (((0.90, -0.4, 0.11),) * 3, (0.5,) * 3, "corr"),  # correlation below the reference's lowest seed
    (((0.96, -0.1, 0.11),) * 3, (0.5,) * 3, "background"),  # a lighter background than any reference seed
    (((0.96, -0.6, 0.11),) * 3, (0.5,) * 3, "background"),  # and a darker one
    (((0.96, -0.4, 0.20),) * 3, (0.5,) * 3, "w1"),  # a histogram further from the real image's
    (((0.96, -0.4, 0.11),) * 3, (0.9,) * 3, "diversity"),  # seeds collapsed onto one sample
])
def test_each_criterion_fails_on_its_own(candidate, ssim, failed):
    verdict, _ = _verdict(candidate, cand_ssim=ssim)
    assert verdict == f"fail: {failed}"


def test_the_mean_over_seeds_is_judged_not_each_seed():
    """One seed below the band's lowest correlation, the mean inside: pass."""
    verdict, _ = _verdict(((0.94, -0.4, 0.11), (0.97, -0.4, 0.11), (0.97, -0.4, 0.11)))
    assert verdict == "pass"


def test_passing_lists_passing_runs_first_and_the_band_needs_seeds():
    _, v = _verdict(((0.90, -0.4, 0.11),) * 3)
    assert list(passing(v)["verdict"]) == ["fail: corr", "reference"]
    samples, div = _tables(((0.96, -0.4, 0.11),) * 3, ref=((0.95, -0.5, 0.1),), ref_ssim=())
    with pytest.raises(InputError, match="at least 2 seeds"):
        verdicts(samples, div)
    with pytest.raises(InputError, match="no samples of the reference"):
        verdicts(*_tables(((0.96, -0.4, 0.11),) * 3, ref=(), ref_ssim=()))


def test_gate_tables_read_samples_as_sample_writes_them(tmp_path):
    """Metrics of samples written as NIfTI: a sample equal to the real image has r = 1 and W1 = 0;
    two identical seeds have SSIM 1; a missing file is one clear error."""
    rng = np.random.default_rng(0)
    real = rng.uniform(-1, 1, (8, 8, 8)).astype(np.float32)
    labels = np.zeros((8, 8, 8), np.int64)
    labels[2:6, 2:6, 2:6] = 1
    mask = tmp_path / "m1.nii.gz"
    nib.save(nib.Nifti1Image(labels.astype(np.uint8), np.eye(4)), str(mask))
    pair = Pair("s1", tmp_path / "img.nii.gz", mask)
    folders = {}
    for seed in (0, 1):
        run = GateRun("ddpm", 250, "", "baseline", seed)
        folders[run] = tmp_path / run.name
        folders[run].mkdir()
        nib.save(nib.Nifti1Image(real, np.eye(4)), str(folders[run] / "m1.nii.gz"))
    samples, div = gate_tables(folders, [pair], {"s1": labels}, {"s1": real})
    assert len(samples) == 2 and np.allclose(samples["brain_corr"], 1) and np.allclose(samples["hist_w1"], 0)
    assert np.allclose(samples["background_mean"], real[labels == 0].mean(), atol=1e-6)
    assert len(div) == 1 and div["ssim_between_seeds"].iloc[0] == pytest.approx(1.0)
    (folders[GateRun("ddpm", 250, "", "baseline", 1)] / "m1.nii.gz").unlink()
    with pytest.raises(InputError, match="no sample of s1"):
        gate_tables(folders, [pair], {"s1": labels}, {"s1": real})


def test_sample_with_a_few_step_solver_and_bad_solver_options(capsys, phantoms, tiny_checkpoint, tmp_path):
    """`medddpm sample` runs a few-step solver (its steps and spacing), and refuses bad options with
    one line and exit 2, writing nothing."""
    base = ["sample", "--checkpoint", str(tiny_checkpoint), "--masks", str(phantoms / "masks"), "--quiet",
            "--device", "cpu"]
    for extra, needle in ((["--steps", "0"], "--steps must be >= 1"),
                          (["--steps", "251"], "[1, 250]"),
                          (["--sampler", "ddpm", "--steps", "10"], "runs all 250 steps"),
                          (["--sampler", "ddim", "--spacing", "logsnr"], "takes no --spacing"),
                          (["--sampler", "euler"], "invalid choice"),
                          (["--spacing", "cosine"], "invalid choice")):
        code = main([*base, "--out", str(tmp_path / "bad"), *extra])
        err = capsys.readouterr().err
        assert code == 2 and needle in err, err
        assert not (tmp_path / "bad").exists()
    assert main([*base, "--out", str(tmp_path / "ok"), "--sampler", "dpm2m-sde", "--steps", "3"]) == 0
    assert sorted(p.name for p in (tmp_path / "ok").iterdir()) == sorted(p.name for p in (phantoms / "masks").iterdir())


def test_sampling_aliases_and_the_chain_knob():
    from medddpm.core.config import SAMPLING_ALIASES, Knobs, run_config, sampling_config
    from medddpm.run.engine import effective_knobs
    import torch

    fast = sampling_config("fast")
    assert fast.name == SAMPLING_ALIASES["fast"] and fast.chain_graph and fast.cuda_graphs
    assert sampling_config("fast-fp8").fp8_convs == "skip" and sampling_config("opt1") == run_config("opt1")
    with pytest.raises(ValueError, match="sampling only"):
        run_config(fast.name, training=True)
    with pytest.raises(ValueError, match="chain_graph .* needs cuda_graphs"):
        Knobs(chain_graph=True)
    assert not effective_knobs(fast, torch.device("cpu")).chain_graph


def test_bench_sample_times_a_solver_with_its_spacing(capsys, tmp_path):
    import json

    out = tmp_path / "sb.csv"
    code = main(["bench-sample", "--model", "tiny", "--size", "16", "--config", "baseline", "--sampler", "ipndm",
                 "--steps", "3", "--spacing", "quadratic", "--repeats", "1", "--device", "cpu", "--out", str(out), "--json"])
    row = json.loads(capsys.readouterr().out)[0]
    assert code == 0 and (row["sampler"], row["steps"], row["spacing"]) == ("ipndm", 3, "quadratic")
    assert pd.read_csv(out)["spacing"].tolist() == ["quadratic"]


def test_the_intro_quotes_the_default_sampler_and_the_chain_that_chapter_16_judged(tmp_path):
    """headline.headline's sampling rows: seconds per volume of `sample`'s default (DDPM 250) and of the 12-call chain
    from the real-brain gate's bench (equivalence/bench.csv), per GPU; none where a GPU has no bench."""
    from medddpm.diffusion.solvers import CANDIDATE
    from medddpm.report import headline

    (tmp_path / "x" / "equivalence").mkdir(parents=True)
    (tmp_path / "x" / "info.json").write_text('{"gpu": "X"}')
    pd.DataFrame({"sampler": ["ddpm", CANDIDATE.sampler], "steps": [250, CANDIDATE.steps],
                  "s_per_volume_median": [4.5, 0.2], "gpu": "X"}).to_csv(tmp_path / "x" / "equivalence" / "bench.csv",
                                                                           index=False)
    h = headline.headline(tmp_path, ["x"])
    rows = h[h["result"].str.startswith("sampling one volume")]
    assert list(rows["ours"]) == [4.5, 0.2] and "default, DDPM 250" in rows["result"].iloc[0]
    assert "not confirmed" in rows["result"].iloc[1]
    assert not headline.headline(tmp_path, []).shape[0]