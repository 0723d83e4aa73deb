"""Chapter 16, the sampler equivalence gate (issue 62): ``scripts/equivalence.py``'s tables under
``<gpu>/equivalence/`` judged by ``medddpm.sample.equivalence`` — the gate's calibration, every
candidate's intervals against the margins, the segmentation utility per sampler and the seconds
per 128³ volume — as tables, a figure and facts.

The reference run's seeds are split in two halves: the first is the reference arm, the second the
reference again (the calibration's pass case); every other run is a candidate on its own seeds.
The tables may hold several checkpoints (their ``name``): the chapter judges the newest one on which
candidates were chosen (``chosen_on``), quotes the first for what it showed (the solvers' behaviour
with calls and η), and reads every later one as a confirmation of the chosen candidate. A store may hold none of it:
every function returns its full shape then, and every fact reads "—".
"""
from __future__ import annotations

import functools
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..core.errors import InputError
from ..diffusion.solvers import CANDIDATE, REFERENCE
from ..sample.anatomy import REAL, TEMPLATE
from ..sample.equivalence import ABSOLUTE_MARGINS, ALPHA, MEASURES, POWER, RELATIVE_MARGIN, RULES, Arm, judge_all
from ..sample.gate import GateRun
from .anatomy import BASE_SIZE, MEASURE_LABELS, size_of
from .present import gpu_name
from .wording import missing, roles

FOLDER = "equivalence"
REFERENCE_RUN = f"{REFERENCE.sampler}{REFERENCE.steps}:fast"  # the reference arm: DDPM 250 under fast
POOR_SPEC = "dpm2m-sde4-logsnr"  # the deliberately poor sampler of the calibration
UTILITY_FLOOR = 0.99  # issue 62: a sampler's synthetic-trained Dice ≥ 99 % of DDPM 250's
NEARER = {"brain_corr": 1, "region_corr": 1, "hist_w1": -1}  # the sign of a difference that lies nearer the scans
ROLES = ("reference, other seeds", "poor sampler", "candidate")  # the judged arms, in the tables' order
WHAT = "sampler equivalence results (equivalence/)"
STORE_FREE = ("eq_default", "eq_candidate", "eq_reference", "eq_rel_margin", "eq_abs_margin", "eq_interval", "eq_util_floor", "eq_power")  # the gate's rules, whatever the store holds


def equivalence_gpu(root: Path, gpus: list[str]) -> str | None:
    """The GPU whose store holds the equivalence tables (the committed H200 first, then the H100, then any)."""
    return roles([g for g in gpus if (Path(root) / g / FOLDER / "samples.csv").exists()])["ref"]


def _read(root: Path, gpu: str | None, table: str) -> pd.DataFrame:
    path = Path(root) / str(gpu) / FOLDER / f"{table}.csv"
    return pd.read_csv(path) if gpu is not None and path.exists() else pd.DataFrame()


def names(root: Path, gpu: str | None, size: int | None = BASE_SIZE) -> list[str]:
    """The checkpoints the tables judge at volume side ``size`` (None: any), in the order they were
    written (the newest last)."""
    samples = _read(root, gpu, "samples")
    every = list(dict.fromkeys(samples["name"])) if not samples.empty else []
    return [n for n in every if size is None or size_of(n) == size]


def sizes(root: Path, gpu: str | None) -> list[int]:
    """The volume sides beyond ``BASE_SIZE`` that a checkpoint was judged at, smallest first."""
    return sorted({size_of(n) for n in names(root, gpu, None)} - {BASE_SIZE})


def chosen_on(root: Path, gpu: str | None) -> str | None:
    """The newest checkpoint at ``BASE_SIZE`` whose gate judged more than one candidate: where the candidate was
    chosen (None: the store has none)."""
    samples = _read(root, gpu, "samples")
    if samples.empty:
        return None
    cands = samples[~samples["run"].isin([REAL, TEMPLATE, REFERENCE_RUN])
                    & ~samples["run"].str.startswith(POOR_SPEC + ":")].groupby("name")["run"].nunique()
    chosen = [n for n in names(root, gpu) if cands.get(n, 0) > 1]
    return chosen[-1] if chosen else None


def load(root: Path, gpu: str | None, name: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(samples, diversity) of checkpoint ``name`` (default: ``chosen_on``'s, the chapter's)."""
    samples, diversity = _read(root, gpu, "samples"), _read(root, gpu, "diversity")
    name = name or chosen_on(root, gpu)
    if samples.empty or diversity.empty or name is None:
        return pd.DataFrame(), pd.DataFrame()
    return samples[samples["name"] == name], diversity[diversity["name"] == name]


def label(run: str) -> str:
    """'dpm2m-sde12-logsnr-eta1.2:fast' → 'dpm2m-sde 12 logsnr η 1.2 · fast'."""
    spec, config = run.split(":")
    r = GateRun.parse(spec, config)
    eta = f" η {r.eta:g}" if r.eta != GateRun.eta else ""
    return f"{r.sampler} {r.steps}{' ' + r.spacing if r.spacing else ''}{eta} · {config}"


def calls(run: str) -> int:
    """Denoiser calls of one volume of ``run``."""
    spec, config = run.split(":")
    return GateRun.parse(spec, config).steps


def arms(samples: pd.DataFrame) -> tuple[Arm, Arm, list[tuple[str, Arm]]]:
    """The reference arm, the reference again on its other seeds, and every other run as (role, arm)."""
    ref_seeds = sorted(samples.loc[samples["run"] == REFERENCE_RUN, "seed"].unique().tolist())
    if len(ref_seeds) < 4:
        raise InputError(f"{REFERENCE_RUN} needs at least 4 seeds (two arms of 2), got {len(ref_seeds)}")
    half = len(ref_seeds) // 2
    reference, again = Arm(REFERENCE_RUN, tuple(ref_seeds[:half])), Arm(REFERENCE_RUN, tuple(ref_seeds[half:]))
    others = [r for r in samples["run"].unique() if r not in (REAL, TEMPLATE, REFERENCE_RUN)]
    judged = [("poor sampler" if r.split(":")[0] == POOR_SPEC else "candidate",
               Arm(r, tuple(sorted(samples.loc[samples["run"] == r, "seed"].unique().tolist())))) for r in others]
    return reference, again, [("reference, other seeds", again), *judged]


def judged(root: Path, gpu: str | None, name: str | None = None, rule: str = "equivalence") -> pd.DataFrame:
    """``equivalence.judge_all`` of every arm of checkpoint ``name`` (default: the newest) against the
    reference, with its role, label and calls; empty (with those columns) where the store has no
    equivalence tables."""
    samples, diversity = load(root, gpu, name)
    cols = ["role", "run", "calls", "measure", "difference", "low", "high", "margin", "passes", "se", "detects", "verdict"]
    if samples.empty:
        return pd.DataFrame(columns=cols)
    reference, _, rest = arms(samples)
    t = judge_all(samples, diversity, reference, [a for _, a in rest], rule=rule)
    role = {a.label: r for r, a in rest}
    t["role"] = t["candidate_seeds"].map(role)
    t["run"] = [label(r) + (" (other seeds)" if role[c] == ROLES[0] else "") for r, c in zip(t["candidate"], t["candidate_seeds"])]
    t["calls"] = [calls(r) for r in t["candidate"]]
    order = {r: i for i, r in enumerate(ROLES)}
    t = t.sort_values(["role", "calls", "run"], key=lambda c: c.map(order) if c.name == "role" else c, kind="stable")
    return t[cols + ["candidate", "seeds", "subjects", "reference_seeds", "nearer"]].reset_index(drop=True)


def under_both_rules(root: Path, gpu: str | None) -> pd.DataFrame:
    """Every committed checkpoint's arms re-read under both rules (issue 75, declared before its new checkpoints):
    per checkpoint, size and arm, the verdict by equivalence and by non-inferiority, and the quality measures
    whose interval lies below zero (nearer the scans than DDPM 250: what the book may say so of). Judged once per
    version of the tables (``_both``): a chapter, its facts and the headline ask for it several times."""
    files = [Path(root) / str(gpu) / FOLDER / f"{t}.csv" for t in ("samples", "diversity")]
    version = tuple((str(f.resolve()), f.stat().st_mtime_ns, f.stat().st_size) if f.exists() else (str(f), 0, 0)
                    for f in files)
    return _both(str(root), gpu, version).copy()


@functools.lru_cache(maxsize=8)
def _both(root: str, gpu: str | None, version: tuple) -> pd.DataFrame:
    """``under_both_rules`` of one version of the tables (``version``: their paths, modification times and sizes)."""
    root = Path(root)
    rows = []
    for name in names(root, gpu, None):
        by = {rule: judged(root, gpu, name, rule) for rule in RULES}
        ni = by["non-inferiority"]
        for (role, run), g in by["equivalence"].groupby(["role", "run"], sort=False):
            n = ni[(ni["role"] == role) & (ni["run"] == run)]
            rows.append({"checkpoint": name, "size": size_of(name), "role": role, "run": run,
                         "equivalence": g["verdict"].iloc[0], "non-inferiority": n["verdict"].iloc[0],
                         "nearer the scans": ", ".join(MEASURE_LABELS.get(m, m) for m in n.loc[n["nearer"], "measure"])
                         or "—"})
    return pd.DataFrame(rows, columns=["checkpoint", "size", "role", "run", "equivalence", "non-inferiority",
                                       "nearer the scans"])


def intervals(j: pd.DataFrame) -> pd.DataFrame:
    """One row per judged arm: role, run, calls, verdict, and each measure's 'difference [low, high]'."""
    if j.empty:
        return pd.DataFrame(columns=["role", "sampler run", "calls", "verdict", *MEASURE_LABELS.values()])
    text = j.assign(cell=[f"{d:+.4f} [{lo:+.4f}, {hi:+.4f}]" for d, lo, hi in zip(j["difference"], j["low"], j["high"])])
    wide = text.pivot_table(index=["role", "run", "calls", "verdict"], columns="measure", values="cell", aggfunc="first",
                            sort=False).reset_index()
    wide = wide.rename(columns={"run": "sampler run", **MEASURE_LABELS})
    return wide[["role", "sampler run", "calls", "verdict", *MEASURE_LABELS.values()]]


def margins(j: pd.DataFrame) -> pd.DataFrame:
    """Each measure's margin and what the gate resolves at this many subjects and seeds: the standard
    error, the largest shift that can still pass (margin − t·se) and the smallest shift failed with
    95 % probability (``detects``), read from the reference-again arm."""
    cols = ["measure", "margin", "se", "can pass up to", "detects"]
    again = j[j["role"] == "reference, other seeds"] if not j.empty else j
    if again.empty:
        return pd.DataFrame(columns=cols)
    from scipy.stats import t as student

    q = float(student.ppf(0.95, int(again["subjects"].iloc[0]) - 1))
    out = again.assign(**{"can pass up to": (again["margin"] - q * again["se"]).clip(lower=0)})
    return out.assign(measure=out["measure"].map(MEASURE_LABELS))[cols].reset_index(drop=True)


def figure(j: pd.DataFrame):
    """Every arm's interval per measure in units of its margin (the band ±1 passes), fewest calls on top."""
    from .plots import no_data

    if j.empty:
        return no_data(WHAT, "scripts/equivalence.py")
    runs = list(dict.fromkeys(j["run"]))
    fig, axes = plt.subplots(1, len(MEASURES), figsize=(15, 0.32 * len(runs) + 1.6), sharey=True)
    for ax, m in zip(axes, MEASURES):
        sub = j[j["measure"] == m].set_index("run").loc[runs]
        y = np.arange(len(runs))[::-1]
        for yi, (_, r) in zip(y, sub.iterrows()):
            c = "tab:green" if r["passes"] else ("tab:grey" if r["role"] == "poor sampler" else "tab:red")
            lo, hi, d = (r[k] / r["margin"] for k in ("low", "high", "difference"))
            ax.plot([max(lo, -4), min(hi, 4)], [yi, yi], color=c, lw=2.5)
            ax.plot([np.clip(d, -4, 4)], [yi], "o", color=c, ms=3)
        ax.axvspan(-1, 1, color="tab:green", alpha=0.08)
        ax.axvline(0, color="k", lw=0.6)
        ax.set_xlim(-4.2, 4.2)
        ax.set_title(MEASURE_LABELS[m], fontsize=10)
        ax.set_xlabel("difference / margin")
    axes[0].set_yticks(np.arange(len(runs))[::-1], runs, fontsize=8)
    fig.tight_layout()
    return fig


def utility(root: Path, gpu: str | None) -> pd.DataFrame:
    """Per checkpoint and sampler: the mean Dice of the segmenter trained on its samples and of the one
    trained on the real scans beside it, and the synthetic Dice against DDPM 250's on the same
    checkpoint (≥ ``UTILITY_FLOOR`` passes)."""
    u = _read(root, gpu, "utility")
    cols = ["checkpoint", "sampler run", "synthetic Dice", "real Dice", "against DDPM 250", "passes"]
    if u.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for name, part in u.groupby("name", sort=False):
        mean = part.pivot_table(index="sampler", columns="source", values="dice", aggfunc="mean")
        if REFERENCE_RUN not in mean.index:
            continue
        ratio = mean["synthetic"] / mean.loc[REFERENCE_RUN, "synthetic"]
        rows += [{"checkpoint": name, "sampler run": label(r), "synthetic Dice": mean.loc[r, "synthetic"],
                  "real Dice": mean.loc[r, "real"], "against DDPM 250": ratio[r], "passes": bool(ratio[r] >= UTILITY_FLOOR),
                  "calls": calls(r)} for r in mean.index]
    if not rows:
        return pd.DataFrame(columns=cols)
    out = pd.DataFrame(rows)
    return out.sort_values(["checkpoint", "calls"], kind="stable").drop(columns="calls").reset_index(drop=True)


def seconds(root: Path, gpu: str | None) -> pd.DataFrame:
    """Seconds per 128³ volume (batch 1, fast) of each benchmarked sampler, with its denoiser calls."""
    b = _read(root, gpu, "bench")
    cols = ["sampler", "calls", "s / volume", "GPU"]
    if b.empty:
        return pd.DataFrame(columns=cols)
    b = b.sort_values("steps")
    return pd.DataFrame({"sampler": [f"{s} {n}" for s, n in zip(b["sampler"], b["steps"])], "calls": b["steps"].values,
                         "s / volume": b["s_per_volume_median"].values, "GPU": b["gpu"].values})


def _candidate_interval(j: pd.DataFrame, run: str, measure: str) -> str:
    """``_interval`` of candidate ``run`` (its label) on ``measure`` in a ``judged`` table, or "—"."""
    row = j[(j["role"] == "candidate") & (j["run"] == run) & (j["measure"] == measure)]
    return _interval(row.iloc[0]) if len(row) else "—"


def _checkpoint(samples: pd.DataFrame) -> str:
    """'v-s21-fast (step 14,000, training seed 21)' of one checkpoint's samples."""
    row = samples.iloc[0]
    seed = f", training seed {int(row['train_seed'])}" if "train_seed" in samples else ""
    return f"{row['name']} (step {int(row['step']):,}{seed})"


def _interval(row: pd.Series) -> str:
    return f"{row['difference']:+.4f} [{row['low']:+.4f}, {row['high']:+.4f}] against ±{row['margin']:.4f}"


def candidate_run() -> str:
    """The run spec of ``solvers.CANDIDATE`` (the gate's chosen chain) under fast."""
    r = GateRun(CANDIDATE.sampler, CANDIDATE.steps, CANDIDATE.spacing, "fast", eta=CANDIDATE.eta)
    return f"{r.spec}:fast"


def _after(both: pd.DataFrame, chosen: str | None) -> list[str]:
    """The checkpoints of ``under_both_rules`` judged after ``chosen`` (none took part in choosing the candidate);
    none where ``chosen`` is not among them."""
    order = list(dict.fromkeys(both["checkpoint"])) if len(both) else []
    return order[order.index(chosen) + 1:] if chosen in order else []


def confirmations(both: pd.DataFrame, chosen: str | None) -> pd.DataFrame:
    """From ``under_both_rules``: the candidate's verdicts on every checkpoint judged after ``chosen``."""
    cols = ["checkpoint", "size", "equivalence", "non-inferiority"]
    later = both[both["checkpoint"].isin(_after(both, chosen)) & (both["run"] == label(candidate_run()))] if len(both) \
        else pd.DataFrame(columns=cols)
    return later[cols].reset_index(drop=True)


def confirmed(both: pd.DataFrame, chosen: str | None) -> str:
    """One sentence: on how many checkpoints that took no part in choosing it the candidate passes non-inferiority,
    which, and what follows for ``sample``'s default."""
    c = confirmations(both, chosen)
    if c.empty:
        return missing(f"a gate of {CANDIDATE.describe()} on a checkpoint other than the one it was chosen on")
    ok = c["non-inferiority"] == "pass"
    said = (f"it passes non-inferiority on {int(ok.sum())} of the {len(c)} checkpoints that took no part in choosing "
            f"it{' (' + ', '.join(c.loc[ok, 'checkpoint']) + ')' if ok.any() else ''}")
    if ok.all():
        return f"{said}: confirmed"
    return (f"{said} and fails on {', '.join(c.loc[~ok, 'checkpoint'])}: not confirmed, so `sample` runs "
            f"{REFERENCE.sampler.upper()} {REFERENCE.steps} by default and the chain is one option away")


def _verdicts(j: pd.DataFrame) -> pd.DataFrame:
    """Per candidate run label: its verdict, calls and worst bound over margin (max |low|, |high| / margin)."""
    cands = j[j["role"] == "candidate"]
    worst = np.maximum(cands["low"].abs(), cands["high"].abs()) / cands["margin"]
    return cands.assign(worst=worst).groupby("run", sort=False).agg(
        verdict=("verdict", "first"), calls=("calls", "first"), worst=("worst", "max"), candidate=("candidate", "first"))


def _by_eta(j: pd.DataFrame, measure: str, steps: int = 12) -> str:
    """The ``steps``-call second-order chain's difference on ``measure`` at each η judged ('η 1: -0.0051, η 1.3: …')."""
    eta_of = lambda c: GateRun.parse(*c.split(":")).eta  # noqa: E731
    rows = j[(j["role"] == "candidate") & j["candidate"].str.match(rf"dpm2m-sde{steps}-logsnr(-eta[0-9.]+)?:")
             & (j["measure"] == measure)]
    return ", ".join(f"η {eta_of(c):g}: {d:+.4f}" for c, d in
                     sorted(zip(rows["candidate"], rows["difference"]), key=lambda p: eta_of(p[0]))) or "—"


def _runs_like(j: pd.DataFrame, prefix: str) -> str:
    """In-brain r of the solver's η = 1 runs on log-SNR steps, by calls ('12 calls -0.0073, …')."""
    sel = j[(j["role"] == "candidate") & (j["measure"] == "brain_corr")
            & j["candidate"].str.match(rf"{prefix}\d+-logsnr:")].sort_values("calls")
    return ", ".join(f"{c} calls {d:+.4f}" for c, d in zip(sel["calls"], sel["difference"])) or "—"


def largest(root: Path, gpu: str | None) -> str | None:
    """The newest checkpoint judged at the largest size beyond ``BASE_SIZE`` (None: none was)."""
    big = (sizes(root, gpu) or [None])[-1]
    return names(root, gpu, big)[-1] if big else None


def _failed(verdict: str) -> str:
    """'fail: hist_w1, brain_corr' → 'W1, in-brain r'."""
    return ", ".join(MEASURE_LABELS.get(m, m) for m in verdict.removeprefix("fail: ").split(", "))


def _failing(j: pd.DataFrame, run: str) -> str:
    """Each measure candidate ``run`` fails on: its interval, and which side of DDPM 250 it lies on where the whole
    interval does (nearer the scans or farther from them), else that it spans no difference."""
    rows = j[(j["role"] == "candidate") & (j["run"] == run) & ~j["passes"].astype(bool)]
    said = []
    for r in rows.itertuples():
        side = "higher" if r.difference > 0 else "lower"
        sign = NEARER.get(r.measure)
        lo, hi = sorted((sign * r.low, sign * r.high)) if sign is not None else (0.0, 0.0)
        nearer = ("" if sign is None else ", nearer the scans" if lo > 0 else ", farther from the scans" if hi < 0
                  else ", its interval spanning no difference: neither nearer nor farther shown")  # the words follow it
        said.append(f"{MEASURE_LABELS.get(r.measure, r.measure)} {_interval(r._asdict())}: {side} than DDPM 250's{nearer}")
    return "; ".join(said)


def _decision(calibrated: bool, verdict: str | None) -> str:
    """What the gate at a larger size means for ``sample``'s default, from its state and the default's verdict."""
    if verdict is None:
        return missing("the default sampler at this size")
    if not calibrated:
        return ("The table below reads these intervals, but the gate does not decide on the measures the reference "
                "fails against itself: at this size they need more seeds of DDPM 250")
    if verdict == "pass":
        return "So the chain is equivalent to DDPM 250 at this size too"
    return "So at this size the gate does not show the chain equivalent to DDPM 250"


def larger_facts(root: Path, gpu: str | None) -> dict[str, str]:
    """The gate on ``largest``'s checkpoint (prefix ``eq_big_``): its seeds, both calibration checks,
    whether they let it decide, the default's verdict, and W1's margin against what the seeds resolve."""
    keys = ("size", "checkpoint", "seeds", "again", "poor", "state", "default", "default_r", "w1", "failing", "decision")
    name = largest(root, gpu)
    if name is None:
        return {f"eq_big_{k}": missing(f"the gate on a checkpoint beyond {BASE_SIZE}³ (scripts/equivalence.py)")
                for k in keys}
    j = judged(root, gpu, name)
    samples, _ = load(root, gpu, name)
    again, poor = (j[j["role"] == r] for r in ROLES[:2])
    checks = {"the reference on other seeds passes": len(again) and again["verdict"].iloc[0] == "pass",
              "the poor sampler fails": len(poor) and poor["verdict"].iloc[0] != "pass"}
    broken = [k.replace("passes", "fails").replace("the poor sampler fails", "the poor sampler passes")
              for k, ok in checks.items() if not ok]
    mine = label(candidate_run())
    v = _verdicts(j)
    w1 = again.set_index("measure").loc["hist_w1"] if len(again) else None
    verdict = v.loc[mine, "verdict"] if mine in v.index else None
    return {
        "eq_big_failing": _failing(j, mine) if verdict and verdict != "pass" else "—",
        "eq_big_decision": _decision(not broken, verdict),
        "eq_big_size": f"{size_of(name)}³",
        "eq_big_checkpoint": _checkpoint(samples),
        "eq_big_seeds": str(int(j["reference_seeds"].iloc[0])),
        "eq_big_again": (again["verdict"].iloc[0] if again["verdict"].iloc[0] == "pass"
                         else f"fails on {_failed(again['verdict'].iloc[0])}") if len(again) else missing("the reference's second arm"),
        "eq_big_poor": (f"{label(poor['candidate'].iloc[0])} "
                        f"{'passes' if poor['verdict'].iloc[0] == 'pass' else 'fails on ' + _failed(poor['verdict'].iloc[0])}")
                       if len(poor) else missing("poor sampler run"),
        "eq_big_state": ("calibrated: its verdicts decide" if not broken else
                         f"not calibrated ({'; '.join(broken)}): at this many seeds it decides nothing"),
        "eq_big_default": (("passes" if v.loc[mine, "verdict"] == "pass" else f"fails on {_failed(v.loc[mine, 'verdict'])}")
                           if mine in v.index else missing(f"{mine} at this size")),
        "eq_big_default_r": _candidate_interval(j, mine, "brain_corr"),
        "eq_big_w1": (f"{_interval(w1)}; the smallest shift it fails with {100 * POWER:g} % probability is "
                      f"{w1['detects']:.4f}" if w1 is not None else missing("the reference's second arm")),
    }


def facts(root: Path, gpus: list[str]) -> dict[str, str]:
    """The section's glued facts (prefix ``eq_``): the newest checkpoint's gate, the first one's
    exploration (the solvers against calls and η), the utility per checkpoint."""
    gpu = equivalence_gpu(root, gpus)
    j = judged(root, gpu)
    keys = ("gpu", "checkpoint", "subjects", "ref_seeds", "cand_seeds", "margin_r", "margin_region", "margin_w1",
            "again", "poor", "detects_r", "detects_ssim", "candidates", "passing", "nearest", "eta_r", "eta_ssim",
            "calls", "util", "seconds", "first", "first_chain_r", "first_sde2_r", "first_sde1_r", "first_eta_r",
            "first_eta_ssim", "candidate_verdict", "candidate_r", "candidate_region", "candidate_util", "confirm")
    rules = {"eq_default": f"{REFERENCE.describe()} ({REFERENCE.steps} denoiser calls)",  # the package's, whatever the store
             "eq_candidate": f"{CANDIDATE.describe()} ({CANDIDATE.steps} denoiser calls)",
             "eq_reference": f"{REFERENCE.sampler.upper()} {REFERENCE.steps}",
             "eq_rel_margin": f"{100 * RELATIVE_MARGIN:g} %", "eq_abs_margin": ", ".join(sorted({f"{v:g}" for v in ABSOLUTE_MARGINS.values()})),
             "eq_interval": f"{100 * (1 - 2 * ALPHA):g} %", "eq_util_floor": f"{100 * UTILITY_FLOOR:g} %",
             "eq_power": f"{100 * POWER:g} %"}
    big = larger_facts(root, gpu)
    if j.empty:
        return {**{f"eq_{k}": missing(WHAT) for k in keys}, **rules, **big}
    samples, _ = load(root, gpu)
    every = names(root, gpu)
    first = judged(root, gpu, every[0])
    again = j[j["role"] == "reference, other seeds"].set_index("measure")
    cands = j[j["role"] == "candidate"]
    verdicts = _verdicts(j)
    passing = verdicts[verdicts["verdict"] == "pass"].sort_values(["calls", "worst"])
    nearest_run = verdicts["worst"].idxmin() if len(verdicts) else None
    mine = label(candidate_run())

    util, secs = utility(root, gpu), seconds(root, gpu)
    poor = j[j["role"] == "poor sampler"]
    mine_util = util[util["sampler run"] == mine]
    first_samples, _ = load(root, gpu, every[0])
    return {
        "eq_gpu": gpu_name(gpu),
        "eq_checkpoint": _checkpoint(samples),
        "eq_first": _checkpoint(first_samples) if len(every) > 1 else "the same checkpoint",
        "eq_subjects": str(int(j["subjects"].iloc[0])),
        "eq_ref_seeds": str(int(j["reference_seeds"].iloc[0])),
        "eq_cand_seeds": str(int(cands["seeds"].min())) if len(cands) else "—",
        "eq_margin_r": f"{again.loc['brain_corr', 'margin']:.4f}",
        "eq_margin_region": f"{again.loc['region_corr', 'margin']:.4f}",
        "eq_margin_w1": f"{again.loc['hist_w1', 'margin']:.4f}",
        "eq_again": f"{again['verdict'].iloc[0]} (in-brain r {_interval(again.loc['brain_corr'])})",
        "eq_poor": (f"{label(poor['candidate'].iloc[0])}: {poor['verdict'].iloc[0]} (in-brain r "
                    f"{_interval(poor.set_index('measure').loc['brain_corr'])})") if len(poor) else missing("poor sampler run"),
        "eq_detects_r": f"{again.loc['brain_corr', 'detects']:.4f}",
        "eq_detects_ssim": f"{again.loc['ssim_between_seeds', 'detects']:.4f}",
        "eq_candidates": str(len(verdicts)),
        "eq_passing": ", ".join(f"{r} ({c} calls)" for r, c in passing["calls"].items()) or "none",
        "eq_nearest": (f"{nearest_run}: {verdicts.loc[nearest_run, 'verdict']}; its widest bound "
                       f"{verdicts.loc[nearest_run, 'worst']:.2f} of its margin" if nearest_run else "—"),
        "eq_eta_r": _by_eta(j, "brain_corr"),
        "eq_eta_ssim": _by_eta(j, "ssim_between_seeds"),
        "eq_calls": f"{j['calls'].min()} to {cands['calls'].max() if len(cands) else j['calls'].max()}",
        "eq_confirm": confirmed(under_both_rules(root, gpu), chosen_on(root, gpu)),
        "eq_candidate_verdict": (f"{verdicts.loc[mine, 'verdict']} (widest bound {verdicts.loc[mine, 'worst']:.2f} of its "
                               "margin)") if mine in verdicts.index else missing(f"{mine} in the chosen checkpoint's runs"),
        "eq_candidate_r": _candidate_interval(j, mine, "brain_corr"),
        "eq_candidate_region": _candidate_interval(j, mine, "region_corr"),
        "eq_candidate_util": ("; ".join(f"{r['synthetic Dice']:.3f} against DDPM 250's on {r['checkpoint']}, "
                                      f"{100 * r['against DDPM 250']:.1f} %" for _, r in mine_util.iterrows())
                            or missing(f"a utility row of {mine}")),
        "eq_first_chain_r": _candidate_interval(first, label("dpm2m-sde12-logsnr:fast"), "brain_corr"),
        "eq_first_sde2_r": _runs_like(first, "dpm2m-sde"),
        "eq_first_sde1_r": _runs_like(first, "dpm1-sde"),
        "eq_first_eta_r": _by_eta(first, "brain_corr"),
        "eq_first_eta_ssim": _by_eta(first, "ssim_between_seeds"),
        "eq_util": "; ".join(f"{r['checkpoint']}, {r['sampler run']} {r['synthetic Dice']:.3f} "
                             f"({100 * r['against DDPM 250']:.1f} %)" for _, r in util.iterrows())
                   or missing("utility rows (equivalence/utility.csv)"),
        "eq_seconds": "; ".join(f"{r['sampler']} {r['s / volume']:.3g} s" for _, r in secs.iterrows())
                      or missing("128³ timings (equivalence/bench.csv)"),
        **rules,
        **big,
    }


def state(both: pd.DataFrame, chosen: str | None) -> pd.DataFrame:
    """Chapter 16's first table, from ``under_both_rules``: per committed checkpoint, whether it took part in choosing
    the candidate (up to ``chosen``), the measures on which its gate is not calibrated (the reference on other seeds
    fails, or the poor sampler passes, under either rule), and the candidate's verdicts."""
    cols = ["checkpoint", "size", "chose the candidate", "calibrated", "candidate (equivalence)",
            "candidate (non-inferiority)"]
    if both.empty:
        return pd.DataFrame(columns=cols)
    later = _after(both, chosen)
    rows = []
    for (name, size), g in both.groupby(["checkpoint", "size"], sort=False):
        by_role = {role: r for role, r in g.groupby("role")}
        if {ROLES[0], "poor sampler"} <= set(by_role):
            off = {m for rule in RULES for m in _failed(by_role[ROLES[0]][rule].iloc[0]).split(", ")
                   if by_role[ROLES[0]][rule].iloc[0] != "pass"}
            off |= {"the poor sampler passes" for rule in RULES if (by_role["poor sampler"][rule] == "pass").any()}
            calibrated = "yes" if not off else "not on " + ", ".join(sorted(off))
        else:
            calibrated = "no: no calibration arms"
        cand = g[g["run"] == label(candidate_run())]
        rows.append({"checkpoint": name, "size": size, "chose the candidate": "no" if name in later or chosen is None else "yes",
                     "calibrated": calibrated,
                     "candidate (equivalence)": cand["equivalence"].iloc[0] if len(cand) else "not sampled",
                     "candidate (non-inferiority)": cand["non-inferiority"].iloc[0] if len(cand) else "not sampled"})
    return pd.DataFrame(rows, columns=cols)
