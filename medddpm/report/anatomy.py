"""Chapter 14, real anatomy (issue 47): IXI runs of ``scripts/anatomy_measure.sh`` (tables under
``<gpu>/anatomy/``), the recipes of the intensity question side by side, the external test set, the
sampler gate on real scans, as tables and figures; what superseded measurements found is in the chapter's
``history.json`` (``medddpm.report.history``).

A store may hold these results on any GPU, or on none: every function returns its full shape then,
and every fact reads "—" with what is missing.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import pandas as pd

from ..core.config import DEFAULT_ETA, DiffusionConfig, SAMPLING_ALIASES
from ..diffusion.solvers import FEW_STEP, REFERENCE as DDPM_REFERENCE
from ..sample.anatomy import REAL, TEMPLATE
from ..sample.gate import REFERENCE, RUN_COLUMNS, GateRun, verdicts
from ..train.timing import steady_intervals
from . import manifests
from .present import gpu_name
from .wording import missing, roles

if TYPE_CHECKING:
    from ..diffusion.gaussian import GaussianDiffusion

TABLES = ("anatomy_samples", "anatomy_diversity", "anatomy_summary")
NAME = re.compile(r"^(?P<recipe>.+)-s(?P<seed>\d+)-(?P<config>[^-]+(?:-[^-]+)*?)(?:-(?P<size>\d+))?$")
BASE_SIZE = 64  # scripts/anatomy_measure.sh's SIZE default; a run at another size ends its name in it (v-s11-fast-96)
DEFAULT_RUN = f"{FEW_STEP.sampler}{FEW_STEP.steps}-{FEW_STEP.spacing}:fast"  # the 12-step chain
LARGE_RUN = f"{DDPM_REFERENCE.sampler}{DDPM_REFERENCE.steps}:fast"  # DDPM 250 under fast: the larger sizes' measure
RECIPES = {"ref": "the reference (min-max, ε, i.i.d. noise)", "pct": "percentile scaling", "offset": "offset noise 0.1",
           "v": "v-prediction"}
STORE_FREE = ("an_gain", "an_terminal_abar", "an_plateau", "an_default")  # facts of the schedule and rules, whatever the store holds
TARGET_GAP = TARGET_SPREAD = 0.05  # issue 47: background within 0.05 of the real scans', spread between seeds ≤ 0.05
TARGET_UTILITY = 0.95  # issue 47: the synthetic-trained segmenter's Dice ≥ 95 % of the real-trained one's
TARGET_R = 0.82  # issue 75: in-brain r of the samples of the largest size's checkpoint
WHAT = "IXI results (anatomy/)"  # what a missing fact names
PLATEAU = 0.01  # a run has levelled off when its held-out loss fell by less than this share between its last two evaluations
MEASURE_LABELS = {"brain_corr": "in-brain r", "region_corr": "region r", "hist_w1": "W1", "background_mean": "background",
                  "ssim_between_seeds": "SSIM between seeds"}  # a measure's name in the tables, as readers see it


def anatomy_gpu(root: Path, gpus: list[str]) -> str | None:
    """The GPU whose store holds the IXI results (the committed H200 first, then the H100, then any)."""
    return roles([g for g in gpus if (Path(root) / g / "anatomy" / "anatomy_summary.csv").exists()])["ref"]


def load(root: Path, gpu: str | None, table: str) -> pd.DataFrame:
    """One of ``TABLES`` (the newest row of duplicates), with the training run's recipe, seed and
    configuration parsed from its name; empty where the store has none."""
    path = Path(root) / str(gpu) / "anatomy" / f"{table}.csv"
    if gpu is None or not path.exists():
        return pd.DataFrame(columns=["name", "recipe", "train_seed", "config", "size", "split", "run"])
    df = pd.read_csv(path)
    keys = [c for c in ("name", "split", "run", "source", "seed", "subject", "seed_a", "seed_b") if c in df]
    df = df.drop_duplicates(keys, keep="last").reset_index(drop=True)
    parts = df["name"].str.extract(NAME)
    return df.assign(recipe=parts["recipe"], config=parts["config"], size=df["name"].map(size_of).astype(int))


def train_folder(root: Path, gpu: str | None) -> Path:
    """Where a store keeps its IXI training runs' own files (``NAME/heldout.csv``, ``timing.csv``, ``env.json``)."""
    return Path(root) / str(gpu) / "anatomy" / "train"


def train_runs(root: Path, gpu: str | None) -> dict[str, Path]:
    """Every IXI training run's own folder by name: ``train_folder``'s, then each arm of a ``recipe-plateau`` run on
    any GPU (its manifest; chapter 14 measured it under the arm's name), none without a ``gpu``."""
    if gpu is None:
        return {}
    found = {p.parent.name: p.parent for p in sorted(train_folder(root, gpu).glob("*/heldout.csv"))}
    return found | {arm: run / arm for _, run, m in manifests.runs(root, manifests.PLATEAU, None) for arm in m["arms"]}


def size_of(name: str) -> int:
    """The volume side of training run ``name`` from its size suffix (``BASE_SIZE`` without one)."""
    m = NAME.match(name)
    return int(m["size"]) if m and m["size"] else BASE_SIZE


def sizes(root: Path, gpu: str | None) -> list[int]:
    """The volume sides other than ``BASE_SIZE`` that the store's IXI runs were trained and measured at."""
    s = load(root, gpu, "anatomy_summary")
    return sorted(int(v) for v in s["size"].unique() if v != BASE_SIZE) if len(s) else []


def recipes(root: Path, gpu: str | None, split: str = "val", size: int = BASE_SIZE) -> pd.DataFrame:
    """Per (recipe, training configuration, sampler run) on ``split`` at volume side ``size``: the
    training runs and their steps, every measure's mean over the runs, and the template's, as the
    chapter's table shows them."""
    s = load(root, gpu, "anatomy_summary")
    cols = ["recipe", "trained with", "sampler", "runs", "steps", "background", "real background", "gap",
            "spread between seeds", "largest spread", "W1", "template W1", "in-brain r", "template r",
            "region r", "SSIM", "SSIM between seeds"]
    if s.empty:
        return pd.DataFrame(columns=cols)
    s = s[(s["split"] == split) & (s["size"] == size)]
    base = s[s["run"] == TEMPLATE].groupby("name")[["hist_w1", "brain_corr"]].first()
    runs = s[~s["run"].isin([REAL, TEMPLATE])]
    rows = []
    for (recipe, config, run), g in runs.groupby(["recipe", "config", "run"], sort=False):
        rows.append({"recipe": recipe, "trained with": config, "sampler": run, "runs": g["name"].nunique(),
                     "steps": ", ".join(f"{int(v):,}" for v in sorted(g["step"].unique())),
                     "background": g["background_mean"].mean(), "real background": g["real_background_mean"].mean(),
                     "gap": g["background_gap"].mean(), "spread between seeds": g["background_seed_spread"].mean(),
                     "largest spread": g["background_seed_spread_max"].max(), "W1": g["hist_w1"].mean(),
                     "template W1": base.loc[g["name"], "hist_w1"].mean(), "in-brain r": g["brain_corr"].mean(),
                     "template r": base.loc[g["name"], "brain_corr"].mean(), "region r": g["region_corr"].mean(),
                     "SSIM": g["ssim"].mean(), "SSIM between seeds": g["ssim_between_seeds"].mean()})
    order = {r: i for i, r in enumerate(RECIPES)}
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values(["recipe", "trained with", "sampler"], key=lambda c: c.map(order).fillna(99)
                           if c.name == "recipe" else c, kind="stable").reset_index(drop=True)


REF_RUN = f"{REFERENCE[0]}{REFERENCE[1]}:{REFERENCE[3]}"  # FP32 DDPM 250 as a samples table names it


def gate_names(samples: pd.DataFrame, size: int | None = None) -> list[str]:
    """The training runs whose samples hold FP32 DDPM 250 (the gate's band), oldest first; at volume
    side ``size`` only, where given."""
    ref = samples.loc[samples["run"] == REF_RUN, "name"] if len(samples) else pd.Series(dtype=str)
    return [n for n in dict.fromkeys(ref) if size is None or size_of(n) == size]


def _gate_run(samples: pd.DataFrame, size: int = BASE_SIZE) -> str | None:
    """The training run the chapter's gate judges: the newest at ``size`` whose samples hold FP32 DDPM 250."""
    names = gate_names(samples, size)
    return names[-1] if names else None


def gate(root: Path, gpu: str | None, name: str | None = None) -> pd.DataFrame:
    """The sampler gate (``sample.gate.verdicts``) on training run ``name`` (default: the newest at
    ``BASE_SIZE`` whose samples hold FP32 DDPM 250 over several seeds), on the subjects and seeds FP32
    sampled: per (sampler run, held-out subject), with the run's name."""
    samples, div = load(root, gpu, "anatomy_samples"), load(root, gpu, "anatomy_diversity")
    name = name or _gate_run(samples)
    if name is None:
        return pd.DataFrame(columns=["name", *RUN_COLUMNS, "subject", "verdict"])

    ref = samples[(samples["name"] == name) & (samples["run"] == REF_RUN)]
    subjects, seeds = set(ref["subject"]), set(ref["seed"])

    def runs(df: pd.DataFrame) -> pd.DataFrame:
        # the band's own subjects and seeds only: at a large size FP32 samples a few subjects, and a
        # candidate's other seeds carry other noise, which this gate does not judge
        own = df["seed"].isin(seeds) if "seed" in df else df["seed_a"].isin(seeds) & df["seed_b"].isin(seeds)
        df = df[(df["name"] == name) & ~df["run"].isin([REAL, TEMPLATE]) & df["subject"].isin(subjects) & own].copy()
        parsed = [GateRun.parse(*r.split(":")) for r in df["run"]]
        for col in RUN_COLUMNS:
            df[col] = [getattr(p, col) for p in parsed]
        return df

    out = verdicts(runs(samples), runs(div))
    return out.assign(name=name)


def gate_runs(table: pd.DataFrame) -> pd.DataFrame:
    """One row per judged run: its verdict and the means of its measures over the subjects."""
    cols = ["sampler run", "verdict", "in-brain r", "background", "W1", "SSIM between seeds", "seeds"]
    if table.empty:
        return pd.DataFrame(columns=cols)
    g = table.groupby([*RUN_COLUMNS, "verdict"], as_index=False, sort=False)[
        ["brain_corr", "background_mean", "hist_w1", "ssim_between_seeds", "seeds"]].mean()
    g["sampler run"] = [f"{r.sampler} {r.steps}{' ' + r.spacing if r.spacing else ''} · "
                        f"{ {v: k for k, v in SAMPLING_ALIASES.items()}.get(r.config, r.config)}" for r in g.itertuples()]
    return g.rename(columns={"brain_corr": "in-brain r", "background_mean": "background", "hist_w1": "W1",
                             "ssim_between_seeds": "SSIM between seeds"})[cols]


def gate_history(root: Path, gpu: str | None) -> pd.DataFrame:
    """``gate_runs`` of every checkpoint the gate judged (``gate_names``), oldest first, with the
    checkpoint's name and training step."""
    samples = load(root, gpu, "anatomy_samples")
    frames = []
    for name in gate_names(samples):
        step = samples.loc[samples["name"] == name, "step"]
        frames.append(gate_runs(gate(root, gpu, name)).assign(checkpoint=name, step=int(step.iloc[0]) if len(step) else None))
    cols = ["checkpoint", "step", "sampler run", "verdict", "in-brain r", "background", "W1", "SSIM between seeds", "seeds"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def utility(root: Path, gpu: str | None) -> pd.DataFrame:
    """Segmentation utility per training run and source of the segmenter's training scans: the
    mean and lowest Dice on the real held-out scans, over subjects and segmenter seeds."""
    u = load(root, gpu, "anatomy_utility")
    cols = ["recipe", "trained with", "size", "run", "checkpoint step", "segmenter trained on", "Dice", "lowest Dice",
            "subjects", "steps"]
    if u.empty:
        return pd.DataFrame(columns=cols)
    g = u.groupby(["recipe", "config", "size", "name", "step", "source"], as_index=False, sort=False).agg(
        Dice=("dice", "mean"), lowest=("dice", "min"), subjects=("subject", "nunique"), steps=("steps", "first"))
    return g.rename(columns={"config": "trained with", "name": "run", "step": "checkpoint step",
                             "source": "segmenter trained on", "lowest": "lowest Dice"})[cols]


def curves(root: Path, gpu: str | None) -> pd.DataFrame:
    """The held-out loss (EMA weights, mean over the validation subjects and timesteps) of every
    training run against its steps: name, recipe, config, step, loss."""
    rows = []
    for name, folder in sorted(train_runs(root, gpu).items()):
        h = pd.read_csv(folder / "heldout.csv")
        ema = h[h["weights"] == "ema"].groupby("step", as_index=False)["loss"].mean()
        m = NAME.match(name)
        rows.append(ema.assign(name=name, recipe=m["recipe"] if m else "", config=m["config"] if m else "",
                               size=size_of(name)))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["step", "loss", "name", "recipe", "config",
                                                                                   "size"])


def plateaus(c: pd.DataFrame) -> pd.DataFrame:
    """Per training run: its last evaluated step, the share its held-out loss fell by between its last
    two evaluations (``drop``) and whether that is under ``PLATEAU`` (``levelled``)."""
    rows = []
    for name, g in c[c["step"] > 0].groupby("name"):
        g = g.sort_values("step")
        if len(g) >= 2:
            before, last = g["loss"].iloc[-2], g["loss"].iloc[-1]
            rows.append({"name": name, "step": int(g["step"].iloc[-1]), "interval": int(g["step"].diff().iloc[-1]),
                         "drop": (before - last) / before})
    out = pd.DataFrame(rows, columns=["name", "step", "interval", "drop"])
    return out.assign(levelled=out["drop"] < PLATEAU)


def curves_figure(c: pd.DataFrame):
    """The held-out loss curves, one line per training run, coloured by recipe (dashed: not ``fast``;
    dotted: a size other than ``BASE_SIZE``)."""
    fig, ax = plt.subplots(figsize=(8, 3.4))
    colors = dict(zip(RECIPES, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for name, g in c[c["step"] > 0].groupby("name"):
        ax.plot(g["step"], g["loss"], marker=".", lw=1.1, color=colors.get(g["recipe"].iloc[0], "0.4"),
                ls=":" if g["size"].iloc[0] != BASE_SIZE else "--" if g["config"].iloc[0] != "fast" else "-", label=name)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("held-out L1 loss on ε (EMA)")
    ax.legend(fontsize=7, ncol=2)
    return fig


def slices(root: Path, gpu: str | None, names: list[str]) -> tuple[pd.DataFrame, dict[str, str]] | None:
    """The 12-step chain's slices of the first validation subject from each of ``names``
    (training runs; the scans themselves are not in a results store): (tidy slices, source →
    column title), or None."""
    frames, sources = [], {}
    for name in names:
        sl = _first_subject(root, gpu, name)
        if sl is None:
            continue
        frames.append(sl[sl["source"] == DEFAULT_RUN].assign(source=name))
        sources[name] = f"{NAME.match(name)['recipe'] if NAME.match(name) else name}, 12 steps"
    return (pd.concat(frames, ignore_index=True), sources) if frames else None


def _first_subject(root: Path, gpu: str | None, name: str | None) -> pd.DataFrame | None:
    """Training run ``name``'s slices parquet (every sampler run's samples; the scans are not in a
    results store), its first validation subject only, values float32; None where there is none."""
    path = Path(root) / str(gpu) / "anatomy" / f"slices-{name}-val.parquet"
    if gpu is None or name is None or not path.exists():
        return None
    sl = pd.read_parquet(path)
    sl = sl[sl["subject"] == sorted(sl["subject"].unique())[0]]
    return sl.assign(value=sl["value"].astype("float32"))


def sampled(root: Path, gpu: str | None) -> set[str]:
    """The training runs whose checkpoint DDPM 250 sampled on the validation masks (``LARGE_RUN`` rows)."""
    return set(load(root, gpu, "anatomy_summary").query("split == 'val' and run == @LARGE_RUN")["name"])


def largest_run(root: Path, gpu: str | None) -> str | None:
    """The name of the newest-named sampled training run at the largest size beyond ``BASE_SIZE`` (None: none)."""
    big = (sizes(root, gpu) or [None])[-1]
    c = curves(root, gpu)
    names = sorted(set(c.loc[c["size"] == big, "name"]) & sampled(root, gpu)) if big else []
    return names[-1] if names else None


def run_slices(root: Path, gpu: str | None, name: str | None) -> tuple[pd.DataFrame, dict[str, str]] | None:
    """Every sampler run's slices of the first validation subject of training run ``name``:
    (tidy slices, source → column title: 'ddpm 250', 'dpm2m-sde 12, η 1.3'), or None."""
    sl = _first_subject(root, gpu, name)
    if sl is None:
        return None
    runs = {r: GateRun.parse(*r.split(":")) for r in sl["source"].unique()}
    return sl, {r: f"{g.sampler} {g.steps}" + (f", η {g.eta:g}" if g.eta != DEFAULT_ETA else "") for r, g in runs.items()}


def step_ms(root: Path, gpu: str | None, name: str) -> float | None:
    """A training run's steady-state ms per step (median of its read-back intervals after the first)."""
    path = train_runs(root, gpu).get(name, Path("-")) / "timing.csv"
    if not path.exists():
        return None
    t = steady_intervals(pd.read_csv(path))
    return float(t.median()) if len(t) else None


def first_step_gain(d: GaussianDiffusion) -> float:
    """√((1 − ᾱ_t)/ᾱ_t) at the 12-step chain's first timestep: how much an error in the predicted
    ε's volume mean grows in x̂₀ = (x_t − √(1 − ᾱ_t) ε̂)/√ᾱ_t."""
    t = d.plan(FEW_STEP.sampler, FEW_STEP.steps, FEW_STEP.spacing).steps[0].t
    a = d.abar_host[t]
    return math.sqrt((1 - a) / a)


def facts(root: Path, gpus: list[str]) -> dict[str, str]:
    """The chapter's glued facts (prefix ``an_``): the GPU, the subjects' counts, and the schedule's numbers behind
    the background's cause; every measure is in a table (``state``, ``recipes``, ``runs``, ``utility``)."""
    from ..diffusion.gaussian import GaussianDiffusion  # PyTorch: the schedule's numbers, this chapter's alone

    gpu = anatomy_gpu(root, gpus)
    schedule = GaussianDiffusion(lambda x, t: x, DiffusionConfig())
    mantissa, exponent = f"{schedule.abar_host[-1]:.0e}".split("e")
    out = {"an_gpu": gpu_name(gpu) if gpu else missing(WHAT), "an_gain": f"{first_step_gain(schedule):,.0f}",
           "an_terminal_abar": f"{mantissa} × 10" + str(int(exponent)).translate(str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")),
           "an_plateau": f"{100 * PLATEAU:g} %", "an_default": f"`{DDPM_REFERENCE.describe()}` on every checkpoint"}
    subjects = load(root, gpu, "anatomy_samples")
    for split in ("val", "test"):
        n = subjects.loc[subjects["split"] == split, "subject"].nunique() if {"split", "subject"} <= set(subjects) else 0
        out[f"an_{split}_n"] = str(n) if n else missing(WHAT)
    return out


def larger(root: Path, gpu: str | None, split: str = "val") -> pd.DataFrame:
    """``recipes`` at every size beyond ``BASE_SIZE``, a column ``size`` first."""
    frames = [recipes(root, gpu, split, n).assign(size=f"{n}³") for n in sizes(root, gpu)]
    cols = ["size", *recipes(root, None).columns]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def run_device(root: Path, gpu: str | None, name: str) -> dict:
    """A training run's own record where it was made on GPUs other than its store's (the GPU, how many, the global
    batch, the training processes' wall seconds): ``train/NAME/env.json``, or a ``recipe-plateau`` arm's manifest and
    pipeline stamps; else {}."""
    path = train_folder(root, gpu) / name / "env.json"
    if gpu is not None and path.exists():
        return json.loads(path.read_text())
    for _, run, m in manifests.runs(root, manifests.PLATEAU, None):
        if name in m["arms"]:
            wall = manifests.stage_seconds(run, *m["arms"][name]["stamps"])
            return {"gpu": m["gpu"], "gpus": m.get("gpus", 4), "global_batch": manifests.global_batch(m["arms"][name]),
                    **({"train_wall_s": [wall]} if wall == wall else {})}
    return {}


def runs(root: Path, gpu: str | None) -> pd.DataFrame:
    """Per IXI training run: its size, the GPUs it trained on and their global batch, its last step, the step and
    value of its lowest held-out EMA loss, how much that loss fell over its last interval and whether it levelled off
    (``plateaus``), ms a steady step, and its training processes' wall time and GPU-hours where the run kept them."""
    cols = ["run", "size", "GPUs", "global batch", "steps", "best step", "held-out loss", "last drop", "levelled",
            "ms a step", "wall min", "GPU-hours"]
    c = curves(root, gpu)
    levels = plateaus(c).set_index("name")
    rows, folders = [], train_runs(root, gpu)
    for name, g in c[c["step"] > 0].groupby("name"):
        env = run_device(root, gpu, name)
        path = folders[name] / "log.csv"
        log = pd.read_csv(path) if path.exists() else pd.DataFrame({"step": [g["step"].max()]})
        batch = log["global_batch"].iloc[-1] if "global_batch" in log else env.get("global_batch")
        best = g.loc[g["loss"].idxmin()]
        wall = sum(env["train_wall_s"]) if "train_wall_s" in env else None
        n = env.get("gpus", 1)
        rows.append({"run": name, "size": f"{size_of(name)}³", "GPUs": f"{n} × {env.get('gpu', gpu_name(gpu))}",
                     "global batch": int(batch) if batch is not None else None,
                     "steps": int(log["step"].iloc[-1]), "best step": int(best["step"]), "held-out loss": best["loss"],
                     "last drop": f"{100 * levels.loc[name, 'drop']:.1f} %" if name in levels.index else None,
                     "levelled": bool(levels.loc[name, "levelled"]) if name in levels.index else None,
                     "ms a step": step_ms(root, gpu, name), "wall min": wall / 60 if wall else None,
                     "GPU-hours": wall * n / 3600 if wall else None})
    return pd.DataFrame(rows, columns=cols)


def _v_row(root: Path, gpu: str | None, size: int, run: str) -> pd.Series | None:
    """The v recipe's ``recipes`` row under ``fast`` for sampler run ``run`` at ``size`` on the validation subjects."""
    df = recipes(root, gpu, "val", size)
    df = df[(df["recipe"] == "v") & (df["sampler"] == run) & (df["trained with"] == "fast")]
    return df.iloc[0] if len(df) else None


def state(root: Path, gpu: str | None) -> pd.DataFrame:
    """Chapter 14's first table: each measure of the v recipe's samples of the validation subjects at 64³ (the 12-step
    chain) and at the largest size (DDPM 250, ``LARGE_RUN``) against that size's targets (issue 75's), the template's
    value beside where it sets the bar, and the runs behind each column with their plateau state; '—' where the store
    lacks it."""
    big = (sizes(root, gpu) or [None])[-1]
    cols = ["measure (validation subjects)", f"{BASE_SIZE}³", f"{big}³" if big else "larger size", "target"]
    small, large = _v_row(root, gpu, BASE_SIZE, DEFAULT_RUN), _v_row(root, gpu, big, LARGE_RUN) if big else None

    def cell(r: pd.Series | None, col: str, spec: str, template: str | None = None) -> str:
        if r is None:
            return "—"
        return f"{r[col]:{spec}}" + (f" (template {r[template]:{spec}})" if template else "")
    def trained(r: pd.Series | None) -> str:
        return "—" if r is None else f"{r['runs']} runs (steps {r['steps']})"
    u = utility(root, gpu)
    u = u[(u["recipe"] == "v") & (u["size"] == big)] if big else u.iloc[:0]
    d = u.groupby("segmenter trained on")["Dice"].mean()
    steps = ", ".join(f"{int(v):,}" for v in sorted(u["checkpoint step"].unique()))
    dice = (f"{100 * d['synthetic'] / d['real']:.1f} %" if {"real", "synthetic"} <= set(d.index) else "—")
    if dice != "—" and large is not None and steps != large["steps"]:
        judged = load(root, gpu, "anatomy_summary").query("split == 'val' and run == @LARGE_RUN")
        now = dict(zip(judged["name"], judged["step"]))  # each name's sampled checkpoint
        earlier = sorted({n for n, st in zip(u["run"], u["checkpoint step"]) if now.get(n) != st})
        dice += f" ({u['run'].nunique()} of those runs, steps {steps}" + (
            f"; {', '.join(earlier)} at an earlier checkpoint)" if earlier else ")")
    r = runs(root, gpu)
    r = r[(r["size"] == f"{big}³") & r["run"].isin(sampled(root, gpu))] if big else r.iloc[:0]  # the runs behind it
    levels = "; ".join(f"{'levelled off' if lv else 'still learning'}: {', '.join(g['run'])}"
                       for lv, g in r.groupby("levelled", sort=False))
    rows = [("background mean, sample − scan (mean over seeds)", cell(small, "gap", "+.3f"), cell(large, "gap", "+.3f"),
             f"within ±{TARGET_GAP:g}"),
            ("spread of the background between seeds", cell(small, "spread between seeds", ".3f"),
             cell(large, "spread between seeds", ".3f"), f"≤ {TARGET_SPREAD:g}"),
            ("W1 of in-brain intensities", cell(small, "W1", ".3f", "template W1"), cell(large, "W1", ".3f", "template W1"),
             "at or below the template's"),
            ("in-brain r", cell(small, "in-brain r", ".3f", "template r"), cell(large, "in-brain r", ".3f", "template r"),
             f"≥ {TARGET_R:g}"),
            ("segmentation Dice, synthetic- against real-trained", "—", dice, f"≥ {100 * TARGET_UTILITY:g} %"),
            ("runs (steps of their checkpoints)", trained(small), trained(large) + (f"; {levels}" if levels else ""),
             "its plateau")]
    return pd.DataFrame(rows, columns=cols)
