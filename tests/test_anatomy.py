"""Quality on real anatomy (medddpm.sample.anatomy, scripts/anatomy.py): measures against the
subject's scan and the template, per sample, per pair of seeds and per run."""
import subprocess
import sys

import numpy as np
import pandas as pd

from medddpm.sample.anatomy import measures, region_means, summary

from book_stores import REPO


def test_measures_of_the_scan_itself_and_of_a_shifted_background():
    rng = np.random.default_rng(0)
    regions = np.zeros((16, 16, 16), np.int64)
    regions[4:12, 4:12, 4:8], regions[4:12, 4:12, 8:12] = 4, 11
    real = np.where(regions > 0, rng.uniform(0, 1, regions.shape), -0.9).astype(np.float32)
    brain = regions > 0
    same = measures(real, real, brain, regions)
    assert same["brain_corr"] == 1 and same["hist_w1"] == 0 and same["ssim"] == 1 and same["psnr_db"] == np.inf
    assert abs(same["background_mean"] + 0.9) < 1e-6 and abs(same["region_corr"] - 1) < 1e-12
    brighter = measures(real, np.where(brain, real, -0.5).astype(np.float32), brain, regions)
    assert abs(brighter["background_mean"] + 0.5) < 1e-6 and brighter["brain_corr"] == 1 and brighter["hist_w1"] == 0
    assert region_means(real, regions).shape == (2,)


def test_summary_reports_the_gap_and_the_spread_between_seeds():
    rows = [{"run": "real", "seed": 0, "subject": s, "background_mean": -0.9} for s in "ab"]
    rows += [{"run": "x", "seed": k, "subject": s, "background_mean": b}
             for s, bs in (("a", (-0.5, -0.7)), ("b", (-0.8, -0.8))) for k, b in enumerate(bs)]
    df = pd.DataFrame(rows).assign(**{m: 0.0 for m in ("brain_corr", "ssim", "psnr_db", "background_std", "hist_w1",
                                                       "region_corr")})
    out = summary(df, pd.DataFrame(columns=["run", "ssim_between_seeds"])).set_index("run")
    assert abs(out.loc["x", "background_gap"] - 0.2) < 1e-9  # mean −0.7 against −0.9
    assert abs(out.loc["x", "background_seed_spread"] - 0.1) < 1e-9 and abs(out.loc["x", "background_seed_spread_max"] - 0.2) < 1e-9


def test_the_script_samples_and_measures_the_validation_masks(ixi16, ixi_checkpoint, tmp_path):
    res = subprocess.run([sys.executable, "scripts/anatomy.py", "--data", str(ixi16), "--checkpoint", str(ixi_checkpoint),
                          "--out", str(tmp_path / "out"), "--name", "v-s0-tiny", "--runs", "ddim2-eta0.5:baseline",
                          "--seeds", "0,1", "--work", str(tmp_path / "w"), "--device", "cpu", "--workers", "1",
                          "--utility-steps", "2"],
                         cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "out" / "anatomy"
    s = pd.read_csv(out / "anatomy_summary.csv")
    assert list(s["run"]) == ["real", "template", "ddim2-eta0.5:baseline"] and (s["prediction"] == "v").all()
    assert s.set_index("run").loc["ddim2-eta0.5:baseline", "seeds"] == 2 and (s["split"] == "val").all()
    assert len(pd.read_csv(out / "anatomy_diversity.csv")) == 1  # one subject, one pair of seeds
    assert (out / "slices-v-s0-tiny-val.parquet").is_file()
    util = pd.read_csv(out / "anatomy_utility.csv")  # segmenters trained on the 3 training scans, real and synthetic
    assert sorted(util["source"]) == ["real", "synthetic"] and util["dice"].between(0, 1).all()
    assert (util["subject"] == "IXI015").all() and (util["sampler"] == "ddim2-eta0.5:baseline").all()  # η kept
    # the report keeps both sources of one subject and seed (they are not duplicates of each other)
    from medddpm.report.anatomy import utility

    gpu = tmp_path / "out"
    table = utility(tmp_path, gpu.name)
    assert sorted(table["segmenter trained on"]) == ["real", "synthetic"] and (table["subjects"] == 1).all()


def test_runs_at_a_larger_size_stay_out_of_the_base_sizes_table_and_get_their_own_facts(tmp_path):
    """A run named with a size suffix (v-s11-fast-96) is parsed as configuration fast at 96³: the
    64³ table leaves it out, recipes(size=96) holds it alone, and the chapter's first table judges it at 96³."""
    from medddpm.report.anatomy import LARGE_RUN, NAME, recipes, sizes, state
    from medddpm.sample.anatomy import REAL, TEMPLATE

    assert NAME.match("v-s11-fast-96").group("config", "size") == ("fast", "96")
    assert NAME.match("v-s4-opt1").group("config", "size") == ("opt1", None)
    assert NAME.match("v-s0-fast-fp8fwd").group("config", "size") == ("fast-fp8fwd", None)
    folder = tmp_path / "gpu" / "anatomy"
    folder.mkdir(parents=True)
    rows = []
    for name, gap, w1 in (("v-s0-fast", -0.02, 0.05), ("v-s11-fast-96", -0.08, 0.05), ("v-s12-fast-96", -0.06, 0.05)):
        for run, g, w in ((REAL, 0.0, 0.0), (TEMPLATE, 0.0, 0.09), (LARGE_RUN, gap, w1)):
            rows.append({"name": name, "split": "val", "run": run, "step": 1000, "background_mean": -0.9 + g,
                         "real_background_mean": -0.9, "background_gap": g, "background_seed_spread": 0.01,
                         "background_seed_spread_max": 0.02, "hist_w1": w, "brain_corr": 0.8, "region_corr": 0.9,
                         "ssim": 0.7, "ssim_between_seeds": 0.8})
    pd.DataFrame(rows).to_csv(folder / "anatomy_summary.csv", index=False)
    assert sizes(tmp_path, "gpu") == [96]
    base, big = recipes(tmp_path, "gpu"), recipes(tmp_path, "gpu", size=96)
    assert list(base["runs"]) == [1] and base["gap"].iloc[0] == -0.02 and base["trained with"].iloc[0] == "fast"
    assert list(big["runs"]) == [2] and abs(big["gap"].iloc[0] + 0.07) < 1e-12
    t = state(tmp_path, "gpu").set_index("measure (validation subjects)")
    assert list(t.columns) == ["64³", "96³", "target"]
    assert t.loc["background mean, sample − scan (mean over seeds)", "96³"] == "-0.070"
    assert t.loc["W1 of in-brain intensities", "96³"] == "0.050 (template 0.090)"
    assert state(tmp_path, "none").iloc[:, 1:3].eq("—").all().all()


def test_the_gate_history_judges_every_checkpoint_that_holds_the_reference(tmp_path):
    """gate_history: one block per checkpoint with FP32 DDPM 250 samples, oldest first; gate() of
    the newest by default; an FP8 run found in any of them keeps its checkpoint."""
    from medddpm.report.anatomy import REF_RUN, gate, gate_history

    folder = tmp_path / "gpu" / "anatomy"
    folder.mkdir(parents=True)
    rows = [{"name": name, "run": run, "seed": seed, "subject": subject, "step": step, "split": "val",
             "brain_corr": 0.8 + 0.001 * seed - (0.05 if "fp8" in run else 0), "background_mean": -0.9, "hist_w1": 0.05}
            for name, step, runs in (("v-s1-fast", 6000, (REF_RUN, "dpm2m-sde12-logsnr:fast-fp8")),
                                     ("v-s7-fast", 16000, (REF_RUN, "ddpm250:fast")))
            for run in runs for seed in range(4) for subject in ("a", "b")]
    pd.DataFrame(rows).to_csv(folder / "anatomy_samples.csv", index=False)
    pd.DataFrame([{"name": n, "run": r, "subject": s, "seed_a": 0, "seed_b": 1, "ssim_between_seeds": 0.8}
                  for n, r in (("v-s1-fast", REF_RUN), ("v-s1-fast", "dpm2m-sde12-logsnr:fast-fp8"),
                               ("v-s7-fast", REF_RUN), ("v-s7-fast", "ddpm250:fast")) for s in ("a", "b")]).to_csv(
        folder / "anatomy_diversity.csv", index=False)
    assert set(gate(tmp_path, "gpu")["name"]) == {"v-s7-fast"}
    h = gate_history(tmp_path, "gpu")
    assert list(dict.fromkeys(h["checkpoint"])) == ["v-s1-fast", "v-s7-fast"] and list(h["step"].unique()) == [6000, 16000]
    fp8 = h[h["sampler run"].str.contains("fp8")]
    assert len(fp8) == 1 and fp8["verdict"].iloc[0].startswith("fail") and fp8["checkpoint"].iloc[0] == "v-s1-fast"


def test_the_chapter_opens_on_the_largest_size_with_its_own_device_wall_time_and_utility(tmp_path):
    """Issue 76, sizes 96³ and 128³ in one store: the larger-size table holds both; the chapter's first table judges
    the largest (in-brain r beside the template's, Dice against real-trained, its runs' plateau state), a utility of
    another checkpoint than the measures' says so; the runs table names the GPUs and wall time of a run's own record
    (train/NAME/env.json)."""
    import json

    from medddpm.report.anatomy import LARGE_RUN, larger, largest_run, run_slices, runs, state
    from medddpm.sample.anatomy import REAL, TEMPLATE

    folder = tmp_path / "gpu" / "anatomy"
    rows, util = [], []
    for name, r in (("v-s0-fast", 0.81), ("v-s1-fast", 0.82), ("v-s11-fast-96", 0.76), ("v-s13-fast-128", 0.80)):
        for run, corr in ((REAL, 1.0), (TEMPLATE, 0.71), (LARGE_RUN, r)):
            rows.append({"name": name, "split": "val", "run": run, "step": 1000, "background_mean": -0.92,
                         "real_background_mean": -0.9, "background_gap": -0.02, "background_seed_spread": 0.01,
                         "background_seed_spread_max": 0.02, "hist_w1": 0.05, "brain_corr": corr, "region_corr": 0.9,
                         "ssim": 0.7, "ssim_between_seeds": 0.8})
        train = folder / "train" / name
        train.mkdir(parents=True)
        pd.DataFrame({"step": [0, 3000, 6000], "weights": "ema", "subject": "a", "t": 1,
                      "loss": [0.5, 0.2, 0.1]}).to_csv(train / "heldout.csv", index=False)
    (folder / "train" / "v-s13-fast-128" / "env.json").write_text(
        json.dumps({"gpu": "NVIDIA H200", "gpus": 2, "train_wall_s": [600, 300]}))
    for name, real, synthetic in (("v-s0-fast", 0.95, 0.95), ("v-s13-fast-128", 0.97, 0.90)):
        util += [{"name": name, "split": "val", "step": 1000 if name == "v-s0-fast" else 500, "source": source, "seed": 0, "subject": s, "dice": d,
                  "steps": 100} for source, d in (("real", real), ("synthetic", synthetic)) for s in ("a", "b")]
    pd.DataFrame(rows).to_csv(folder / "anatomy_summary.csv", index=False)
    pd.DataFrame(util).to_csv(folder / "anatomy_utility.csv", index=False)
    (folder / "train" / "v-s14-fast-128").mkdir()  # trained, never sampled: not one of the runs behind the column
    pd.DataFrame({"step": [0, 3000], "weights": "ema", "subject": "a", "t": 1, "loss": [0.5, 0.2]}).to_csv(
        folder / "train" / "v-s14-fast-128" / "heldout.csv", index=False)
    assert list(larger(tmp_path, "gpu")["size"]) == ["96³", "128³"] and largest_run(tmp_path, "gpu") == "v-s13-fast-128"
    t = state(tmp_path, "gpu").set_index("measure (validation subjects)")
    assert list(t.columns) == ["64³", "128³", "target"]
    # 64³ reads the 12-step chain's samples, which this store lacks; the largest size reads DDPM 250's
    assert (t.loc["in-brain r", "64³"], t.loc["in-brain r", "128³"]) == ("—", "0.800 (template 0.710)")
    # its utility was measured on an earlier checkpoint of the same name (step 500, the measures' 1,000): said
    assert t.loc["segmentation Dice, synthetic- against real-trained", "128³"] == ("92.8 % (1 of those runs, steps 500; "
                                                                                   "v-s13-fast-128 at an earlier checkpoint)")
    # its held-out loss halved between its last two evaluations
    assert t.loc["runs (steps of their checkpoints)", "128³"] == "1 runs (steps 1,000); still learning: v-s13-fast-128"
    r = runs(tmp_path, "gpu").set_index("run")
    assert r.loc["v-s13-fast-128", "GPUs"] == "2 × NVIDIA H200" and r.loc["v-s13-fast-128", "wall min"] == 15
    assert r.loc["v-s13-fast-128", "GPU-hours"] == 0.5 and r.loc["v-s13-fast-128", "size"] == "128³"
    assert larger(tmp_path, "none").empty and runs(tmp_path, "none").empty
    sl = pd.DataFrame([{"source": src, "subject": s, "view": "axial", "row": 0, "col": 0, "value": 0.5}
                       for src in (LARGE_RUN, "dpm2m-sde12-logsnr-eta1.3:fast") for s in ("IXI441", "IXI440")])
    sl.to_parquet(folder / "slices-v-s13-fast-128-val.parquet", index=False)
    shown, titles = run_slices(tmp_path, "gpu", "v-s13-fast-128")
    assert set(shown["subject"]) == {"IXI440"} and list(titles.values()) == ["ddpm 250", "dpm2m-sde 12, η 1.3"]
    assert run_slices(tmp_path, "gpu", None) is None


def test_a_larger_sizes_numerics_gate_reads_only_the_subjects_and_seeds_fp32_sampled(tmp_path):
    """FP32 DDPM 250 at 128³ on 2 of 3 subjects and 2 of 3 seeds: the chapter's gate stays the base
    size's; the 128³ gate judges fast on FP32's own (subject, seed) pairs only, its band cannot be
    checked against itself (2 seeds); the runs table reads each run from its own folder."""
    import json

    from medddpm.report.anatomy import LARGE_RUN, REF_RUN, gate, gate_history, gate_runs
    from medddpm.report.anatomy import runs as training_runs
    from medddpm.sample.anatomy import REAL, TEMPLATE

    folder = tmp_path / "gpu" / "anatomy"
    folder.mkdir(parents=True)
    rows, div = [], []
    for name, runs, seeds, subjects in (("v-s7-fast", (REF_RUN, LARGE_RUN), range(4), "ab"),
                                        ("v-s14-fast-128", (REF_RUN,), range(2), "ab"),
                                        ("v-s14-fast-128", (LARGE_RUN,), range(3), "abc")):
        for run in runs:
            # fast at 128³ is 0.001 brighter than FP32 on every shared sample; its third subject and seed
            # lie far off and must not count
            shift = 0.001 if name.endswith("128") and run == LARGE_RUN else 0.0
            far = lambda s, seed: 0.5 if (s == "c" or seed == 2) and shift else 0.0  # noqa: E731
            rows += [{"name": name, "run": run, "seed": seed, "subject": s, "step": 1000, "split": "val",
                      "brain_corr": 0.8 + 0.001 * seed - far(s, seed), "background_mean": -0.9 + 0.0001 * seed + shift,
                      "hist_w1": 0.05} for seed in seeds for s in subjects]
            div += [{"name": name, "run": run, "subject": s, "seed_a": 0, "seed_b": 1, "ssim_between_seeds": 0.8}
                    for s in subjects]
    pd.DataFrame(rows).to_csv(folder / "anatomy_samples.csv", index=False)
    pd.DataFrame(div).to_csv(folder / "anatomy_diversity.csv", index=False)
    pd.DataFrame([{"name": n, "split": "val", "run": r, "step": 1000, "background_mean": -0.9, "real_background_mean": -0.9,
                   "background_gap": 0.0, "background_seed_spread": 0.0, "background_seed_spread_max": 0.0, "hist_w1": 0.05,
                   "brain_corr": 0.8, "region_corr": 0.9, "ssim": 0.7, "ssim_between_seeds": 0.8}
                  for n in ("v-s7-fast", "v-s14-fast-128") for r in (REAL, TEMPLATE, LARGE_RUN)]).to_csv(
        folder / "anatomy_summary.csv", index=False)
    assert set(gate(tmp_path, "gpu")["name"]) == {"v-s7-fast"}  # the newest at the base size, not the newest
    big = gate(tmp_path, "gpu", "v-s14-fast-128")
    assert set(big["subject"]) == {"a", "b"} and set(big["seeds"]) == {2}
    verdict = gate_runs(big).set_index("sampler run")["verdict"]
    assert verdict.to_dict() == {"ddpm 250 · baseline": "reference", "ddpm 250 · fast": "fail: background"}
    assert list(dict.fromkeys(gate_history(tmp_path, "gpu")["checkpoint"])) == ["v-s7-fast", "v-s14-fast-128"]
    # the training runs beyond the base size, from their own folders
    train = folder / "train" / "v-s14-fast-128"
    train.mkdir(parents=True)
    pd.DataFrame({"step": [0, 3000, 6000, 6000], "weights": "ema", "subject": "a", "t": 1,
                  "loss": [0.5, 0.1, 0.0985, 0.0985]}).to_csv(train / "heldout.csv", index=False)
    pd.DataFrame({"step": [1, 6500], "loss": [0.8, 0.1], "global_batch": [4, 4], "data": "device"}).to_csv(
        train / "log.csv", index=False)
    (train / "env.json").write_text(json.dumps({"gpu": "NVIDIA H200", "gpus": 4, "train_wall_s": [900]}))
    r = training_runs(tmp_path, "gpu").set_index("run").loc["v-s14-fast-128"]
    assert (r["GPUs"], r["global batch"], r["steps"], r["best step"]) == ("4 × NVIDIA H200", 4, 6500, 6000)
    assert r["last drop"] == "1.5 %" and not r["levelled"] and r["wall min"] == 15 and r["GPU-hours"] == 1.0
    # a recipe-plateau run's arm on another GPU's folder: read through its manifest, no copy in train/, its GPUs and
    # global batch from the manifest and its wall from the pipeline's stamps
    run = tmp_path / "h200" / "recipe" / "plateau-128-2026-01-02"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "times.txt").write_text("t 100.0\nt-rc0 700.0\n")
    arm = run / "v-s15-fast-128"
    arm.mkdir()
    pd.DataFrame({"step": [0, 3000, 6000], "weights": "ema", "subject": "a", "t": 1,
                  "loss": [0.5, 0.09, 0.0895]}).to_csv(arm / "heldout.csv", index=False)
    (run / "run.json").write_text(json.dumps({"kind": "recipe-plateau", "date": "2026-01-02", "gpu": "NVIDIA H200",
                                              "machine": "m", "commits": {}, "changed": "c", "kept": "k", "gpus": 1,
                                              "arms": {"v-s15-fast-128": {"stamps": ["t", "t-rc"],
                                                                          "flags": "--nproc 1 --grad-accum 4"}}}))
    r = training_runs(tmp_path, "gpu").set_index("run").loc["v-s15-fast-128"]
    assert (r["GPUs"], r["global batch"], r["steps"], r["levelled"]) == ("1 × NVIDIA H200", 4, 6000, True)
    assert r["wall min"] == 10 and r["GPU-hours"] == 10 / 60
    assert training_runs(tmp_path, None).empty  # no anatomy GPU: no runs, the plateau run's included
