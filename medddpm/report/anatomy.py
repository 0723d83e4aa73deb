"""Chapter 14, real anatomy (issue 47): IXI runs of ``scripts/anatomy_measure.sh`` (tables under
``<gpu>/anatomy/``), the recipes of the intensity question side by side, the external test set, the
sampler gate on real scans and training parity of the TF32 reference, as tables, figures and facts.

A store may hold these results on any GPU, or on none: every function returns its full shape then,
and every fact reads "—" with what is missing.
"""
from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ..core.config import DEFAULT_ETA, DiffusionConfig, SAMPLING_ALIASES
from ..diffusion.gaussian import GaussianDiffusion
from ..diffusion.solvers import FEW_STEP, REFERENCE as DDPM_REFERENCE
from ..sample.anatomy import REAL, TEMPLATE
from ..sample.gate import REFERENCE, RUN_COLUMNS, GateRun, verdicts
from .present import gpu_name
from .quality_tables import sample_bench
from .wording import missing, number, roles

TABLES = ("anatomy_samples", "anatomy_diversity", "anatomy_summary")
NAME = re.compile(r"^(?P<recipe>.+)-s(?P<seed>\d+)-(?P<config>[^-]+(?:-[^-]+)*?)(?:-(?P<size>\d+))?$")
BASE_SIZE = 64  # scripts/anatomy_measure.sh's SIZE default; a run at another size ends its name in it (v-s11-fast-96)
DEFAULT_RUN = f"{FEW_STEP.sampler}{FEW_STEP.steps}-{FEW_STEP.spacing}:fast"  # the 12-step chain
DDPM_RUN = "ddpm250:bf16"  # DDPM 250 beside it, on every run
LARGE_RUN = f"{DDPM_REFERENCE.sampler}{DDPM_REFERENCE.steps}:fast"  # DDPM 250 under fast: the larger sizes' measure
RECIPES = {"ref": "the reference (min-max, ε, i.i.d. noise)", "pct": "percentile scaling", "offset": "offset noise 0.1",
           "v": "v-prediction"}
STORE_FREE = ("an_gain", "an_terminal_abar", "an_plateau", "an_default", "an_base_size")  # facts of the schedule and rules, whatever the store holds
TARGET_GAP = TARGET_SPREAD = 0.05  # issue 47: background within 0.05 of the real scans', spread between seeds ≤ 0.05
TARGET_UTILITY = 0.95  # issue 47: the synthetic-trained segmenter's Dice ≥ 95 % of the real-trained one's
PLATEAU = 0.01  # a run has levelled off when its held-out loss fell by less than this share between its last two evaluations
MEASURE_LABELS = {"brain_corr": "in-brain r", "region_corr": "region r", "hist_w1": "W1", "background_mean": "background",
                  "ssim_between_seeds": "SSIM between seeds"}  # a measure's name in the tables, as readers see it
GATE_CRITERIA = {"corr": "brain_corr", "background": "background_mean", "w1": "hist_w1", "diversity": "ssim_between_seeds"}  # a gate verdict's criterion → its measure
NUMERICS_MEASURES = ("brain_corr", "background_mean", "hist_w1")  # the numerics' paired shift: the band's own measures
NUMERICS_KEYS = ("an_big_numerics", "an_big_numerics_state", "an_big_numerics_shift")  # numerics_facts' facts


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


def _reference_samples(root: Path, gpu: str | None, name: str | None = None) -> pd.DataFrame:
    """FP32 DDPM 250's samples (every seed and subject) of training run ``name`` (default: the chapter's
    gate's); empty without one."""
    samples = load(root, gpu, "anatomy_samples")
    name = name or _gate_run(samples)
    return samples[(samples["run"] == REF_RUN) & (samples["name"] == name)] if name else samples.iloc[:0]


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
    folder = train_folder(root, gpu)
    rows = []
    for run in sorted(folder.glob("*/heldout.csv")) if gpu is not None else []:
        h = pd.read_csv(run)
        ema = h[h["weights"] == "ema"].groupby("step", as_index=False)["loss"].mean()
        m = NAME.match(run.parent.name)
        rows.append(ema.assign(name=run.parent.name, recipe=m["recipe"] if m else "", config=m["config"] if m else "",
                               size=size_of(run.parent.name)))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["step", "loss", "name", "recipe", "config",
                                                                                   "size"])


def parity(c: pd.DataFrame, recipe: str = "v", reference: str = "opt1", fast: str = "fast") -> pd.DataFrame:
    """At each step both evaluated (after step 0): the ``reference`` configuration's held-out loss
    against the band (lowest, highest) of ``fast``'s seeds of the same recipe (at ``BASE_SIZE``), and
    whether it lies inside."""
    cols = ["step", "reference", "band low", "band high", "fast seeds", "inside"]
    mine = c[(c["recipe"] == recipe) & (c["step"] > 0) & (c["size"] == BASE_SIZE)]
    ref, band = mine[mine["config"] == reference], mine[mine["config"] == fast]
    if ref.empty or band["name"].nunique() < 2:
        return pd.DataFrame(columns=cols)
    b = band.groupby("step")["loss"].agg(["min", "max", "count"])
    out = ref.groupby("step")["loss"].mean().to_frame("reference").join(b, how="inner").reset_index()
    out = out[out["count"] >= 2].rename(columns={"min": "band low", "max": "band high", "count": "fast seeds"})
    out["inside"] = out["reference"].between(out["band low"], out["band high"])
    return out[cols]


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


def largest_run(root: Path, gpu: str | None) -> str | None:
    """The name of the newest-named training run at the largest size beyond ``BASE_SIZE`` (None: none)."""
    big = (sizes(root, gpu) or [None])[-1]
    c = curves(root, gpu)
    names = sorted(c.loc[c["size"] == big, "name"].unique()) if big else []
    return names[-1] if names else None


def run_slices(root: Path, gpu: str | None, name: str | None) -> tuple[pd.DataFrame, dict[str, str]] | None:
    """Every sampler run's slices of the first validation subject of training run ``name``:
    (tidy slices, source → column title: 'ddpm 250', 'dpm2m-sde 12, η 1.3'), or None."""
    sl = _first_subject(root, gpu, name)
    if sl is None:
        return None
    runs = {r: GateRun.parse(*r.split(":")) for r in sl["source"].unique()}
    return sl, {r: f"{g.sampler} {g.steps}" + (f", η {g.eta:g}" if g.eta != DEFAULT_ETA else "") for r, g in runs.items()}


def _rows_of(table: pd.DataFrame, key: tuple) -> pd.DataFrame:
    """The rows of a gate table (``gate``) of the run whose (sampler, steps, spacing, config) is ``key``."""
    return table[(table["sampler"] == key[0]) & (table["steps"] == key[1]) & (table["spacing"].fillna("") == key[2])
                 & (table["config"] == key[3])]


def gate_shift(table: pd.DataFrame, run: str = DEFAULT_RUN) -> dict[str, float]:
    """``run``'s per-subject mean over seeds minus FP32 DDPM 250's, averaged over the subjects:
    in-brain r and background mean (the gate's table, ``gate``)."""
    a, b = _rows_of(table, GateRun.parse(*run.split(":")).key()), _rows_of(table, REFERENCE)
    if a.empty or b.empty:
        return {}
    d = a.set_index("subject")[["brain_corr", "background_mean"]] - b.set_index("subject")[["brain_corr", "background_mean"]]
    se = d.std(ddof=1) / math.sqrt(len(d))  # NaN for one subject
    return {**d.mean().to_dict(), **{f"{k}_se": v for k, v in se.to_dict().items()}}


def gate_cause(table: pd.DataFrame, sampler: str = FEW_STEP.sampler, spacing: str = FEW_STEP.spacing,
               config: str = "fast") -> str:
    """What the gate's own rows say of the few-step chain's failure: DDPM 250 under ``config`` against
    FP32 (the numerics' share); ``sampler``'s chains at ``spacing`` of every length judged, up to every
    timestep (the steps' share); and DDIM at η = 1, DDPM's own first-order step on fewer timesteps."""
    if table.empty:
        return missing("sampler gate on IXI (anatomy/ with FP32 DDPM 250)")
    verdict = table.assign(spacing=table["spacing"].fillna("")).groupby([*RUN_COLUMNS], sort=False)["verdict"].first()
    T = REFERENCE[1]
    numerics = verdict.get(("ddpm", T, "", config))
    chains = {k[1]: v for k, v in verdict.items() if k[0] == sampler and k[2] == spacing and k[3] == config}
    if numerics is None or not chains:
        return missing(f"DDPM {T} under {config} and {sampler} chains in the IXI gate")
    steps = sorted(chains)
    failed = [n for n in steps if chains[n] != "pass"]
    said = (f"DDPM {T} under `{config}` {'passes' if numerics == 'pass' else 'fails'}; `{sampler}` ({spacing}) fails at "
            f"{len(failed)} of its {len(steps)} lengths ({', '.join(map(str, steps))} steps)")
    if numerics != "pass":
        return said + f": `{config}`'s numerics already move DDPM {T}"
    if len(failed) < len(steps):
        return said
    if T in chains:
        said += (f", even at {T}, where it visits every timestep DDPM does: not the bf16 numerics and not the step "
                 "count, but the solver's multistep correction")
    else:
        said += ": not the bf16 numerics, and more steps do not close the gap: its cause lies in the few-step solver"
    ddim = {k[1]: v for k, v in verdict.items() if k[0] == "ddim" and k[3] == config}
    short = [n for n in sorted(ddim) if ddim[n] != "pass"]
    if short:
        why = sorted({c.strip() for n in short for c in ddim[n].removeprefix("fail:").split(",")})
        ok = [n for n in sorted(ddim) if ddim[n] == "pass"]
        said += (f". DDIM at η = 1 (DDPM's own step on fewer timesteps) fails at {', '.join(map(str, short))} steps "
                 f"({', '.join(why)})" + (f" and passes at {', '.join(map(str, ok))}" if ok else ""))
    return said


def reference_span(root: Path, gpu: str | None, metric: str = "brain_corr") -> float | None:
    """How far FP32 DDPM 250's seeds of the gate's run lie apart in ``metric`` averaged over the
    subjects (highest seed mean less the lowest): the spread a shift of that mean is set against."""
    ref = _reference_samples(root, gpu)
    means = ref.groupby("seed")[metric].mean() if len(ref) else ()
    return float(means.max() - means.min()) if len(means) > 1 else None


def reference_self_check(root: Path, gpu: str | None, name: str | None = None) -> tuple[int, int, int] | None:
    """FP32 DDPM 250 of training run ``name`` (default: the chapter's gate's) judged by the gate's rule
    against itself: for each split of its seeds into two halves, the subjects where the mean of one
    half lies inside the band (min–max) of the other on the correlation, background and W1. Returns
    (fewest, most, subjects), or None (fewer than 4 seeds: no two halves of 2)."""
    ref = _reference_samples(root, gpu, name)
    seeds = sorted(ref["seed"].unique()) if len(ref) else []
    if len(seeds) < 4:
        return None
    counts = []
    for half in (set(c) for c in itertools.combinations(seeds, len(seeds) // 2)):
        band = ref[ref["seed"].isin(half)].groupby("subject")[["brain_corr", "background_mean", "hist_w1"]]
        lo, hi = band.min(), band.max()
        m = ref[~ref["seed"].isin(half)].groupby("subject")[["brain_corr", "background_mean", "hist_w1"]].mean()
        ok = (m["brain_corr"] >= lo["brain_corr"]) & m["background_mean"].between(lo["background_mean"], hi["background_mean"]) \
            & (m["hist_w1"] <= hi["hist_w1"])
        counts.append(int(ok.sum()))
    return min(counts), max(counts), int(ref["subject"].nunique())


def step_ms(root: Path, gpu: str | None, name: str) -> float | None:
    """A training run's steady-state ms per step (median of its read-back intervals after the first)."""
    path = train_folder(root, gpu) / name / "timing.csv"
    if gpu is None or not path.exists():
        return None
    from ..train.trainer import steady_intervals

    t = steady_intervals(pd.read_csv(path))
    return float(t.median()) if len(t) else None


def base_runs_r(root: Path, gpu: str | None) -> pd.Series:
    """In-brain r of ``LARGE_RUN`` per v run under ``fast`` at ``BASE_SIZE`` on the validation set."""
    s = load(root, gpu, "anatomy_summary")
    if s.empty:
        return pd.Series(dtype=float)
    s = s[(s["split"] == "val") & (s["size"] == BASE_SIZE) & (s["recipe"] == "v") & (s["config"] == "fast")
          & (s["run"] == LARGE_RUN)]
    return s.groupby("name")["brain_corr"].mean()


def first_step_gain(d: GaussianDiffusion) -> float:
    """√((1 − ᾱ_t)/ᾱ_t) at the 12-step chain's first timestep: how much an error in the predicted
    ε's volume mean grows in x̂₀ = (x_t − √(1 − ᾱ_t) ε̂)/√ᾱ_t."""
    t = d.plan(FEW_STEP.sampler, FEW_STEP.steps, FEW_STEP.spacing).steps[0].t
    a = d.abar_host[t]
    return math.sqrt((1 - a) / a)


def _row(df: pd.DataFrame, recipe: str, run: str = DEFAULT_RUN, config: str = "fast") -> pd.DataFrame:
    """The ``recipes`` row of one recipe, sampler run and training configuration (or none)."""
    return df[(df["recipe"] == recipe) & (df["sampler"] == run) & (df["trained with"] == config)]


def _cell(row: pd.DataFrame, column: str, spec: str, what: str) -> str:
    """One column of a ``_row`` as the prose quotes it: a number in ``spec``, as written without one
    (runs, steps), or "—" naming ``what`` where there is no row."""
    if not len(row):
        return missing(what)
    return number(float(row[column].iloc[0]), spec, what) if spec else str(row[column].iloc[0])


def facts(root: Path, gpus: list[str]) -> dict[str, str]:
    """The chapter's glued facts (prefix ``an_``)."""
    gpu = anatomy_gpu(root, gpus)
    what = "IXI results (anatomy/)"
    val, test = recipes(root, gpu, "val"), recipes(root, gpu, "test")

    def cell(df: pd.DataFrame, recipe: str, column: str, spec: str = ".2f", run: str = DEFAULT_RUN,
             config: str = "fast") -> str:
        return _cell(_row(df, recipe, run, config), column, spec, what)

    schedule = GaussianDiffusion(lambda x, t: x, DiffusionConfig())
    out = {"an_gpu": gpu_name(gpu) if gpu else missing(what), "an_gain": f"{first_step_gain(schedule):,.0f}"}
    for r in RECIPES:
        for key, col, spec in (("gap", "gap", "+.2f"), ("spread", "spread between seeds", ".3f"),
                               ("maxspread", "largest spread", ".2f"), ("w1", "W1", ".3f"), ("r", "in-brain r", ".2f"),
                               ("runs", "runs", ""), ("steps", "steps", "")):
            out[f"an_{r}_{key}"] = cell(val, r, col, spec)
        out[f"an_{r}_ddpm_gap"] = cell(val, r, "gap", "+.2f", DDPM_RUN)
    out["an_real_bg"] = cell(val, "ref", "real background")
    out["an_template_w1"] = cell(val, "ref", "template W1", ".3f")
    out["an_template_r"] = cell(val, "ref", "template r")
    out["an_v_region_r"] = cell(val, "v", "region r")
    for key, col, spec in (("gap", "gap", "+.3f"), ("spread", "spread between seeds", ".3f"),
                           ("maxspread", "largest spread", ".3f"), ("w1", "W1", ".3f"), ("template_w1", "template W1", ".3f"),
                           ("r", "in-brain r", ".2f"), ("template_r", "template r", ".2f"), ("real_bg", "real background", ".2f")):
        out[f"an_test_{key}"] = cell(test, "v", col, spec)
    subjects = load(root, gpu, "anatomy_samples")
    for split in ("val", "test"):
        n = subjects.loc[subjects.get("split", pd.Series(dtype=str)) == split, "subject"].nunique() if len(subjects) else 0
        out[f"an_{split}_n"] = str(n) if n else missing(what)
    table = gate(root, gpu)
    g = gate_runs(table)
    judged = g[g["verdict"] != "reference"]
    out["an_gate"] = (", ".join(f"{r['sampler run']}: {r['verdict']}" for _, r in judged.iterrows())
                      if len(judged) else missing("sampler gate on IXI (anatomy/ with FP32 DDPM 250)"))
    out["an_gate_seeds"] = str(int(g["seeds"].min())) if len(g) else missing("sampler gate on IXI")
    shift = gate_shift(table)
    out["an_gate_dr"] = number(shift.get("brain_corr"), "+.3f", "sampler gate on IXI")
    out["an_gate_dbg"] = number(shift.get("background_mean"), "+.4f", "sampler gate on IXI")
    out["an_gate_dr_se"] = number(shift.get("brain_corr_se"), ".4f", "sampler gate on IXI over several subjects")
    span = reference_span(root, gpu)
    out["an_gate_ref_span"] = number(span, ".4f", "FP32 DDPM 250 over several seeds on IXI")
    dr, se = shift.get("brain_corr"), shift.get("brain_corr_se")
    out["an_gate_dr_verdict"] = (missing("sampler gate on IXI over several subjects and seeds")
                                 if dr is None or se is None or span is None or not math.isfinite(se) else
                                 f"{abs(dr) / se:.0f} standard errors, and {'more' if abs(dr) > span else 'less'} than "
                                 f"the reference's seeds lie apart: {'a shift, not noise' if abs(dr) > max(3 * se, span) else 'within the noise'}")
    check = reference_self_check(root, gpu)
    out["an_self_check"] = (f"{check[0]}–{check[1]} of {check[2]}" if check else missing("FP32 DDPM 250 over 4 seeds on IXI"))
    fast_ms, opt1_ms = step_ms(root, gpu, "v-s0-fast"), step_ms(root, gpu, "v-s0-opt1")
    out["an_opt1_ratio"] = number(opt1_ms / fast_ms if fast_ms and opt1_ms else None, ".1f", "IXI timings of fast and opt1")
    mantissa, exponent = f"{schedule.abar_host[-1]:.0e}".split("e")
    out["an_terminal_abar"] = f"{mantissa} × 10" + str(int(exponent)).translate(str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹"))
    u = utility(root, gpu)
    out.update(utility_facts(u[u["size"] == BASE_SIZE], "an_util"))
    c = curves(root, gpu)
    lv = plateaus(c)
    out["an_plateau"] = f"{100 * PLATEAU:g} %"
    out["an_still_falling"] = (f"{int((~lv['levelled']).sum())} of {len(lv)}" if len(lv)
                               else missing("IXI training curves (anatomy/train/)"))
    flat = lv[lv["levelled"]]
    out["an_levelled"] = (", ".join(f"`{r['name']}` ({100 * r['drop']:.2f} % over its last {r['interval']:,} steps, to step "
                                    f"{r['step']:,})" for _, r in flat.iterrows()) if len(flat)
                          else "none" if len(lv) else missing("IXI training curves (anatomy/train/)"))
    passed = int((judged["verdict"] == "pass").sum())
    out["an_gate_count"] = (f"{passed} of the {len(judged)} candidates pass" if len(judged)
                            else missing("sampler gate on IXI (anatomy/ with FP32 DDPM 250)"))
    out["an_gate_cause"] = gate_cause(table)
    hist = gate_history(root, gpu)
    fp8 = hist[hist["sampler run"].str.contains("fp8")] if len(hist) else hist
    out["an_gate_fp8"] = ("; ".join(f"{r['sampler run']} on `{r['checkpoint']}`: {r['verdict']}" for _, r in fp8.iterrows())
                          if len(fp8) else missing("FP8 sampler run in the IXI gate"))
    out["an_gate_checkpoints"] = (", ".join(f"`{n}` (step {s:,})" for n, s in hist.groupby("checkpoint", sort=False)["step"].first().items())
                                  if len(hist) else missing("sampler gate on IXI (anatomy/ with FP32 DDPM 250)"))
    out["an_default"] = f"`{DDPM_REFERENCE.describe()}` on every checkpoint"
    passing = table[table["verdict"] == "pass"] if len(table) else table
    fewest = passing[passing["steps"] == passing["steps"].min()] if len(passing) else passing
    out["an_fewest_pass"] = (", ".join(sorted({f"{r.sampler} {r.steps} under `{r.config}`" for r in fewest.itertuples()}))
                             if len(fewest) else "none" if len(table) else missing("sampler gate on IXI"))
    out.update(larger_facts(root, gpu, val, lv))
    p = parity(c)
    out["an_parity"] = (f"inside the band at {int(p['inside'].sum())} of {len(p)} common steps "
                        f"({', '.join(f'{int(s):,}' for s in p['step'])})" if len(p) else missing("TF32 parity run on IXI"))
    return out


def utility_facts(u: pd.DataFrame, prefix: str) -> dict[str, str]:
    """Mean Dice of the v recipe's segmenters trained on real and on synthetic scans (``utility``'s
    rows given), their ratio (``prefix``_share) and that against ``TARGET_UTILITY`` (keys ``prefix``_real,
    _synthetic, _share, _ratio)."""
    out, dice = {}, {}
    for source in ("real", "synthetic"):
        rows = u[(u["segmenter trained on"] == source) & (u["recipe"] == "v")]
        dice[source] = float(rows["Dice"].mean()) if len(rows) else None
        out[f"{prefix}_{source}"] = number(dice[source], ".3f", "segmentation utility (anatomy/anatomy_utility.csv)")
    if dice["real"] and dice["synthetic"] is not None:
        ratio = dice["synthetic"] / dice["real"]
        out[f"{prefix}_share"] = f"{100 * ratio:.1f} % of the real-trained Dice"
        out[f"{prefix}_ratio"] = (f"{out[f'{prefix}_share']} (target ≥ {100 * TARGET_UTILITY:g} %: "
                                  f"{'met' if ratio >= TARGET_UTILITY else 'missed'})")
    else:
        out[f"{prefix}_share"] = out[f"{prefix}_ratio"] = missing("segmentation utility of both sources")
    return out


def _util_step(u: pd.DataFrame, rows: pd.DataFrame) -> str:
    """Which checkpoint the segmentation utility ``u`` sampled, beside the step of the measures' ``rows``: a run
    trained again under the same name replaces its measures, and utility rows of the earlier checkpoint stay."""
    if u.empty or rows.empty:
        return missing("segmentation utility at this size (anatomy/anatomy_utility.csv)")
    have = sorted(int(s) for s in u["checkpoint step"].unique())
    measured = rows.iloc[0]["steps"]
    said = ", ".join(f"{s:,}" for s in have)
    return (f"on the same checkpoint (step {said})" if said == measured else
            f"on an earlier training under the same name, at step {said} (the measures above: step {measured})")


def larger(root: Path, gpu: str | None, split: str = "val") -> pd.DataFrame:
    """``recipes`` at every size beyond ``BASE_SIZE``, a column ``size`` first."""
    frames = [recipes(root, gpu, split, n).assign(size=f"{n}³") for n in sizes(root, gpu)]
    cols = ["size", *recipes(root, None).columns]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def run_device(root: Path, gpu: str | None, name: str) -> dict:
    """A training run's own record, ``train/NAME/env.json`` (the GPU it ran on, how many, the training
    processes' wall seconds), where the run was made on GPUs other than its store's; else {}."""
    path = train_folder(root, gpu) / name / "env.json"
    return json.loads(path.read_text()) if gpu is not None and path.exists() else {}


def larger_runs(root: Path, gpu: str | None) -> pd.DataFrame:
    """Per IXI training run beyond ``BASE_SIZE``: the GPUs it trained on and their global batch, its
    last step, the step and value of its lowest held-out EMA loss, how much that loss fell over its last
    interval (``plateaus``), ms a steady step, and its training process's wall time and GPU-hours."""
    cols = ["run", "size", "GPUs", "global batch", "steps", "best step", "held-out loss", "last drop", "levelled",
            "ms a step", "wall min", "GPU-hours"]
    c = curves(root, gpu)
    c = c[c["size"] != BASE_SIZE]
    levels = plateaus(c).set_index("name")
    rows = []
    for name, g in c[c["step"] > 0].groupby("name"):
        env = run_device(root, gpu, name)
        path = train_folder(root, gpu) / name / "log.csv"
        log = pd.read_csv(path) if path.exists() else pd.DataFrame({"step": [g["step"].max()]})
        best = g.loc[g["loss"].idxmin()]
        wall = sum(env["train_wall_s"]) if "train_wall_s" in env else None
        n = env.get("gpus", 1)
        rows.append({"run": name, "size": f"{size_of(name)}³", "GPUs": f"{n} × {env.get('gpu', gpu_name(gpu))}",
                     "global batch": int(log["global_batch"].iloc[-1]) if "global_batch" in log else None,
                     "steps": int(log["step"].iloc[-1]), "best step": int(best["step"]), "held-out loss": best["loss"],
                     "last drop": f"{100 * levels.loc[name, 'drop']:.1f} %" if name in levels.index else None,
                     "levelled": bool(levels.loc[name, "levelled"]) if name in levels.index else None,
                     "ms a step": step_ms(root, gpu, name), "wall min": wall / 60 if wall else None,
                     "GPU-hours": wall * n / 3600 if wall else None})
    return pd.DataFrame(rows, columns=cols)


def numerics_shift(root: Path, gpu: str | None, name: str, run: str = LARGE_RUN) -> pd.DataFrame:
    """``run``'s samples of training run ``name`` less FP32 DDPM 250's of the same subject and seed,
    which share their noise: per measure, the mean, lowest and highest difference over the pairs FP32
    sampled, how many lie above zero, and how many pairs there are."""
    s = load(root, gpu, "anatomy_samples")
    s = s[s["name"] == name]
    keys = ["subject", "seed"]
    ref = s[s["run"] == REF_RUN].set_index(keys)
    mine = s[s["run"] == run].set_index(keys).reindex(ref.index)
    d = (mine[list(NUMERICS_MEASURES)] - ref[list(NUMERICS_MEASURES)]).dropna()
    return pd.DataFrame({"mean": d.mean(), "low": d.min(), "high": d.max(), "above zero": (d > 0).sum(),
                         "pairs": len(d)}).rename(index=MEASURE_LABELS)


def numerics_facts(root: Path, gpu: str | None, size: int | None) -> dict[str, str]:
    """The numerics gate at ``size`` (``NUMERICS_KEYS``): DDPM 250 under ``fast`` against FP32 DDPM 250
    on the subjects and seeds FP32 sampled, its band verdict, FP32 judged against itself
    (``reference_self_check``), and the paired shift per measure."""
    what = f"FP32 DDPM 250 on IXI at {size}³ (scripts/anatomy.py --runs ddpm250:baseline)"
    names = gate_names(load(root, gpu, "anatomy_samples"), size) if size else []
    if not names:
        return {k: missing(what) for k in NUMERICS_KEYS}
    name = names[-1]
    table = gate(root, gpu, name)
    ref = _rows_of(table, REFERENCE)
    mine = _rows_of(table, GateRun.parse(*LARGE_RUN.split(":")).key())["verdict"]
    verdict = mine.iloc[0] if len(mine) else None
    seeds = int(ref["seeds"].min()) if len(ref) else 0
    check = reference_self_check(root, gpu, name)
    d = numerics_shift(root, gpu, name)
    said = ("was not sampled on them" if verdict is None else "passes its band" if verdict == "pass" else
            "fails its band on " + ", ".join(MEASURE_LABELS[GATE_CRITERIA[c.strip()]]
                                             for c in verdict.removeprefix("fail:").split(",")))
    return {
        "an_big_numerics": f"`{name}`, {ref['subject'].nunique()} validation subjects × {seeds} seeds: DDPM 250 under `fast` {said}",
        "an_big_numerics_state": (f"not calibrated: FP32 against itself needs two halves of at least 2 seeds, and it had "
                                  f"{seeds}, so this verdict decides nothing" if check is None else
                                  f"judged against itself: one half of FP32's seeds inside the other's band on "
                                  f"{check[0]}–{check[1]} of {check[2]} subjects"),
        "an_big_numerics_shift": "; ".join(f"{m} {r['mean']:+.4f} (from {r['low']:+.4f} to {r['high']:+.4f}, above zero in "
                                           f"{int(r['above zero'])} of {int(r['pairs'])})" for m, r in d.iterrows())
                                 if len(d) and d["pairs"].iloc[0] else missing(what),
    }


def larger_facts(root: Path, gpu: str | None, val: pd.DataFrame, levels: pd.DataFrame) -> dict[str, str]:
    """The largest size beyond ``BASE_SIZE`` (prefix ``an_big_``): its v runs under ``fast`` sampled by the
    default sampler (``LARGE_RUN``), each measure beside ``BASE_SIZE``'s, the issue's targets, and how far
    its held-out loss still fell (``levels``, ``plateaus``' table)."""
    what = f"IXI runs at a size other than {BASE_SIZE}³ (scripts/anatomy_measure.sh with SIZE)"
    big = (sizes(root, gpu) or [None])[-1]
    rows = _row(recipes(root, gpu, "val", big), "v", LARGE_RUN) if big else val.iloc[:0]
    base = _row(val, "v", LARGE_RUN)
    out = {"an_big_size": f"{big}³" if big else missing(what), "an_base_size": f"{BASE_SIZE}³"}
    for key, col, spec in (("gap", "gap", "+.3f"), ("spread", "spread between seeds", ".3f"), ("maxspread", "largest spread", ".3f"),
                           ("w1", "W1", ".3f"), ("template_w1", "template W1", ".3f"), ("r", "in-brain r", ".2f"),
                           ("template_r", "template r", ".2f"), ("real_bg", "real background", ".2f"),
                           ("runs", "runs", ""), ("steps", "steps", "")):
        out[f"an_big_{key}"] = _cell(rows, col, spec, what)
        out[f"an_base_{key}"] = _cell(base, col, spec, f"{LARGE_RUN} on IXI at {BASE_SIZE}³")
    if len(rows):
        r = rows.iloc[0]
        met = {f"background within {TARGET_GAP}": abs(r["gap"]) <= TARGET_GAP,
               f"spread between seeds ≤ {TARGET_SPREAD}": r["spread between seeds"] <= TARGET_SPREAD,
               "W1 at or below the template's": r["W1"] <= r["template W1"]}
        base_r = base_runs_r(root, gpu)
        if len(base_r):
            met[f"in-brain r {r['in-brain r']:.3f} above the {BASE_SIZE}³ runs' ({base_r.min():.3f}–{base_r.max():.3f})"] = \
                r["in-brain r"] > base_r.max()
        out["an_big_targets"] = "; ".join(f"{k}: {'met' if v else 'missed'}" for k, v in met.items())
    else:
        out["an_big_targets"] = missing(what)
    u = utility(root, gpu)
    u = u[u["size"] == big] if big else u.iloc[:0]
    out.update(utility_facts(u, "an_big_util"))
    out["an_big_util_step"] = _util_step(u, rows)
    sb = sample_bench(root, [gpu], f"{big}x{big}x{big}") if gpu and big else pd.DataFrame()
    fp32 = sb[(sb["config"] == "baseline") & (sb["sampler"] == "ddpm") & (sb["steps"] == 250) & (sb["batch"] == 1)] \
        if len(sb) else sb
    out["an_big_fp32_s"] = number(float(fp32["s_per_volume_median"].iloc[-1]) if len(fp32) else None, ".0f",
                                  f"FP32 DDPM 250 at {big}³ in sample_bench.csv" if big else what)
    mine = levels[levels["name"].str.endswith(f"-{big}")] if big and len(levels) else levels.iloc[:0]
    out["an_big_state"] = ("; ".join(f"{state}: {', '.join(g['name'])}" for state, g in mine.assign(
        state=mine["levelled"].map({True: "levelled off", False: "still learning"})).groupby("state"))
                           if len(mine) else missing(what))
    dev = [run_device(root, gpu, n) for n in mine["name"]]
    dev = [d for d in dev if d]
    out["an_big_gpus"] = (", ".join(sorted({f"{d.get('gpus', 1)} × {d['gpu']}" for d in dev})) if dev
                          else gpu_name(gpu) if len(mine) else missing(what))
    walls = [(sum(d["train_wall_s"]), d.get("gpus", 1)) for d in dev if "train_wall_s" in d]
    out["an_big_wall"] = (f"{sum(s for s, _ in walls) / 60:.0f} min of training processes' wall time, "
                          f"{sum(s * n for s, n in walls) / 3600:.2f} GPU-hours" if walls
                          else missing(f"the {big}³ runs' wall time (train/NAME/env.json)" if big else what))
    out["an_big_falling"] = (", ".join(f"`{r['name']}` {100 * r['drop']:.1f} % over its last {r['interval']:,} steps"
                                       for _, r in mine.iterrows()) if len(mine) else missing(what))
    ms = [step_ms(root, gpu, n) for n in mine["name"]] if len(mine) else []
    ms = [m for m in ms if m]
    out["an_big_step_ms"] = number(sum(ms) / len(ms) if ms else None, ".1f", what)
    out.update(numerics_facts(root, gpu, big))
    return out


def state(f: dict[str, str]) -> pd.DataFrame:
    """Chapter 14's first table, from its facts ``f`` (``facts``): each measure of the v recipe's samples at 64³ and
    at the larger size against the larger size's targets (issue 75's), with the template's value where it sets the
    bar; '—' where the store lacks it."""
    def get(key: str) -> str:
        return f.get(key, "—")
    rows = [("background mean, sample − scan (mean over seeds)", get("an_v_gap"), get("an_big_gap"), "within ±0.05"),
            ("spread of the background between seeds", get("an_v_spread"), get("an_big_spread"), "≤ 0.05"),
            ("W1 of in-brain intensities", get("an_v_w1"), f"{get('an_big_w1')} (template {get('an_big_template_w1')})",
             "at or below the template's"),
            ("in-brain r", get("an_v_r"), f"{get('an_big_r')} (template {get('an_big_template_r')})", "≥ 0.82"),
            ("segmentation Dice, synthetic- against real-trained", "—", get("an_big_util_share"), "≥ 95 %"),
            ("runs (steps of their checkpoints)", f"{get('an_v_runs')} ({get('an_v_steps')})",
             f"{get('an_big_runs')} ({get('an_big_steps')}), {get('an_big_state')}", "its plateau")]
    return pd.DataFrame(rows, columns=["measure (validation subjects)", "64³", get("an_big_size"), "target"])
