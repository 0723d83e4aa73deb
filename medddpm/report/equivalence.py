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


def bench_name(sampler: str, steps: int) -> str:
    """How ``seconds`` names a benchmarked sampler of ``steps`` steps (``ddpm 250``)."""
    return f"{sampler} {steps}"


def seconds(root: Path, gpu: str | None) -> pd.DataFrame:
    """Seconds per 128³ volume (batch 1, fast) of each benchmarked sampler (``bench_name``), with its denoiser calls."""
    b = _read(root, gpu, "bench")
    cols = ["sampler", "calls", "s / volume", "GPU"]
    if b.empty:
        return pd.DataFrame(columns=cols)
    b = b.sort_values("steps")
    return pd.DataFrame({"sampler": [bench_name(s, n) for s, n in zip(b["sampler"], b["steps"])], "calls": b["steps"].values,
                         "s / volume": b["s_per_volume_median"].values, "GPU": b["gpu"].values})


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


def largest(root: Path, gpu: str | None) -> str | None:
    """The newest checkpoint judged at the largest size beyond ``BASE_SIZE`` (None: none was)."""
    big = (sizes(root, gpu) or [None])[-1]
    return names(root, gpu, big)[-1] if big else None


def _failed(verdict: str) -> str:
    """'fail: hist_w1, brain_corr' → 'W1, in-brain r'."""
    return ", ".join(MEASURE_LABELS.get(m, m) for m in verdict.removeprefix("fail: ").split(", "))


def facts(root: Path, gpus: list[str]) -> dict[str, str]:
    """The chapter's glued facts (prefix ``eq_``): the gate's rules and the package's samplers, whatever the store
    holds, the GPU, and the candidate's confirmation; every measure is in a table, earlier findings in the history."""
    gpu = equivalence_gpu(root, gpus)
    return {"eq_default": f"{REFERENCE.describe()} ({REFERENCE.steps} denoiser calls)",
            "eq_candidate": f"{CANDIDATE.describe()} ({CANDIDATE.steps} denoiser calls)",
            "eq_reference": f"{REFERENCE.sampler.upper()} {REFERENCE.steps}",
            "eq_rel_margin": f"{100 * RELATIVE_MARGIN:g} %",
            "eq_abs_margin": ", ".join(sorted({f"{v:g}" for v in ABSOLUTE_MARGINS.values()})),
            "eq_interval": f"{100 * (1 - 2 * ALPHA):g} %", "eq_util_floor": f"{100 * UTILITY_FLOOR:g} %",
            "eq_power": f"{100 * POWER:g} %", "eq_gpu": gpu_name(gpu) if gpu else missing(WHAT),
            "eq_confirm": confirmed(under_both_rules(root, gpu), chosen_on(root, gpu)) if gpu else missing(WHAT)}


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
