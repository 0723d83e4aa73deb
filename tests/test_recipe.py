"""Issue 75: training recipes (TrainConfig's schedule and loss weights, RECIPES, `train --recipe`) and the report's
reading of recipe A/B runs through their manifests."""
import json
import math

import pandas as pd
import pytest
import torch

from medddpm.core.config import DEFAULT_RECIPE, RECIPES, DiffusionConfig, TrainConfig, recipe_config


def test_the_rate_warms_up_linearly_then_stays_or_follows_a_half_cosine_to_its_end():
    c = TrainConfig(lr=1e-3, lr_warmup=4, lr_decay="cosine", lr_final=0.1)
    assert [c.lr_at(s, 24) for s in range(4)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert c.lr_at(4, 24) == pytest.approx(1e-3) and c.lr_at(23, 24) == pytest.approx(1e-4)
    assert c.lr_at(13.5, 24) == pytest.approx(1e-4 + 0.9e-3 * 0.5)  # half-way down the cosine
    assert c.lr_at(100, 24) == pytest.approx(1e-4)  # past the end: the final rate
    rates = [c.lr_at(s, 24) for s in range(4, 24)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))
    assert TrainConfig(lr=3e-4).lr_at(0, 10) == TrainConfig(lr=3e-4).lr_at(9, 10) == 3e-4  # the paper's: constant


@pytest.mark.parametrize("field,value,needle", [("lr_decay", "linear", "lr_decay must be one of"),
                                                ("lr_final", 1.5, "lr_final must be in"),
                                                ("lr_warmup", -1, "lr_warmup must be"),
                                                ("min_snr_gamma", -1.0, "min_snr_gamma must be")])
def test_bad_recipe_values_are_refused(field, value, needle):
    with pytest.raises(ValueError, match=needle):
        TrainConfig(**{field: value})


def test_a_recipe_is_its_values_with_the_flags_given_on_top_and_the_paper_one_flag_away():
    assert recipe_config("paper") == TrainConfig(recipe="paper")  # TrainConfig's defaults are Med-DDPM's
    default = recipe_config(DEFAULT_RECIPE, lr=None, seed=3)
    assert default.recipe == "muon" and default.optimizer == "muon" and default.lr_decay == "cosine" and default.seed == 3
    assert recipe_config("cosine").optimizer == "adam" and recipe_config("cosine", lr=1e-4).lr == 1e-4
    # muon is cosine with Muon: every other recipe value the same
    assert {k: v for k, v in RECIPES["muon"].items() if k != "optimizer"} == {
        k: v for k, v in RECIPES["cosine"].items() if k != "optimizer"}
    with pytest.raises(ValueError, match="unknown recipe 'fastest'"):
        recipe_config("fastest")


@pytest.mark.parametrize("prediction", ["eps", "v"])
def test_min_snr_weights_have_mean_one_and_cap_the_high_snr_timesteps(prediction):
    from medddpm.diffusion.gaussian import GaussianDiffusion

    d = GaussianDiffusion(torch.nn.Identity(), DiffusionConfig(prediction=prediction))
    w = d.min_snr_weights(5.0)
    abar = d.alphas_cumprod.double()
    snr = abar / (1 - abar)
    want = snr.clamp(max=5.0) / (snr + 1 if prediction == "v" else snr)
    torch.testing.assert_close(w.double(), want / want.mean(), rtol=1e-6, atol=1e-7)
    assert w.mean().item() == pytest.approx(1.0)
    assert w[0] < w[100]  # the least noisy timesteps, SNR far above γ, weigh least


def test_the_trainer_sets_each_steps_rate_and_weights_the_loss(phantoms, tmp_path):
    """The rate of every optimizer step is TrainConfig.lr_at(step, steps); Min-SNR-γ changes what is trained."""
    from medddpm.core.config import MODEL_PRESETS, run_config
    from medddpm.data.nifti import pair_files
    from medddpm.data.volumes import VolumeDataset
    from medddpm.train.trainer import Trainer

    ds = VolumeDataset(pair_files(phantoms / "images", phantoms / "masks"), "tiny", 1, (16, 16, 16))
    seen = []

    def trainer(out, **kw):
        cfg = TrainConfig(lr=1e-3, lr_warmup=2, lr_decay="cosine", grad_accum=1, save_every=100, **kw)
        t = Trainer(ds, MODEL_PRESETS["tiny"], cfg, run_config("baseline"), torch.device("cpu"), out, (16, 16, 16))
        step = t.optimizer.step
        t.optimizer.step = lambda *a, **k: (seen.append(t.optimizer.param_groups[0]["lr"]), step(*a, **k))[1]
        return t
    plain = trainer(tmp_path / "a")
    plain.fit(5, progress=False)
    assert seen == pytest.approx([TrainConfig(lr=1e-3, lr_warmup=2, lr_decay="cosine").lr_at(s, 5) for s in range(5)])
    weighted = trainer(tmp_path / "b", min_snr_gamma=5.0)
    assert weighted.engine.train_step.loss_weights is not None and plain.engine.train_step.loss_weights is None
    weighted.fit(5, progress=False)
    assert plain.losses[0] != weighted.losses[0]  # the same draws, another weighting


def _store(tmp_path, runs):
    for gpu, name, manifest in runs:
        d = tmp_path / gpu / "recipe" / name
        (d / "arm").mkdir(parents=True)
        base = {"kind": "recipe-ab", "gpu": gpu, "machine": "m", "commits": {}, "changed": "c", "kept": "k",
                "arms": {"arm": {"flags": "--lr 1", "recipe_default": "paper"}}, "target": {"heldout": 0.2}}
        (d / "run.json").write_text(json.dumps({**base, **manifest}))
        rows = [{"step": s, "weights": "ema", "subject": "a", "t": 1, "loss": l, "seconds": sec}
                for s, l, sec in ((0, 0.5, 9.0), (10, 0.3, 2.0), (20, 0.19, 4.0), (30, 0.15, 6.0))]
        pd.DataFrame(rows).to_csv(d / "arm" / "heldout.csv", index=False)
        (d / "arm" / "stdout.txt").write_text("timing: ready 1.5 s, first step 0.1 s\n")
    return tmp_path


def test_runs_are_found_by_their_manifests_newest_first_and_superseded_ones_left_out(tmp_path):
    from medddpm.report import manifests, recipe

    root = _store(tmp_path, [("h200", "a", {"date": "2026-11-01"}), ("h200", "b", {"date": "2026-11-02"}),
                             ("h200", "c", {"date": "2026-11-03", "supersedes": "b", "arms": {"arm": {
                                 "flags": "--lr 1", "recipe_default": "paper", "after_reading": True}}}),
                             ("h100", "d", {"date": "2026-12-01"})])
    assert [r[1].name for r in manifests.runs(root, "recipe-ab", ["h200"])] == ["c", "a"]
    assert recipe.newest(root, ["h100"])[1].name == "d" and recipe.newest(root, ["l40s"]) is None
    gpu, run, m = recipe.newest(root, ["h200"])
    rec = recipe.records(recipe.curves(run, m), m["target"]["heldout"])
    assert rec.loc[0, "step at target"] == 20 and rec.loc[0, "clock at target (s)"] == 4.0
    assert rec.loc[0, "wall at target (s)"] == 5.5 and rec.loc[0, "final loss"] == 0.15 and not rec.loc[0, "declared"]
    assert math.isnan(recipe.records(recipe.curves(run, m), 0.1).loc[0, "step at target"])  # never reached
    table = recipe.record_table(root, ["h200"], 0.2)  # the runs in date order, each run's fastest arm
    assert list(table["run"]) == ["h200/recipe/a", "h200/recipe/c"] and list(table["steps to target"]) == [20, 20]
    assert list(table["change"].str.contains("after reading")) == [False, True]  # c's arm was added after reading
    (run / "run.json").write_text(json.dumps({"kind": "recipe-ab"}))
    with pytest.raises(ValueError, match="lacks date, gpu"):
        manifests.runs(root, "recipe-ab")



def _run(folder, steps, losses, ms, ranks, clock=None):
    folder.mkdir(parents=True)
    pd.DataFrame([{"step": s, "weights": "ema", "subject": "a", "t": 1, "loss": v, **({"seconds": s * clock} if clock else {})}
                  for s, v in zip(steps, losses)]).to_csv(folder / "heldout.csv", index=False)
    pd.DataFrame({"step_from": [0, 1, 500], "step_to": [1, 500, 1000], "ms_per_step": [9e4, ms, ms + 2]}
                 ).to_csv(folder / "timing.csv", index=False)
    (folder / "stdout.txt").write_text(f"trained to step {steps[-1]} on {ranks} ranks (global batch {ranks})\n"
                                       "timing: ready 30.0 s, first step 1.0 s\n")


def test_128_runs_compare_in_minutes_of_steps_and_the_plateau_run_is_read_from_its_manifest(tmp_path):
    """recipe.big_curves / big_records, manifests.stage_seconds: chapter 14's runs and a recipe-plateau run's arm (its own
    folder, not a copy), minutes at the run's median steady step, the target's first hit, the plateau rule."""
    from medddpm.report import manifests, recipe

    _run(tmp_path / "h100" / "anatomy" / "train" / "v-s1-fast-128", [0, 3000, 6000], [0.5, 0.09, 0.08], 50.0, 2)
    run = tmp_path / "h200" / "recipe" / "plateau-128-2026-01-02"
    _run(run / "v-s2-fast-128", [0, 1500, 3000, 4500], [0.5, 0.085, 0.0795, 0.0792], 60.0, 4, clock=0.07)
    (run / "logs").mkdir()
    (run / "logs" / "times.txt").write_text("train128 100.0\ntrain128-rc0 700.5\n")
    (run / "run.json").write_text(json.dumps({"kind": "recipe-plateau", "date": "2026-01-02", "gpu": "H200",
                                              "machine": "m", "commits": {}, "changed": "c", "kept": "k",
                                              "target": {"heldout": 0.08, "best_before": 0.08},
                                              "arms": {"v-s2-fast-128": {"stamps": ["train128", "train128-rc"],
                                                                         "flags": "--nproc 4 --grad-accum 1"}}}))
    c = recipe.big_curves(tmp_path)
    r = recipe.big_records(c, recipe.plateau_target(tmp_path, ["h200"])).set_index("run")
    assert r.loc["v-s1-fast-128", "recipe"] == recipe.PAPER_AT_BOOK_RATE and r.loc["v-s1-fast-128", "GPUs"] == 2
    assert r.loc["v-s1-fast-128", "step at target"] == 6000 and r.loc["v-s1-fast-128", "levelled"] == "no"  # fell 11 %
    assert r.loc["v-s1-fast-128", "minutes at target"] == pytest.approx(6000 * 51.0 / 60_000)  # the median interval
    assert r.loc["v-s2-fast-128", "step at target"] == 3000 and r.loc["v-s2-fast-128", "levelled"] == "yes"
    assert r.loc["v-s2-fast-128", "GPUs"] == 4 and r.loc["v-s2-fast-128", "final loss"] == pytest.approx(0.0792)
    assert r.loc["v-s2-fast-128", "wall at target (min)"] == pytest.approx((3000 * 0.07 + 30.0) / 60)  # clock + ready
    assert math.isnan(r.loc["v-s1-fast-128", "wall at target (min)"])  # a run that kept no clock
    assert manifests.stage_seconds(run, "train128", "train128-rc") == pytest.approx(600.5)
    assert math.isnan(manifests.stage_seconds(run, "train128", "gate128-rc"))
    state = recipe.plateau_state(tmp_path, ["h200"]).set_index("what")
    assert state.iloc[1]["met"] == "yes" and state.iloc[2]["met"] == "yes" and len(state) == 3  # no anatomy rows here
    assert recipe.plateau_state(tmp_path, ["h100"]).empty and math.isnan(recipe.plateau_target(tmp_path, ["h100"]))


def test_each_number_of_gpus_keeps_its_newest_plateau_run_judged_at_its_lowest_loss(tmp_path):
    """recipe.plateaus / plateau_state: the newest recipe-plateau run per GPU count, most GPUs first; a run whose loss
    rose after its lowest is judged at that lowest (best.pt's); the issue's minutes bind 4 GPUs, none bind 1."""
    from medddpm.report import headline, recipe

    base = {"kind": "recipe-plateau", "gpu": "H200", "machine": "m", "commits": {}, "changed": "c", "kept": "k",
            "target": {"heldout": 0.08, "best_before": 0.079}}
    for name, date, gpus, losses in (("four", "2026-01-02", 4, [0.5, 0.085, 0.0795, 0.0792]),
                                     ("old1", "2026-01-01", 1, [0.5, 0.09, 0.085, 0.084]),
                                     ("one", "2026-01-03", 1, [0.5, 0.082, 0.0775, 0.0781])):
        run = tmp_path / "h200" / "recipe" / f"{name}-2026"
        _run(run / f"v-{name}-128", [0, 1500, 3000, 4500], losses, 60.0, gpus, clock=0.08)
        (run / "logs").mkdir()
        (run / "logs" / "times.txt").write_text("t 100.0\nt-rc0 400.0\n")
        (run / "run.json").write_text(json.dumps({**base, "date": date, "gpus": gpus,
                                                  "arms": {f"v-{name}-128": {"stamps": ["t", "t-rc"],
                                                                             "flags": f"--nproc {gpus} --grad-accum 1"
                                                                                      + (" --lr 1e-4" if name == "old1" else "")}}}))
    assert [p["name"] for p in recipe.plateaus(tmp_path, ["h200"])] == ["v-four-128", "v-one-128"]
    assert recipe.plateaus(tmp_path, ["h200"])[1]["seeds"] == []  # old1 ran another command: superseded, not a seed
    state = recipe.plateau_state(tmp_path, ["h200"])
    one = state[state["run"] == "v-one-128"].reset_index(drop=True)
    assert list(one["met"]) == ["—", "—", "yes"] and one.loc[2, "measured"] == "0.0775"  # not the last, 0.0781
    assert "at step 3,000" in one.loc[2, "what"] and one.loc[0, "target"].startswith("—")
    four = state[state["run"] == "v-four-128"].reset_index(drop=True)
    assert list(four["target"][:2]) == ["≤ 4 min", "≤ 12 min"] and four.loc[1, "met"] == "yes"  # 5 min, levelled
    assert four.loc[0, "met"] == "no"  # the target at 3,000 steps × 0.08 s plus 30 s ready: 4.5 min
    assert recipe.plateau_target(tmp_path, ["h200"]) == 0.08
    # a newer run on one GPU at global batch 4 (4 GPUs' update emulated): kept beside the batch-1 run, its minutes
    # projected at the manifest's step and said so, and never a record of the GPUs it ran on
    run = tmp_path / "h200" / "recipe" / "emul-2026"
    _run(run / "v-emul-128", [0, 1500, 3000, 4500], [0.5, 0.079, 0.0776, 0.0779], 240.0, 1, clock=0.24)
    (run / "run.json").write_text(json.dumps({**base, "date": "2026-01-04", "gpus": 1, "emulates": 4,
                                              "target": {**base["target"], "projection_ms": 60.0},
                                              "arms": {"v-emul-128": {"stamps": ["t", "t-rc"],
                                                                      "flags": "--nproc 1 --grad-accum 4"}}}))
    assert [p["name"] for p in recipe.plateaus(tmp_path, ["h200"])] == ["v-four-128", "v-emul-128", "v-one-128"]  # by GPUs, then batch
    state = recipe.plateau_state(tmp_path, ["h200"])
    emul = state[state["run"] == "v-emul-128"].reset_index(drop=True)
    assert list(emul["met"]) == ["projected yes", "projected yes", "yes"]  # 1,500 × 60 ms = 1.5 min; 4,500: 4.5 min
    assert emul.loc[0, "measured"].startswith("1.5 min of steps") and "projection" in emul.loc[0, "measured"]
    assert list(emul["target"][:2]) == ["≤ 4 min", "≤ 12 min"]
    r = recipe.big_records(recipe.big_curves(tmp_path), 0.08)
    assert r.set_index("run").loc["v-emul-128", "global batch"] == 4
    assert list(recipe.records_128(r, 1)["run"]) == ["h200/recipe/one-2026/v-one-128"]  # the batch-4 run holds none
    assert recipe.plateaus(tmp_path, ["h200"])[0]["name"] == "v-four-128"
    # 2 GPUs' update emulated (train's default two volumes a step): its own row, judged by the doubled 2-GPU minutes
    run = tmp_path / "h200" / "recipe" / "emul2-2026"
    _run(run / "v-emul2-128", [0, 1500, 3000, 4500], [0.5, 0.085, 0.0799, 0.0790], 120.0, 1, clock=0.12)
    (run / "run.json").write_text(json.dumps({**base, "date": "2026-01-05", "gpus": 1, "emulates": 2,
                                              "target": {**base["target"], "projection_ms": 60.0},
                                              "arms": {"v-emul2-128": {"stamps": ["t", "t-rc"], "flags": "--nproc 1"}}}))
    assert [p["name"] for p in recipe.plateaus(tmp_path, ["h200"])] == ["v-four-128", "v-emul-128", "v-emul2-128", "v-one-128"]
    emul2 = recipe.plateau_state(tmp_path, ["h200"]).query("run == 'v-emul2-128'").reset_index(drop=True)
    assert list(emul2["target"][:2]) == ["≤ 8 min", "≤ 24 min"] and emul2.loc[0, "measured"].startswith("3.0 min")
    assert list(emul2["met"]) == ["projected yes", "projected no", "no"]  # fell 1.1 % at the end: not levelled; 0.0790 ≥ 0.079
    # the same command on another seed, older: read beside the newest (its own rows), in the table and the headline
    run = tmp_path / "h200" / "recipe" / "emul2b-2026"
    _run(run / "v-emul2b-128", [0, 1500, 3000, 4500], [0.5, 0.081, 0.0785, 0.0784], 120.0, 1, clock=0.12)
    (run / "run.json").write_text(json.dumps({**base, "date": "2026-01-05", "gpus": 1, "emulates": 2,
                                              "target": {**base["target"], "projection_ms": 60.0},
                                              "arms": {"v-emul2b-128": {"stamps": ["t", "t-rc"], "flags": "--nproc 1 --seed 7"}}}))
    found = {p["name"]: p for p in recipe.plateaus(tmp_path, ["h200"])}
    assert list(found) == ["v-four-128", "v-emul-128", "v-emul2b-128", "v-one-128"]  # emul2b- sorts after emul2-: newest
    assert [q["name"] for q in found["v-emul2b-128"]["seeds"]] == ["v-emul2-128"]
    state = recipe.plateau_state(tmp_path, ["h200"])
    assert state.query("run == 'v-emul2b-128'")["met"].tolist() == ["projected yes", "projected yes", "yes"]
    assert state.query("run == 'v-emul2-128'")["met"].tolist() == list(emul2["met"])  # the older seed still judged
    assert "v-emul2-128" not in found and found["v-emul2b-128"]["seeds"][0]["record"]["lowest loss"] == 0.0790
    lines = headline.recipe_line(tmp_path, ["h200"], lambda n, name: n)
    (two,) = [line for line in lines if "on 2 GPUs" in line]
    assert "lowest held-out loss 0.0784 at step 4,500 (seed 7; the same command on seed 0: 3,000 steps, lowest 0.0790)" in two
    assert not any("the same command" in line for line in lines if line != two)


def _plateau(root, name, date, gpus, flags, losses, clock, emulates=None):
    """A recipe-plateau run of one arm ``v-<name>-128`` on ``gpus`` ranks (its update ``emulates`` more: projected)."""
    run = root / "h200" / "recipe" / f"{name}-2026"
    _run(run / f"v-{name}-128", [0, 1500, 3000, 4500], losses, 1000 * clock, gpus, clock=clock)
    (run / "logs").mkdir()
    (run / "logs" / "times.txt").write_text("t 100.0\nt-rc0 400.0\n")
    target = {"heldout": 0.08, "best_before": 0.079, **({"projection_ms": 60.0} if emulates else {})}
    (run / "run.json").write_text(json.dumps({"kind": "recipe-plateau", "gpu": "H200", "machine": "m", "commits": {},
                                              "changed": "c", "kept": "k", "target": target, "date": date, "gpus": gpus,
                                              **({"emulates": emulates} if emulates else {}),
                                              "arms": {f"v-{name}-128": {"stamps": ["t", "t-rc"], "flags": flags}}}))


def test_a_measured_multi_gpu_plateau_reads_its_seeds_and_checks_the_projection_of_its_update(tmp_path):
    """recipe.shared_flags / same_update / records_128 and headline.recipe_line: the post-hoc EMA's snapshot flags
    leave a command the same across seeds; a day's seeds of one change are one record row; a projection names the
    measured run of its own update on those GPUs, never another recipe's; the command's own seeds are not told as
    a faster run."""
    from medddpm.report import headline, recipe

    assert recipe.shared_flags("--steps 6 --seed 3 --posthoc-ema 0.05 0.10 --posthoc-every 1000 --quiet") == "--steps 6 --quiet"
    assert recipe.same_update("--nproc 1 --grad-accum 2 --lr 1 (one GPU)", "--nproc 2 --grad-accum 1 --lr 1 (DDP)")
    assert not recipe.same_update("--nproc 1 --grad-accum 2 --lr 1", "--nproc 2 --grad-accum 1 --lr 2")
    ddp = "--nproc 2 --grad-accum 1 --steps 4500"
    _plateau(tmp_path, "a", "2026-01-05", 2, ddp + " --seed 1 --posthoc-ema 0.05 --posthoc-every 1000",
             [0.5, 0.085, 0.0790, 0.0789], 0.05)
    _plateau(tmp_path, "b", "2026-01-05", 2, ddp + " --seed 2", [0.5, 0.083, 0.0795, 0.0792], 0.05)  # newest: b- > a-
    _plateau(tmp_path, "e2", "2026-01-04", 1, "--nproc 1 --grad-accum 2 --steps 4500", [0.5, 0.085, 0.0790, 0.0789],
             0.12, emulates=2)
    _plateau(tmp_path, "four", "2026-01-04", 4, "--nproc 4 --grad-accum 1 --lr 1e-4", [0.5, 0.085, 0.0790, 0.0789], 0.05)
    _plateau(tmp_path, "e4", "2026-01-04", 1, "--nproc 1 --grad-accum 4", [0.5, 0.079, 0.0785, 0.0784], 0.24, emulates=4)
    found = {p["name"]: p for p in recipe.plateaus(tmp_path, ["h200"])}
    assert [q["name"] for q in found["v-b-128"]["seeds"]] == ["v-a-128"]  # a's snapshots do not make it another command
    assert found["v-e2-128"]["measured"]["name"] == "v-b-128" and found["v-e4-128"]["measured"] is None
    state = recipe.plateau_state(tmp_path, ["h200"])
    a = state.query("run == 'v-a-128'").reset_index(drop=True)
    assert a["met"].tolist() == ["yes", "yes", "yes"]  # judged beside b, not dropped
    assert "this seed" in a.loc[0, "what"] and a.loc[0, "from"] == "h200/recipe/a-2026/v-a-128"  # its own time
    table = recipe.records_128(recipe.big_records(recipe.big_curves(tmp_path), 0.08), 2)
    assert list(table["run"]) == ["h200/recipe/a-2026/v-a-128"] and table["seeds"].tolist() == [2]  # one row, its fastest
    lines = headline.recipe_line(tmp_path, ["h200"], lambda n, name: n)
    (two,) = [line for line in lines if line.startswith("- Projected at 128³ on 2 GPUs")]
    assert "a projection; on 2 × h200 the same update took 3,000 steps, 2.5 min of steps at 51.0 ms" in two.lower()
    (four,) = [line for line in lines if line.startswith("- Projected at 128³ on 4 GPUs")]
    assert "no run on 4 GPUs measured it" in four  # the 4-GPU run trained another recipe
    (b,) = [line for line in lines if "on ixi (2 × h200" in line.lower()]  # the GPU's name, registered or not
    assert "(seed 2; the same command on seed 1: 3,000 steps, 3.0 min, lowest 0.0789)" in b
    assert not any(line.startswith("- Fastest to that loss at 128³ (2 GPUs)") for line in lines)  # a is b's seed
    # the same GPUs at two volumes each (global batch 4, slower to the target): its rows time itself, and the fastest
    # run on those GPUs, told on a line of its own already, is not told again as faster
    _plateau(tmp_path, "b4", "2026-01-05", 2, "--nproc 2 --grad-accum 2 --steps 4500 --seed 3",
             [0.5, 0.085, 0.0790, 0.0789], 0.1)
    assert [p["name"] for p in recipe.plateaus(tmp_path, ["h200"])] == ["v-four-128", "v-b4-128", "v-b-128", "v-e4-128",
                                                                          "v-e2-128"]
    b4 = recipe.plateau_state(tmp_path, ["h200"]).query("run == 'v-b4-128'").reset_index(drop=True)
    assert "this run" in b4.loc[0, "what"] and b4.loc[0, "from"] == "h200/recipe/b4-2026/v-b4-128"
    assert b4.loc[0, "measured"].startswith("5.5 min")  # 3,000 steps × 0.1 s + 30 s ready: its own, not a's 3.0
    lines = headline.recipe_line(tmp_path, ["h200"], lambda n, name: n)
    assert sum("on IXI (2 × " in line for line in lines) == 2
    assert not any(line.startswith("- Fastest to that loss at 128³ (2 GPUs)") for line in lines)
    # a curriculum A/B on those GPUs, two seeds of one command, sooner to the target than every plateau run there: told
    # once, after the GPUs' last line, with its other seed's minutes, only where its judged samples met chapter 14's
    # targets (a headline quotes only what passed its quality check)
    ab = tmp_path / "h200" / "recipe" / "cur-128-2026"
    for seed, (mid, end) in ((5, (0.0799, 0.0790)), (6, (0.0815, 0.0810))):  # c6 never reaches 0.08
        _run(ab / f"c{seed}", [0, 1500, 3000, 4500], [0.5, 0.09, mid, end], 50.0, 2, clock=0.02)
    pd.DataFrame({"run": ["real", "template", "ddpm250:fast"], "brain_corr": [1.0, 0.7, 0.81], "region_corr": 0.9,
                  "hist_w1": 0.05, "background_gap": 0.0, "background_seed_spread_max": 0.0, "ssim_between_seeds": 0.8,
                  "step": 4500}).to_csv(ab / "c5" / "anatomy_summary.csv", index=False)
    (ab / "run.json").write_text(json.dumps({"kind": "recipe-ab", "date": "2026-01-06", "gpu": "H200", "machine": "m",
                                             "commits": {}, "changed": "c", "kept": "k", "size": 128, "arms": {
        f"c{s}": {"flags": f"--nproc 2 --grad-accum 1 --patch-size 64 --patch-steps 1000 --seed {s}", "label": "cubes"}
        for s in (5, 6)}}))
    def fastest_two() -> list[int]:
        lines[:] = headline.recipe_line(tmp_path, ["h200"], lambda n, name: n)
        return [i for i, line in enumerate(lines) if line.startswith("- Fastest to that loss at 128³ (2 GPUs)")]

    assert fastest_two() == []  # in-brain r 0.81 < 0.82: not quoted
    summary = pd.read_csv(ab / "c5" / "anatomy_summary.csv")
    summary.assign(brain_corr=[1.0, 0.7, 0.85]).to_csv(ab / "c5" / "anatomy_summary.csv", index=False)
    fastest = fastest_two()
    assert len(fastest) == 1 and "(seed 2; the same command on seed 1" in lines[fastest[0] - 1]  # after b's, not b4's
    assert "1.5 min from `train`'s start" in lines[fastest[0]]  # c5: 3,000 steps × 0.02 s + 30 s ready
    assert "the fastest of 2 seeds of the same command, the other not reached" in lines[fastest[0]]
    assert "DDPM 250's samples within chapter 14's targets" in lines[fastest[0]]
    summary.assign(brain_corr=[1.0, 0.7, 0.85], background_gap=[0.0, 0.0, 0.08]).to_csv(ab / "c5" / "anatomy_summary.csv", index=False)
    assert fastest_two() == []  # the background 0.08 from the scans': not quoted either


def test_a_128_recipe_ab_times_each_curriculum_phase_at_its_own_step_and_the_fastest_run_leads(tmp_path):
    """recipe.big_curves / record_128 / ab_runs: a 128³ recipe A/B's arms join the 128³ runs under their labels, a
    curriculum's minutes count its patch steps at the patch step's pace, the fastest run on the GPUs to the target
    leads chapter 17's table, and the 64³ readers never take a 128³ A/B for theirs."""
    from medddpm.report import recipe

    base = {"kind": "recipe-ab", "date": "2026-01-03", "gpu": "H200", "machine": "m", "commits": {}, "changed": "c",
            "kept": "k", "target": {"heldout": 0.08}}
    ab = tmp_path / "h200" / "recipe" / "patch-128-2026-01-03"
    _run(ab / "whole", [0, 1000], [0.5, 0.09], 50.0, 4, clock=0.05)
    _run(ab / "cubes", [0, 500, 1000], [0.5, 0.1, 0.079], 50.0, 4, clock=0.03)
    pd.DataFrame({"step_from": [0, 1, 250, 500, 501, 750], "step_to": [1, 250, 500, 501, 750, 1000],
                  "ms_per_step": [9e4, 10.0, 10.0, 7e3, 50.0, 50.0]}).to_csv(ab / "cubes" / "timing.csv", index=False)
    (ab / "run.json").write_text(json.dumps({**base, "size": 128, "arms": {
        "whole": {"flags": "--steps 1000 --nproc 4 --grad-accum 1", "label": "whole volumes"},
        "cubes": {"flags": "--steps 1000 --patch-size 64 --patch-steps 500 --nproc 4 --grad-accum 1", "label": "cubes first",
                  "after_reading": True}}}))
    r = recipe.big_records(recipe.big_curves(tmp_path), 0.08).set_index("run")
    assert list(r["declared"]) == [False, True]  # an arm added after reading the others says so (cubes, whole)
    assert r.loc["cubes", "recipe"] == "cubes first" and r.loc["cubes", "folder"] == "h200/recipe/patch-128-2026-01-03/cubes"
    assert r.loc["cubes", "minutes at target"] == pytest.approx((500 * 10.0 + 500 * 50.0) / 60_000)  # not 1000 × 50 ms
    assert r.loc["cubes", "ms a step"] == 50.0 and math.isnan(r.loc["whole", "step at target"])
    assert recipe.record_128(r, 4).name == "cubes"
    _run(tmp_path / "h100" / "anatomy" / "train" / "v-s9-fast-128", [0, 3000, 6000], [0.5, 0.09, 0.079], 50.0, 4)
    table = recipe.records_128(recipe.big_records(recipe.big_curves(tmp_path), 0.08), 4)
    # chapter 14's undated run first (minutes of steps), then the faster dated one; a run short of the target holds none
    assert list(table["run"]) == ["h100/anatomy/train/v-s9-fast-128", "h200/recipe/patch-128-2026-01-03/cubes"]
    assert list(table["date"]) == ["", "2026-01-03"] and table["minutes to target"].iloc[0] == pytest.approx(6000 * 51 / 60_000)
    assert recipe.newest(tmp_path, ["h200"]) is None and recipe.record_table(tmp_path, ["h200"], 0.08).empty


def test_the_default_recipes_seeds_are_the_runs_whose_recipe_is_todays_default(tmp_path):
    """recipe.default_seeds: an arm whose recipe then, with its --optimizer, has the default's values (cosine with
    Muon is today's muon), and a plateau run's 64³ confirm run of it; Adam's cosine, a rate of its own, or a run whose
    manifest names no recipe are not the default as train runs it."""
    from medddpm.report import recipe

    base = {"date": "2026-01-02", "gpu": "H200", "machine": "m", "commits": {}, "changed": "c", "kept": "k"}
    ab = tmp_path / "h200" / "recipe" / "ab-64-2026-01-02"
    arms = {"d": ("--steps 1000 --seed 3 --optimizer muon", "cosine"), "m": ("--steps 1000 --seed 4", "muon"),
            "adam": ("--steps 1000 --seed 5", "cosine"), "lr": ("--steps 1000 --lr 1e-4 --optimizer muon", "cosine")}
    for arm in arms:
        (ab / arm).mkdir(parents=True)
        pd.DataFrame({"step": [0, 500, 1000], "weights": "ema", "loss": [0.5, 0.2, 0.104]}).to_csv(ab / arm / "heldout.csv",
                                                                                                  index=False)
    (ab / "run.json").write_text(json.dumps({**base, "kind": "recipe-ab", "arms": {
        a: {"flags": f, "recipe_default": r} for a, (f, r) in arms.items()}}))
    pl = tmp_path / "h200" / "recipe" / "plateau-128-2026-01-03"
    for c in ("c", "old"):
        (pl / c).mkdir(parents=True)
        pd.DataFrame({"step": [0, 1000], "weights": "ema", "loss": [0.5, 0.106]}).to_csv(pl / c / "heldout.csv", index=False)
    (pl / "run.json").write_text(json.dumps({**base, "kind": "recipe-plateau", "date": "2026-01-03", "arms": {}, "confirm": {
        "c": {"flags": "--size 64 --steps 1000 --seed 41", "recipe_default": "muon"},
        "old": {"flags": "--size 64 --steps 1000 --seed 42"}, "why": "w"}}))
    t = recipe.default_seeds(tmp_path, ["h200"], 0.105).set_index("seed")
    assert sorted(t.index) == [3, 4, 41] and t.loc[3, "step at target"] == 1000 and math.isnan(t.loc[41, "step at target"])


def test_a_record_reads_beside_its_recipe_on_other_seeds_with_its_judged_samples_and_step_times(tmp_path):
    """recipe.repeats: every arm of the record's flags whatever its seed (another recipe is not one); recipe.samples:
    the arms with an anatomy_summary.csv, the template's row first; recipe.step_times: step128/'s timings."""
    from medddpm.report import recipe

    base = {"kind": "recipe-ab", "gpu": "H200", "machine": "m", "commits": {}, "changed": "c", "kept": "k",
            "target": {"heldout": 0.2}}
    for name, date, arms in (("muon-64-2026-01-01", "2026-01-01", {"m": ("--optimizer muon --steps 30", True)}),
                             ("muon2-64-2026-01-02", "2026-01-02", {"m1": ("--optimizer muon --steps 30 --seed 1", False),
                                                                    "m2": ("--optimizer muon --steps 30 --seed 2", False),
                                                                    "a1": ("--steps 30 --seed 1", False)})):
        run = tmp_path / "h200" / "recipe" / name
        for arm, (flags, after) in arms.items():
            (run / arm).mkdir(parents=True)
            losses = {"m": [0.5, 0.15, 0.15], "m2": [0.5, 0.3, 0.25], "a1": [0.5, 0.3, 0.25]}.get(arm, [0.5, 0.3, 0.15])
            pd.DataFrame({"step": [0, 10, 30], "weights": "ema", "loss": losses, "seconds": [9.0, 2.0, 6.0]}
                         ).to_csv(run / arm / "heldout.csv", index=False)  # m at step 10, m1 at 30, m2 and a1 never
            (run / arm / "stdout.txt").write_text("timing: ready 1.0 s, first step 0.1 s\n")
        (run / "run.json").write_text(json.dumps({**base, "date": date, "arms": {
            arm: {"flags": f, "recipe_default": "cosine", "after_reading": after} for arm, (f, after) in arms.items()}}))
    reps = recipe.repeats(tmp_path, ["h200"], "--optimizer muon --steps 30", 0.2)
    assert list(reps["arm"]) == ["m", "m1", "m2"] and list(reps["seed"]) == [0, 1, 2]
    assert list(reps["declared"]) == [False, True, True] and math.isnan(reps.loc[2, "step at target"])
    assert recipe.samples(tmp_path, ["h200"]).empty  # no arm judged yet
    run = tmp_path / "h200" / "recipe" / "muon2-64-2026-01-02"
    cols = {k: 0.5 for k in recipe.SAMPLE_COLUMNS}
    pd.DataFrame([{"run": "real", **cols, "step": 30}, {"run": "template", **cols, "brain_corr": 0.7, "step": 30},
                  {"run": "ddpm250:fast", **cols, "brain_corr": 0.8, "step": 30}]).to_csv(run / "m1" / "anatomy_summary.csv",
                                                                                         index=False)
    s = recipe.samples(tmp_path, ["h200"])
    assert list(s["arm"]) == ["template", "m1"] and list(s["in-brain r"]) == [0.7, 0.8] and s["sampler"].iloc[1] == "ddpm250:fast"
    assert recipe.step_times(tmp_path, ["h200"]).empty
    (run / "step128").mkdir()
    for opt, ms in (("adam", 49.0), ("muon", 52.0)):
        pd.DataFrame({"step_from": [0, 1, 50], "step_to": [1, 50, 100], "ms_per_step": [9e4, ms, ms + 1]}).to_csv(
            run / "step128" / f"{opt}-timing.csv", index=False)
    newer = tmp_path / "h200" / "recipe" / "muon3-64-2026-01-03"  # a newer run that timed no step: not the one read
    newer.mkdir()
    (newer / "run.json").write_text(json.dumps({**base, "date": "2026-01-03", "arms": {}}))
    times = recipe.step_times(tmp_path, ["h200"])
    assert times.set_index("optimizer")["ms a step"].to_dict() == {"adam": 49.5, "muon": 52.5}
    assert set(times["run"]) == {"h200/recipe/muon2-64-2026-01-02"}
    # state_64: Med-DDPM's recipe's steps to the target (chapter 14's runs) at the Adam arm's step beside the record
    assert list(recipe.state_64(tmp_path, ["h200"])["measured"].iloc[:2]) == ["never", "—"]  # no paper run: no estimate
    assert set(recipe.state_64(tmp_path, ["h200"])["met"].iloc[2:]) == {"—"}
    paper = tmp_path / "h100" / "anatomy" / "train" / "v-s1-fast"
    paper.mkdir(parents=True)
    pd.DataFrame({"step": [0, 100, 200], "weights": "ema", "loss": [0.5, 0.3, 0.19]}).to_csv(paper / "heldout.csv", index=False)
    pd.DataFrame({"step_from": [0, 1], "step_to": [1, 30], "ms_per_step": [2000.0, 100.0]}).to_csv(run / "a1" / "timing.csv",
                                                                                                   index=False)
    (run / "a1" / "stdout.txt").write_text("timing: ready 3.0 s, first step 2.0 s\n")  # the first step: timing.csv's
    st = recipe.state_64(tmp_path, ["h200"]).set_index("what")["measured"]
    assert st.iloc[0] == "200–200 steps in 1 runs" and st.iloc[1] == "25 s (an estimate)"  # 3 + 2 + 200 × 0.1 s
    t = recipe.state_64(tmp_path, ["h200"])
    assert list(t["measured"].iloc[2:]) == ["7 s", "3 s"] and list(t["met"].iloc[2:]) == ["yes", "yes"]
    assert t["from"].iloc[2].endswith("muon2-64-2026-01-02/m1") and t["from"].iloc[3].endswith("muon-64-2026-01-01/m")


def test_adams_betas_reach_the_optimizer_and_bad_ones_are_refused(phantoms, tmp_path):
    from medddpm.core.config import MODEL_PRESETS, run_config
    from medddpm.data.nifti import pair_files
    from medddpm.data.volumes import VolumeDataset
    from medddpm.train.trainer import Trainer

    assert recipe_config("paper").adam_betas == (0.9, 0.999)  # PyTorch's, which Med-DDPM trains with
    ds = VolumeDataset(pair_files(phantoms / "images", phantoms / "masks"), "tiny", 1, (16, 16, 16))
    cfg = TrainConfig(adam_betas=(0.8, 0.95))
    t = Trainer(ds, MODEL_PRESETS["tiny"], cfg, run_config("baseline"), torch.device("cpu"), tmp_path, (16, 16, 16))
    assert t.optimizer.param_groups[0]["betas"] == (0.8, 0.95)
    for bad in ((0.9, 1.0), (-0.1, 0.9), (0.9,)):
        with pytest.raises(ValueError, match="adam_betas must be two numbers"):
            TrainConfig(adam_betas=bad)


def test_posthoc_widths_read_beside_the_runs_own_ema_at_the_same_step(tmp_path):
    """recipe.posthoc: each row of an arm's posthoc.csv with the EMA's held-out loss at its step (mean over subjects)
    and the difference; an arm without one adds nothing."""
    from medddpm.report import recipe

    run = tmp_path / "h200" / "recipe" / "judge-128-2026-01-02"
    for arm in ("m", "a"):
        (run / arm).mkdir(parents=True)
        pd.DataFrame({"step": [1000, 1000, 2000, 2000], "weights": "ema", "loss": [0.3, 0.1, 0.1, 0.06]}
                     ).to_csv(run / arm / "heldout.csv", index=False)
    pd.DataFrame({"sigma_rel": [0.05, 0.1], "step": [2000, 2000], "snapshots": 2, "heldout_loss": [0.07, 0.09]}
                 ).to_csv(run / "m" / "posthoc.csv", index=False)
    (run / "run.json").write_text(json.dumps({"kind": "recipe-ab", "date": "2026-01-02", "gpu": "H200", "machine": "m",
                                              "commits": {}, "changed": "c", "kept": "k", "arms": {}}))
    t = recipe.posthoc(tmp_path, ["h200"])
    assert list(t["arm"]) == ["m", "m"] and list(t["its EMA's"]) == pytest.approx([0.08, 0.08])
    assert list(t["difference"]) == pytest.approx([-0.01, 0.01]) and set(t["run"]) == {"h200/recipe/judge-128-2026-01-02"}


def test_the_headline_quotes_no_plateau_run_whose_samples_missed_their_targets(tmp_path):
    """headline.recipe_line / recipe.meets_targets: a plateau run whose DDPM 250 samples were judged and missed chapter
    14's targets (here in-brain r < 0.82) has no headline line, chapter 17 keeps it; one that met them, or was not
    judged, has its line. The template of the same masks comes with chapter 14's rows where no A/B arm gave one."""
    from medddpm.report import headline, recipe

    _plateau(tmp_path, "s9-fast", "2026-01-04", 4, "--nproc 4 --grad-accum 1", [0.5, 0.085, 0.0790, 0.0789], 0.05)

    def told() -> bool:
        return any("on IXI (4 × " in line for line in headline.recipe_line(tmp_path, ["h200"], lambda n, name: n))

    assert told()  # not judged
    (tmp_path / "h200" / "anatomy").mkdir()
    summary = pd.DataFrame({"name": "v-s9-fast-128", "split": "val", "run": ["real", "template", "ddpm250:fast"],
                            "step": 4500, "brain_corr": [1.0, 0.7, 0.80], "region_corr": 0.9, "hist_w1": [0.0, 0.08, 0.05],
                            "background_gap": [0.0, 0.0, 0.01], "background_seed_spread_max": [0.0, 0.0, 0.01],
                            "ssim_between_seeds": 0.8})
    summary.to_csv(tmp_path / "h200" / "anatomy" / "anatomy_summary.csv", index=False)
    verdicts = recipe.meets_targets(recipe.samples(tmp_path, ["h200"], 128).set_index("arm"))
    assert verdicts.to_dict() == {"v-s9-fast-128": False} and not told()
    summary.assign(brain_corr=[1.0, 0.7, 0.83]).to_csv(tmp_path / "h200" / "anatomy" / "anatomy_summary.csv", index=False)
    assert told()
    summary.assign(brain_corr=[1.0, 0.7, 0.83], hist_w1=[0.0, 0.08, 0.09]).to_csv(
        tmp_path / "h200" / "anatomy" / "anatomy_summary.csv", index=False)
    assert not told()  # W1 above the template's
