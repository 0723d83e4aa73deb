"""Quality parity: denoiser agreement against FP64, training parity with a held-out loss, sample
agreement metrics, histograms and slices (tiny model, 16³)."""
import numpy as np
import pandas as pd
import pytest
import torch

from medddpm.sample import quality as sq
from medddpm.data.nifti import Pair, pair_files
from medddpm.core.errors import InputError
from medddpm.train.parity import FP64, denoiser_agreement, held_out_triples, split_held_out, training_parity
from medddpm.report import quality_tables

CPU = torch.device("cpu")


def test_fp64_reference_separates_fp32_from_bf16(tiny):
    df = denoiser_agreement(tiny, ["baseline", "bf16"], 16, CPU, reference=FP64, timesteps=(1, 249))
    worst = df.groupby("config")["rel_l2"].max()
    assert set(df["reference"]) == {FP64} and len(df) == 4
    assert worst["baseline"] < 1e-5  # FP32 rounding only
    assert 1e-3 < worst["bf16"] < 5e-2  # bf16's 8 mantissa bits


def test_split_held_out_keeps_the_last_subjects(phantoms):
    pairs = pair_files(phantoms / "images", phantoms / "masks")
    train, held = split_held_out(list(reversed(pairs)), 1)
    assert [p.subject for p in held] == [sorted(p.subject for p in pairs)[-1]] and len(train) == 2
    for bad in (0, 3):
        with pytest.raises(InputError, match="--held-out must be in"):
            split_held_out(pairs, bad)


def test_held_out_triples_are_fixed(tiny, phantoms):
    pairs = pair_files(phantoms / "images", phantoms / "masks")[:2]
    keys, x_t, mask, t, noise = held_out_triples(pairs, tiny, (16,) * 3, timesteps=(1, 200))
    again = held_out_triples(pairs, tiny, (16,) * 3, timesteps=(1, 200))
    assert list(keys["t"]) == [1, 200, 1, 200] and x_t.shape == (4, 1, 16, 16, 16) and mask.shape[1] == 2
    assert torch.equal(x_t, again[1]) and torch.equal(noise, again[4])
    assert not torch.equal(x_t[0], x_t[1])  # t=1 is almost clean, t=200 mostly noise


def test_training_parity_trains_evaluates_and_keeps_a_checkpoint(tiny, phantoms, tmp_path):
    pairs = pair_files(phantoms / "images", phantoms / "masks")
    train, held = training_parity(pairs, tiny, "opt1", (16,) * 3, CPU, steps=5, eval_every=2, held_out=1,
                                  out=str(tmp_path / "run"))
    assert list(train["step"]) == [1, 2, 3, 4, 5] and train["loss"].notna().all()
    assert sorted(held["step"].unique()) == [0, 2, 4, 5]  # step 0, every 2, and the end
    assert set(held["subject"]) == {"phantom_002"} and (held["config"] == "opt1").all()
    assert (tmp_path / "run" / "checkpoint.pt").exists()
    start, end = (held[held["step"] == s]["loss"].mean() for s in (0, 5))
    assert start != end  # the weights moved; the evaluator saw it


def test_training_parity_restores_the_configurations_flags(tiny, phantoms):
    pairs = pair_files(phantoms / "images", phantoms / "masks")
    torch.backends.cuda.matmul.allow_tf32 = False
    training_parity(pairs, tiny, "opt1", (16,) * 3, CPU, steps=2, eval_every=1, held_out=1)
    assert torch.backends.cuda.matmul.allow_tf32  # the FP32 evaluator ran last, opt1's TF32 is back
    torch.backends.cuda.matmul.allow_tf32 = False


def test_agreement_metrics():
    rng = np.random.default_rng(0)
    ref = rng.uniform(-1, 1, (16, 16, 16)).astype(np.float32)
    brain = np.zeros(ref.shape, np.uint8)
    brain[4:12, 4:12, 4:12] = 1
    same = sq.agreement_metrics(ref, ref.copy(), brain)
    assert same["psnr_db"] == np.inf and same["ssim"] == pytest.approx(1) and same["max_abs"] == 0
    x = ref + 0.01 * rng.standard_normal(ref.shape).astype(np.float32)
    near, far = sq.agreement_metrics(ref, x, brain), sq.agreement_metrics(ref, -ref, brain)
    assert near["psnr_db"] == pytest.approx(10 * np.log10(4 / 1e-4), abs=0.3)
    assert far["psnr_db"] < near["psnr_db"] and far["ssim"] < near["ssim"] < 1
    assert near["mae_brain"] == pytest.approx(np.abs(x - ref)[brain > 0].mean(), rel=1e-5)


def _volumes():
    lab = np.zeros((8, 8, 8), np.uint8)
    lab[2:6, 2:6, 2:6] = 1
    lab[3, 4, 5] = 2
    vols = {"real": {"s": np.linspace(-1, 1, 512, dtype=np.float32).reshape(8, 8, 8)},
            "baseline": {"s": np.full((8, 8, 8), 0.1, np.float32)}}
    return vols, {"s": lab}


def test_sample_agreement_histograms_and_slices():
    vols, labels = _volumes()
    sa = sq.sample_agreement(vols, labels)
    assert set(sa["source"]) == {"real", "baseline"} and (sa["reference"] == "baseline").all()
    with pytest.raises(InputError, match="reference configuration 'bf16-graphs'"):
        sq.sample_agreement(vols, labels, "bf16-graphs")
    h = sq.brain_histograms(vols, labels)
    for _, d in h.groupby("source"):
        assert np.sum(d["density"] * (d["bin_high"] - d["bin_low"])) == pytest.approx(1)
    assert sq.slice_centre(labels["s"]) == (3, 4, 5)  # through the lesion
    sl = sq.orthogonal_slices(vols, labels)
    assert set(sl["source"]) == {"real", "baseline", "mask"} and set(sl["view"]) == set(sq.VIEWS)
    np.testing.assert_array_equal(sq.slice_image(sl, "real", "s", "axial"), vols["real"]["s"][:, :, 5])
    np.testing.assert_array_equal(sq.slice_image(sl, "mask", "s", "sagittal"), labels["s"][3])


def test_sample_volumes_name_a_missing_sample(phantoms, tmp_path):
    pair = pair_files(phantoms / "images", phantoms / "masks")[0]
    with pytest.raises(InputError, match=f"no sample of {pair.subject} from bf16-graphs"):
        sq.sample_volumes({"bf16-graphs": tmp_path}, [Pair(pair.subject, pair.image, pair.mask)])


def test_prediction_band_and_parity_verdict(tmp_path):
    low, high = quality_tables.prediction_band(pd.Series([1.0, 2.0, 3.0]))
    assert (low + high) / 2 == pytest.approx(2) and high - 2 == pytest.approx(4.303 * 1 * (4 / 3) ** 0.5, rel=1e-3)
    rows = [{"config": c, "seed": s, "size": 16, "step": step, "subject": "a", "t": 1, "loss": loss}
            for c, s, end in (("baseline", 0, 0.30), ("baseline", 1, 0.31), ("baseline", 2, 0.32),
                              ("bf16-graphs", 0, 0.315), ("bf16", 0, 0.5))
            for step, loss in ((0, 0.8), (10, end))]
    (tmp_path / "g" / "quality").mkdir(parents=True)
    pd.DataFrame(rows).to_csv(tmp_path / "g" / "quality" / "parity_heldout.csv", index=False)
    v = quality_tables.parity_verdict(tmp_path, ["g"]).set_index("config")
    assert v.loc["bf16-graphs", "inside_band"] and not v.loc["bf16", "inside_band"]
    assert v.loc["bf16-graphs", "loss_step0"] == 0.8 and v.loc["bf16-graphs", "steps"] == 10


def test_long_run_and_steady_state_skip_the_first_interval(tmp_path):
    q = tmp_path / "g" / "quality"
    q.mkdir(parents=True)
    pd.DataFrame({"step": range(1, 11), "loss": [1.0] * 5 + [0.2] * 5}).to_csv(q / "long_log.csv", index=False)
    pd.DataFrame({"step_from": [0, 5, 10], "step_to": [5, 10, 15], "ms_per_step": [900.0, 10.0, 12.0]}).to_csv(
        q / "long_timing.csv", index=False)
    run = quality_tables.long_run(tmp_path, "g", tail=5).iloc[0]
    assert run["steps"] == 10 and run["training loss, last 5 steps"] == pytest.approx(0.2) and run["ms a step"] == 11.0
    assert run["64³ volume, DDIM 50 (s)"] is None  # no 64³ bench-sample row
    assert quality_tables.long_run(tmp_path, "other").empty and quality_tables.long_run(tmp_path, None).empty


def test_sampler_table_measures_samples_against_the_real_image_and_calls_matches():
    """Issue 20: a sampler's row holds the background it draws, its in-brain correlation with the
    real image and PSNR/SSIM; a grey-background sampler does not match DDPM 250's quality."""
    import numpy as np

    from medddpm.sample.quality import REAL, SamplerRun, sampler_table

    rng = np.random.default_rng(0)
    labels = np.zeros((16, 16, 16), np.int64)
    labels[4:12, 4:12, 4:12] = 1
    real = np.where(labels > 0, rng.uniform(-0.5, 0.8, labels.shape), -0.95).astype(np.float32)
    good = (real + rng.normal(0, 0.05, real.shape)).astype(np.float32)  # DDPM-like: black background
    grey = np.where(labels > 0, good, -0.2 + rng.normal(0, 0.25, real.shape)).astype(np.float32)
    runs = {REAL: {"s1": real}, "ddpm250-eta1-bf16-graphs": {"s1": good}, "ddim50-eta0-bf16-graphs": {"s1": grey},
            "ddim50-eta0-fast-w16-p8": {"s1": good}}
    t = sampler_table(runs, {"s1": labels}).set_index(["sampler", "steps", "config"])
    assert t.loc[(REAL, 0, ""), "background_mean"] == pytest.approx(-0.95)
    assert t.loc[("ddim", 50, "bf16-graphs"), "background_mean"] == pytest.approx(-0.2, abs=0.03)
    assert t.loc[("ddpm", 250, "bf16-graphs"), "brain_corr"] > 0.95 and t.loc[("ddpm", 250, "bf16-graphs"), "psnr_db"] > 20
    assert t.loc[("ddim", 50, "bf16-graphs"), "matches_reference"] == "no"
    assert t.loc[("ddpm", 250, "bf16-graphs"), "matches_reference"] == "yes"
    assert t.loc[("ddim", 50, "fast-w16-p8"), "matches_reference"] == "no reference"  # no DDPM run of it
    assert SamplerRun.parse("ddim50-eta0-fast-w16-p8") == SamplerRun("ddim", 50, 0.0, "fast-w16-p8")
    assert SamplerRun("ddpm", 250, 1.0, "bf16-graphs").name == "ddpm250-eta1-bf16-graphs"
    assert SamplerRun.parse("ddpm250-bf16-graphs") == SamplerRun("ddpm", 250, 1.0, "bf16-graphs")  # η left out: the sampler's own
    with pytest.raises(Exception, match="not a sampler run name"):
        SamplerRun.parse("bf16-graphs")
    run = SamplerRun("ddim", 50, 1.0, "fast-w16-p8", clip=False, seed=3)
    assert run.name == "ddim50-eta1-noclip-s3-fast-w16-p8" and SamplerRun.parse(run.name) == run


def test_match_verdicts_use_the_means_over_seeds_and_subjects_of_each_run():
    """Two seeds of DDIM 50 whose backgrounds straddle DDPM 250's match on their mean; a run is
    judged against DDPM 250 of its own configuration and clipping."""
    import pandas as pd

    from medddpm.sample.quality import RUN_KEYS, match_verdicts

    def row(sampler, steps, eta, seed, bg, corr, clip=True, config="bf16-graphs"):
        return dict(zip(RUN_KEYS, (sampler, steps, eta, clip, config)), seed=seed, subject="s", background_mean=bg,
                    brain_corr=corr)

    t = pd.DataFrame([row("real", 0, float("nan"), 0, -0.9, 1.0, config=""),
                      row("ddpm", 250, 1.0, 0, -0.6, 0.98), row("ddpm", 250, 1.0, 1, -0.6, 0.98),
                      row("ddim", 50, 1.0, 0, -0.8, 0.97), row("ddim", 50, 1.0, 1, -0.45, 0.97),  # mean −0.625
                      row("ddim", 50, 0.0, 0, -0.6, 0.80), row("ddim", 50, 0.0, 1, -0.6, 0.80),  # r too low
                      row("ddim", 50, 1.0, 0, -0.6, 0.98, clip=False)])  # no unclipped DDPM 250
    v = match_verdicts(t)
    assert list(v) == ["", "yes", "yes", "yes", "yes", "no", "no", "yes"]
    t.loc[t["clip"] == False, "config"] = "other"  # noqa: E712
    assert match_verdicts(t).iloc[-1] == "no reference"


def _script(name: str):
    """scripts/<name>.py (or scripts/probes/<name>.py) loaded as a module."""
    import importlib.util
    from pathlib import Path

    scripts = Path(__file__).parents[1] / "scripts"
    path = next(p for p in (scripts / f"{name}.py", scripts / "probes" / f"{name}.py") if p.exists())
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tiny_checkpoint(phantoms, out):
    """A 2-step tiny-model checkpoint trained on the phantoms at 8³ (CPU: DDPM 250 of one subject in 3 s, 20 s at 16³)."""
    from medddpm.cli import main as cli

    assert cli(["train", "--images", str(phantoms / "images"), "--masks", str(phantoms / "masks"), "--model", "tiny",
                "--size", "8", "--steps", "2", "--out", str(out), "--device", "cpu", "--quiet"]) == 0
    return out / "checkpoint.pt"



def test_samplers_step_samples_every_run_once_and_writes_the_table(phantoms, tmp_path):
    run = _tiny_checkpoint(phantoms, tmp_path / "run").parent
    script = _script("quality")
    argv = ["samplers", "--out", str(tmp_path / "out"), "--data", str(phantoms), "--held-out", "1", "--model", "tiny",
            "--checkpoint", str(run / "checkpoint.pt"), "--configs", "baseline", "--runs", "ddpm250,ddim5-eta0",
            "--work", str(tmp_path / "work"), "--device", "cpu"]
    assert script.main(argv) == 0
    table = pd.read_csv(tmp_path / "out" / "quality" / "samplers.csv")
    assert set(zip(table["sampler"], table["steps"])) == {("real", 0), ("ddpm", 250), ("ddim", 5)}
    assert set(table["matches_reference"].dropna()) <= {"yes", "no"} and table["psnr_db"].notna().all()
    first = (tmp_path / "work" / "samplers" / "ddim5-eta0-baseline").stat().st_mtime_ns
    assert script.main(argv) == 0  # a second call keeps the samples it has
    assert (tmp_path / "work" / "samplers" / "ddim5-eta0-baseline").stat().st_mtime_ns == first
    assert len(pd.read_csv(tmp_path / "out" / "quality" / "samplers.csv")) == 2 * len(table)


def test_run_agreement_pairs_each_run_with_the_reference_run_of_the_same_seed():
    """Issue 20 (FP8): a configuration's sample against the reference configuration's sample of the
    same sampler run and seed, voxel by voxel; a run without its reference is named."""
    from medddpm.sample.quality import REAL, run_agreement

    rng = np.random.default_rng(1)
    labels = np.zeros((8, 8, 8), np.int64)
    labels[2:6, 2:6, 2:6] = 1
    a, b = (rng.uniform(-1, 1, labels.shape).astype(np.float32) for _ in range(2))
    runs = {REAL: {"s": a}, "ddpm250-eta1-baseline": {"s": a}, "ddpm250-eta1-s1-baseline": {"s": b},
            "ddpm250-eta1-fp": {"s": a + 0.01}, "ddpm250-eta1-s1-fp": {"s": a}}
    t = run_agreement(runs, {"s": labels}).set_index("seed")
    assert len(t) == 2 and set(t["config"]) == {"fp"} and set(t["reference"]) == {"baseline"}
    assert t.loc[0, "psnr_db"] == pytest.approx(20 * np.log10(2 / 0.01), abs=0.01)  # paired with seed 0's own
    assert t.loc[1, "psnr_db"] < 10  # seed 1's reference is b, not a
    with pytest.raises(InputError, match="no samples of 'ddim5-eta0-baseline'"):
        run_agreement({**runs, "ddim5-eta0-fp": {"s": a}}, {"s": labels})


def test_samplers_step_with_a_reference_writes_its_named_tables(phantoms, tmp_path):
    run = _tiny_checkpoint(phantoms, tmp_path / "run").parent
    argv = ["samplers", "--out", str(tmp_path / "out"), "--data", str(phantoms), "--held-out", "1", "--model", "tiny",
            "--checkpoint", str(run / "checkpoint.pt"), "--configs", "baseline,opt1", "--runs", "ddim3-eta0",
            "--work", str(tmp_path / "work"), "--device", "cpu", "--name", "precision"]
    assert _script("quality").main(argv) == 0
    q = tmp_path / "out" / "quality"
    agree = pd.read_csv(q / "precision_agreement.csv")
    assert set(agree["config"]) == {"opt1"} and (agree["psnr_db"] > 30).all()  # TF32 off on a CPU: near FP32
    assert (q / "precision.csv").exists() and not (q / "samplers.csv").exists() and not (q / "sampler_slices.parquet").exists()
    with pytest.raises(SystemExit):
        _script("quality").main([*argv[:-1], "../x"])


def test_samplers_step_refuses_a_bad_run_name_in_one_line(phantoms, tmp_path, capsys):
    script = _script("quality")
    assert script.main(["samplers", "--out", str(tmp_path), "--data", str(phantoms), "--checkpoint", "x.pt",
                        "--runs", "ddim", "--work", str(tmp_path / "w"), "--device", "cpu"]) == 2
    assert "not a sampler run name" in capsys.readouterr().err and not (tmp_path / "quality").exists()
    assert not (tmp_path / "w").exists()  # nothing written before the check


def test_agree_step_with_a_checkpoint_compares_its_trained_weights_on_held_out_subjects(phantoms, tmp_path):
    run = _tiny_checkpoint(phantoms, tmp_path / "run").parent
    script = _script("quality")
    assert script.main(["agree", "--out", str(tmp_path / "out"), "--data", str(phantoms), "--held-out", "1",
                        "--checkpoint", str(run / "checkpoint.pt"), "--weights", "model",
                        "--configs", "baseline,bf16", "--device", "cpu"]) == 0
    table = pd.read_csv(tmp_path / "out" / "quality" / "agreement_trained.csv")
    assert len(table) == 2 * 6 and set(table["subject"]) == {"phantom_002"} and set(table["step"]) == {2}
    assert set(table["weights"]) == {"model"}
    worst = table.groupby("config")["rel_l2"].max()
    assert worst["baseline"] == 0 and 1e-4 < worst["bf16"] < 5e-2  # against itself; bf16's rounding
    assert (table["mean_err"].abs() <= table["max_abs"]).all()
    assert not (tmp_path / "out" / "quality" / "agreement.csv").exists()  # seeded weights' table untouched


def test_thin_offset_probe_needs_a_gpu_and_names_every_case(tmp_path, capsys):
    """scripts/probes/thin_offset_probe.py: without CUDA one line and exit 2, nothing written; its cases are
    both thin convolutions × with and without a bias × cuDNN and conv3d_thin."""
    probe = _script("thin_offset_probe")
    if not torch.cuda.is_available():
        assert probe.main([str(tmp_path / "t.csv")]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err and not (tmp_path / "t.csv").exists()
    rows = probe.probe(6, CPU)
    assert len(rows) == 8 and set(rows["engine"]) == {"cudnn", "triton"} and rows["bias"].sum() == 4
    assert (rows["rel_l2"] < 2e-2).all()  # bf16 output rounding against float64


def test_the_sampling_chapter_opens_on_ddpm_250_per_gpu_in_fp32_opt1_and_the_fastest():
    """Issue 76: chapter 10's first table: per GPU, batch-1 DDPM 250 under baseline, opt1 and the fastest config."""
    import pandas as pd

    from medddpm.report.quality_tables import sampling_state

    sb = pd.DataFrame([{"gpu_slug": g, "config": c, "sampler": "ddpm", "steps": 250, "batch": b, "s_per_volume_median": s}
                       for g, c, b, s in [("a", "baseline", 1, 50.0), ("a", "opt1", 1, 25.0), ("a", "fast", 1, 5.0),
                                          ("a", "fast", 4, 1.0), ("b", "fast", 1, 4.0)]])
    t = sampling_state(sb).set_index("gpu_slug")
    assert (t.loc["a", "fastest configuration"], t.loc["a", "fastest (s)"], t.loc["a", "× FP32"]) == ("fast", 5.0, 10.0)
    assert pd.isna(t.loc["b", "FP32 (s)"]) and pd.isna(t.loc["b", "× FP32"]) and sampling_state(sb.iloc[:0]).empty


def test_the_fp8_chapter_opens_on_the_fastest_bf16_and_fp8_sampler_per_gpu():
    import pandas as pd

    from medddpm.report.quality_tables import fp8_state

    sb = pd.DataFrame([{"gpu_slug": g, "config": c, "sampler": "ddpm", "steps": 250, "batch": 1, "s_per_volume_median": s}
                       for g, c, s in [("a", "opt1", 20.0), ("a", "fast", 4.0), ("a", "fast-fp8", 3.2), ("b", "fast", 4.0)]])
    t = fp8_state(sb)
    assert list(t["gpu_slug"]) == ["a"] and t["× bf16"].iloc[0] == pytest.approx(1.25)  # b has no FP8 row
    assert (t["bf16 configuration"].iloc[0], t["FP8 configuration"].iloc[0]) == ("fast", "fast-fp8")
