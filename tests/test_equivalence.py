"""The sampler equivalence gate (medddpm.sample.equivalence) and its chapter (medddpm.report.equivalence):
two one-sided tests against margins relative to the template, calibrated both ways."""
import numpy as np
import pandas as pd
import pytest

from medddpm.core.errors import InputError
from medddpm.sample.equivalence import (MEASURES, Arm, calibration, detects, interval, judge, judge_all, margins,
                                        subject_means)
from medddpm.sample.gate import GateRun

REF = "ddpm250:fast"
SUBJECTS = [f"IXI{i:03d}" for i in range(12)]


def tables(shift: dict[str, dict[str, float]], seeds: int = 8, noise: float = 0.004, seed: int = 0):
    """(samples, diversity) of REF on seeds 0..2k-1 and of each run in ``shift`` on seeds k..2k-1:
    per subject a level of its own, per sample that level + the run's shift + noise; the template
    0.1 below the reference in r and W1 0.06 above, so the relative margins are 0.005 and 0.003."""
    rng = np.random.default_rng(seed)
    level = {m: rng.normal(0.8 if m == "brain_corr" else 0.05, 0.02, len(SUBJECTS)) for m in MEASURES}
    rows, div = [], []
    runs = {REF: (range(2 * seeds), {})} | {r: (range(seeds, 2 * seeds), s) for r, s in shift.items()}
    for i, subject in enumerate(SUBJECTS):
        rows.append({"run": "template", "seed": 0, "subject": subject, "brain_corr": level["brain_corr"][i] - 0.1,
                     "region_corr": level["region_corr"][i] - 0.1, "hist_w1": level["hist_w1"][i] + 0.06,
                     "background_mean": 0.0})
        rows.append({"run": "real", "seed": 0, "subject": subject, **{m: 0.0 for m in MEASURES[:-1]}})
        for run, (ids, s) in runs.items():
            for k in ids:
                rows.append({"run": run, "seed": k, "subject": subject,
                             **{m: level[m][i] + s.get(m, 0.0) + rng.normal(0, noise) for m in MEASURES[:-1]}})
            for a, b in zip(list(ids)[0::2], list(ids)[1::2]):
                div.append({"run": run, "subject": subject, "seed_a": a, "seed_b": b,
                            "ssim_between_seeds": 0.6 + s.get("ssim_between_seeds", 0.0) + rng.normal(0, noise)})
    return pd.DataFrame(rows), pd.DataFrame(div)


def test_margins_are_a_share_of_the_references_gap_to_the_template_or_fixed():
    s, d = tables({})
    m = margins(s, d, Arm(REF, tuple(range(8))))
    assert m["brain_corr"] == pytest.approx(0.005, rel=0.05) and m["hist_w1"] == pytest.approx(0.003, rel=0.05)
    assert m["background_mean"] == 0.01 and m["ssim_between_seeds"] == 0.01


def test_the_reference_on_other_seeds_passes_and_a_shifted_sampler_fails():
    s, d = tables({"poor:fast": {"brain_corr": 0.02, "ssim_between_seeds": 0.05}})
    s["run"] = s["run"].replace({"poor:fast": "dpm2m-sde4-logsnr:fast"})
    d["run"] = d["run"].replace({"poor:fast": "dpm2m-sde4-logsnr:fast"})
    ref, again = Arm(REF, tuple(range(8))), Arm(REF, tuple(range(8, 16)))
    cal = calibration(s, d, ref, again, Arm("dpm2m-sde4-logsnr:fast", tuple(range(8, 16))))
    assert cal["works"].all()
    by = cal.set_index(["check", "measure"])
    assert by.loc[("reference on other seeds", "brain_corr"), "verdict"] == "pass"
    assert by.loc[("poor sampler", "brain_corr"), "verdict"] == "fail: brain_corr, ssim_between_seeds"
    assert not by.loc[("poor sampler", "ssim_between_seeds"), "passes"] and by.loc[("poor sampler", "hist_w1"), "passes"]


def test_a_better_sampler_beyond_the_margin_fails_too():
    """Equivalence is two-sided: a sampler whose samples lie closer to the real scans than the
    reference's by more than the margin is not the reference's equal either."""
    s, d = tables({"ddim12:fast": {"brain_corr": +0.02}})
    t = judge_all(s, d, Arm(REF, tuple(range(8))), [Arm("ddim12:fast", tuple(range(8, 16)))])
    assert t["verdict"].iloc[0] == "fail: brain_corr"


def test_the_interval_and_the_smallest_detected_shift():
    mean, low, high, se = interval([0.1, 0.2, 0.3, 0.4])
    assert mean == pytest.approx(0.25) and se == pytest.approx(np.std([0.1, 0.2, 0.3, 0.4], ddof=1) / 2)
    assert high - mean == pytest.approx(mean - low) and high - mean == pytest.approx(2.353363 * se, rel=1e-5)
    assert detects(0.01, 0.01, 16) == 0.0  # the interval is wider than the margin: the gate fails everything
    d = detects(0.01, 0.001, 16)
    assert 0.01 - 1.753 * 0.001 < d < 0.01 and d == pytest.approx(0.01 - 1.7531 * 0.001 + 1.6449 * 0.001, rel=1e-3)
    with pytest.raises(InputError, match="at least 2 subjects"):
        interval([0.1])


def test_bad_arms_are_one_clear_error():
    s, d = tables({})
    with pytest.raises(InputError, match=r"seeds \[99\]"):
        subject_means(s, d, Arm(REF, (0, 99)))
    with pytest.raises(InputError, match="at least 2 seeds"):
        subject_means(s, d, Arm(REF, (0,)))
    with pytest.raises(InputError, match="template"):
        margins(s[s["run"] != "template"], d, Arm(REF, tuple(range(8))))
    lacking = s[~((s["run"] == REF) & (s["subject"] == SUBJECTS[0]) & (s["seed"] >= 8))]
    with pytest.raises(InputError, match="lacks subjects"):
        judge(lacking, d, Arm(REF, tuple(range(8))), Arm(REF, tuple(range(8, 16))), margins(s, d, Arm(REF, tuple(range(8)))))


def test_gate_runs_carry_eta_in_their_spec():
    r = GateRun.parse("dpm2m-sde12-logsnr-eta1.2", "fast", 3)
    assert (r.sampler, r.steps, r.spacing, r.eta) == ("dpm2m-sde", 12, "logsnr", 1.2)
    assert r.spec == "dpm2m-sde12-logsnr-eta1.2" and r.name == "dpm2m-sde12-logsnr-eta1.2-s3-fast"
    assert GateRun.parse("ddim12", "fast").spec == "ddim12" and GateRun.parse("ddim12-eta1.5", "fast").eta == 1.5
    with pytest.raises(InputError, match="only ddim and the -sde solvers"):
        GateRun.parse("dpm2m12-logsnr-eta0.5", "fast")


def test_the_chapters_facts_and_tables_on_a_store_with_and_without_the_gate(tmp_path):
    from medddpm.report import equivalence as report

    s, d = tables({"dpm2m-sde12-logsnr:fast": {"brain_corr": -0.01}, "dpm2m-sde4-logsnr:fast": {"brain_corr": 0.05},
                   "dpm1-sde25-logsnr-eta1.2:fast": {}})
    folder = tmp_path / "h100-80gb-hbm3" / "equivalence"
    folder.mkdir(parents=True)
    s.assign(name="v-s0-fast", step=1000).to_csv(folder / "samples.csv", index=False)
    d.assign(name="v-s0-fast", step=1000).to_csv(folder / "diversity.csv", index=False)
    j = report.judged(tmp_path, "h100-80gb-hbm3")
    assert list(dict.fromkeys(j["role"])) == ["reference, other seeds", "poor sampler", "candidate"]
    assert len(report.intervals(j)) == 4 and len(report.margins(j)) == len(MEASURES)
    assert report.facts(tmp_path, ["h100-80gb-hbm3"])["eq_confirm"].startswith("—")  # no checkpoint after the one that chose
    # a second checkpoint written after, judging the chosen chain alone: a confirmation, not where it was chosen
    s2, d2 = tables({report.candidate_run(): {}, "dpm2m-sde4-logsnr:fast": {"brain_corr": 0.05}})
    s2.assign(name="v-s1-fast", step=2000).to_csv(folder / "samples.csv", mode="a", header=False, index=False)
    d2.assign(name="v-s1-fast", step=2000).to_csv(folder / "diversity.csv", mode="a", header=False, index=False)
    assert report.chosen_on(tmp_path, "h100-80gb-hbm3") == "v-s0-fast"
    assert report.facts(tmp_path, ["h100-80gb-hbm3"])["eq_confirm"].endswith("(v-s1-fast): confirmed")
    # a 128³ checkpoint written last, its reference arms apart on W1 (the calibration's pass case fails): the chapter
    # still judges the newest 64³ one, and the first table says the 128³ gate is not calibrated on W1
    s3, d3 = tables({report.candidate_run(): {"brain_corr": -0.02}, "dpm2m-sde4-logsnr:fast": {"brain_corr": -0.05}})
    s3.loc[(s3["run"] == REF) & (s3["seed"] >= 8), "hist_w1"] += 0.01
    s3.assign(name="v-s13-fast-128", step=3000).to_csv(folder / "samples.csv", mode="a", header=False, index=False)
    d3.assign(name="v-s13-fast-128", step=3000).to_csv(folder / "diversity.csv", mode="a", header=False, index=False)
    assert "fails on v-s13-fast-128: not confirmed" in report.facts(tmp_path, ["h100-80gb-hbm3"])["eq_confirm"]
    assert report.names(tmp_path, "h100-80gb-hbm3") == ["v-s0-fast", "v-s1-fast"]
    assert report.largest(tmp_path, "h100-80gb-hbm3") == "v-s13-fast-128"
    # a newer 128³ checkpoint whose gate is calibrated: the default's W1 lies below DDPM 250's (nearer the
    # scans) by more than the margin, and two-sided equivalence fails it for that too
    s4, d4 = tables({report.candidate_run(): {"hist_w1": -0.01}, "dpm2m-sde4-logsnr:fast": {"brain_corr": -0.05}})
    s4.assign(name="v-s14-fast-128", step=4000).to_csv(folder / "samples.csv", mode="a", header=False, index=False)
    d4.assign(name="v-s14-fast-128", step=4000).to_csv(folder / "diversity.csv", mode="a", header=False, index=False)
    both = report.under_both_rules(tmp_path, "h100-80gb-hbm3")
    t = report.state(both, report.chosen_on(tmp_path, "h100-80gb-hbm3")).set_index("checkpoint")
    assert t.loc["v-s13-fast-128", "calibrated"] == "not on W1" and t.loc["v-s14-fast-128", "calibrated"] == "yes"
    assert t.loc["v-s14-fast-128", "candidate (equivalence)"] == "fail: hist_w1"
    assert report.largest(tmp_path, "h100-80gb-hbm3") == "v-s14-fast-128"
    empty = report.facts(tmp_path, ["h200"])
    assert all(v.startswith("—") for k, v in empty.items() if k not in report.STORE_FREE)
    assert report.judged(tmp_path, None).empty and report.intervals(report.judged(tmp_path, None)).empty


def test_the_packages_default_follows_the_committed_confirmations_of_the_chosen_chain():
    """``sample``'s default on v-prediction checkpoints is the gate's chosen chain (``solvers.CANDIDATE``) only where
    the store confirms it on every checkpoint that took no part in choosing it, else DDPM 250; the chain passed the
    utility test where it was chosen: change one, change the other."""
    from pathlib import Path

    from medddpm.diffusion.solvers import CANDIDATE, REFERENCE, recommended
    from medddpm.report import equivalence as report

    root, gpu = Path(__file__).resolve().parents[1] / "data" / "results", "h100-80gb-hbm3"
    said = report.confirmed(report.under_both_rules(root, gpu), report.chosen_on(root, gpu))
    assert not said.startswith("—")
    assert recommended("v") is (CANDIDATE if said.endswith(": confirmed") else REFERENCE)
    j = report.judged(root, gpu, report.chosen_on(root, gpu))  # where it was chosen, it passed
    assert (j[(j["role"] == "candidate") & (j["run"] == report.label(report.candidate_run()))]["verdict"] == "pass").all()
    u = report.utility(root, gpu)
    mine = u[u["sampler run"] == report.label(report.candidate_run())]
    assert len(mine) == 1 and mine["passes"].all()


def _shifted(per_subject, seed_shift=None, seeds: int = 8):
    """(samples, diversity, margin) with the candidate "cand:fast" moved in brain_corr, subject i by
    ``per_subject[i]`` (all its seeds) and seed k by ``seed_shift[k]`` too; no noise, so the paired differences
    are exactly these shifts."""
    s, d = tables({"cand:fast": {}}, seeds=seeds, noise=0.0)
    ref = Arm(REF, tuple(range(seeds)))
    m = margins(s, d, ref)["brain_corr"]
    cand = s["run"] == "cand:fast"
    s.loc[cand, "brain_corr"] += s.loc[cand, "subject"].map(dict(zip(SUBJECTS, np.asarray(per_subject) * m)))
    if seed_shift is not None:
        s.loc[cand, "brain_corr"] += s.loc[cand, "seed"].map(dict(zip(range(seeds, 2 * seeds), np.asarray(seed_shift) * m)))
    return s, d, ref, Arm("cand:fast", tuple(range(seeds, 2 * seeds))), m


def _brain(s, d, ref, cand):
    return judge_all(s, d, ref, [cand]).set_index("measure").loc["brain_corr"]


@pytest.mark.parametrize("shift,passes", [(0.8, True), (1.2, False), (-0.8, True), (-1.2, False)])
def test_a_shift_inside_the_margin_passes_and_one_beyond_it_fails(shift, passes):
    """Issue 75: synthetic shifts of 0.8 and 1.2 margins, tight across subjects: the gate tells them apart."""
    s, d, ref, cand, _ = _shifted(shift + 0.01 * np.linspace(-1, 1, len(SUBJECTS)))
    assert bool(_brain(s, d, ref, cand)["passes"]) is passes


def test_a_gate_judged_by_its_mean_alone_or_at_an_80_percent_interval_is_caught():
    """Issue 75: the paired differences have a mean of 0.8 margins and a spread that puts the 90 % interval's upper
    end past the margin while the 80 % interval's stays inside: the gate fails it (a |mean| < margin gate, or one
    at 80 %, would pass it), so its level is pinned at 90 %."""
    from scipy.stats import t as student

    n = len(SUBJECTS)
    e = np.linspace(-1, 1, n)
    se_unit = e.std(ddof=1) / np.sqrt(n)  # the standard error of the spread e, in margins
    k = 0.2 / (0.5 * (student.ppf(0.95, n - 1) + student.ppf(0.90, n - 1)) * se_unit)  # 0.8 + t·se straddles 1
    s, d, ref, cand, m = _shifted(0.8 + k * e)
    row = _brain(s, d, ref, cand)
    assert abs(row["difference"]) < m and not row["passes"]
    mean, low80, high80, _ = interval(0.8 * m + k * m * e, alpha=0.10)
    assert high80 < m < row["high"]  # what an 80 % interval would have said, and what the gate's says


def test_one_bad_seed_is_not_hidden_by_a_median_over_seeds():
    """Issue 75: seven of eight seeds equal to the reference, one 10 margins worse: the mean over seeds (1.25
    margins) fails; a median over seeds would pass it."""
    s, d, ref, cand, _ = _shifted(0.01 * np.linspace(-1, 1, len(SUBJECTS)), seed_shift=[0] * 7 + [-10])
    row = _brain(s, d, ref, cand)
    assert row["difference"] == pytest.approx(-1.25 * margins(s, d, ref)["brain_corr"], rel=0.02)
    assert not row["passes"]


@pytest.mark.parametrize("shift,passes,nearer", [(+1.2, True, True), (-0.8, True, False), (-1.2, False, False)])
def test_non_inferiority_passes_a_candidate_nearer_the_scans_and_fails_one_worse_beyond_the_margin(shift, passes,
                                                                                                 nearer):
    """Issue 75's rule, declared before its checkpoints: in-brain r 1.2 margins higher (nearer the scans) passes and
    is said to be nearer, 0.8 margins lower passes, 1.2 margins lower fails; equivalence fails the first."""
    s, d, ref, cand, _ = _shifted(shift + 0.01 * np.linspace(-1, 1, len(SUBJECTS)))
    row = judge_all(s, d, ref, [cand], rule="non-inferiority").set_index("measure").loc["brain_corr"]
    assert (bool(row["passes"]), bool(row["nearer"]), row["rule"]) == (passes, nearer, "non-inferiority")
    assert bool(_brain(s, d, ref, cand)["passes"]) is (abs(shift) < 1)


def test_non_inferiority_judges_the_background_by_its_gap_and_diversity_both_ways():
    """A background farther from the scan's (either side) is worse; SSIM between seeds stays two-sided; the
    calibration holds under the rule (the reference on other seeds passes, a less diverse sampler fails)."""
    s, d = tables({"far:fast": {"background_mean": -0.03}, "near:fast": {"background_mean": -0.001},
                   "poor:fast": {"ssim_between_seeds": 0.05}})
    ref_bg = s[s["run"] == REF].groupby("subject")["background_mean"].mean()
    real = s["run"] == "real"
    s.loc[real, "background_mean"] = s.loc[real, "subject"].map(ref_bg + 0.02)  # each scan 0.02 above its samples
    ref, other = Arm(REF, tuple(range(8))), tuple(range(8, 16))
    t = judge_all(s, d, ref, [Arm("far:fast", other), Arm("near:fast", other)], rule="non-inferiority")
    bg = t[t["measure"] == "background_mean"].set_index("candidate")
    assert bg.loc["far:fast", "difference"] == pytest.approx(0.03, abs=0.003) and not bg.loc["far:fast", "passes"]
    assert bg.loc["near:fast", "passes"]
    cal = calibration(s, d, ref, Arm(REF, other), Arm("poor:fast", other), rule="non-inferiority")
    assert cal["works"].all() and set(cal.loc[cal["measure"] == "ssim_between_seeds", "rule"]) == {"equivalence"}
    with pytest.raises(InputError, match="rule must be one of"):
        judge_all(s, d, ref, [Arm("far:fast", other)], rule="lenient")


def test_the_chapter_opens_on_calibration_and_the_candidates_verdicts_per_checkpoint():
    """Issue 76: chapter 16's first table: whether a checkpoint took part in choosing the candidate (up to the one it
    was chosen on); calibrated only where, under both rules, the reference on other seeds passes and the poor sampler
    fails, else the measures it is not calibrated on; the candidate's verdicts, or that it was not sampled there."""
    from medddpm.report.equivalence import ROLES, candidate_run, label, state

    rows = []
    for name, again, verdict in (("c1", "pass", "pass"), ("c2", "fail: hist_w1", None), ("c3", "pass", "fail: brain_corr")):
        rows += [{"checkpoint": name, "size": 64, "role": ROLES[0], "run": "ddpm", "equivalence": again,
                  "non-inferiority": again},
                 {"checkpoint": name, "size": 64, "role": ROLES[1], "run": "poor", "equivalence": "fail: w",
                  "non-inferiority": "fail: w"}]
        if verdict:
            rows.append({"checkpoint": name, "size": 64, "role": ROLES[2], "run": label(candidate_run()),
                         "equivalence": "fail: hist_w1", "non-inferiority": verdict})
    t = state(pd.DataFrame(rows), "c1").set_index("checkpoint")
    cols = ["chose the candidate", "calibrated", "candidate (equivalence)", "candidate (non-inferiority)"]
    assert tuple(t.loc["c1", cols]) == ("yes", "yes", "fail: hist_w1", "pass")
    assert tuple(t.loc["c2", cols[:3]]) == ("no", "not on W1", "not sampled")
    assert tuple(t.loc["c3", cols]) == ("no", "yes", "fail: hist_w1", "fail: brain_corr")
