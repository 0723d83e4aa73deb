"""Time to a trained model (issue 75): the recipe A/B runs of a results store (manifest kind ``recipe-ab``), each
arm's held-out loss against the training clock, and its time to the target the manifest fixes."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from . import manifests
from .present import gpu_name

KIND = "recipe-ab"


def _decimal(flags: str) -> str:
    """An arm's flags with their rates in decimals (``--lr 2e-4`` → ``--lr 0.0002``: the same option, as prose reads)."""
    return re.sub(r"(?<![\w.-])(\d+(?:\.\d+)?e-\d+)(?![\w.-])",
                  lambda m: np.format_float_positional(float(m[1]), trim="-"), flags)


def _ready(stdout: Path) -> float:
    """Seconds from the command's start to training (``train``'s ``timing: ready …`` line), NaN without it."""
    found = re.search(r"timing: ready ([\d.]+) s", stdout.read_text()) if stdout.exists() else None
    return float(found.group(1)) if found else float("nan")


def curves(run: Path, manifest: dict) -> pd.DataFrame:
    """One row per (arm, evaluation): the EMA's held-out loss (mean over subjects and t), the step, and the training
    clock (seconds of steps, evaluations left out) plus the arm's start-up (``ready``). Step 0 is left out: its clock
    held that evaluation's own time in runs before the clock was read first (``run.json`` notes)."""
    frames = []
    for arm, spec in manifest["arms"].items():
        h = pd.read_csv(run / arm / "heldout.csv").query("weights == 'ema' and step > 0")
        g = h.groupby("step", as_index=False).agg(loss=("loss", "mean"), seconds=("seconds", "first"))
        frames.append(g.assign(arm=arm, flags=_decimal(spec["flags"]), recipe=spec.get("recipe_default", ""),
                               wall=g["seconds"] + _ready(run / arm / "stdout.txt")))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["step", "loss", "seconds", "arm", "flags", "recipe", "wall"])


def records(curve: pd.DataFrame, target: float) -> pd.DataFrame:
    """Per arm: the last step and held-out loss, and the first evaluation at or below ``target``: its step, the
    training clock and the wall time from the command's start, both less the judge's own evaluations (NaN: not
    reached); reached first, fastest first."""
    rows = []
    for arm, g in curve.groupby("arm", sort=False):
        hit = g[g["loss"] <= target].head(1)
        last = g.iloc[-1]
        rows.append({"arm": arm, "recipe": last["recipe"], "flags": last["flags"], "steps": int(last["step"]), "final loss": last["loss"],
                     "step at target": hit["step"].iloc[0] if len(hit) else float("nan"),
                     "clock at target (s)": hit["seconds"].iloc[0] if len(hit) else float("nan"),
                     "wall at target (s)": hit["wall"].iloc[0] if len(hit) else float("nan")})
    df = pd.DataFrame(rows)
    return df.sort_values(["wall at target (s)", "final loss"]).reset_index(drop=True) if len(df) else df


def fastest(run: Path, manifest: dict) -> pd.Series | None:
    """The ``records`` row of ``run``'s arm that reached its manifest's target first, None where none did."""
    rec = records(curves(run, manifest), manifest["target"]["heldout"]).dropna(subset=["wall at target (s)"])
    return rec.iloc[0] if len(rec) else None


def newest(root: str | Path, gpus: list[str]) -> tuple[str, Path, dict] | None:
    """The newest recipe A/B run on ``gpus``, None where the store has none."""
    found = manifests.runs(root, KIND, gpus)
    return found[0] if found else None


def paper_recipe_steps(root: str | Path, target: float, gpus: list[str] | None = None) -> pd.DataFrame:
    """The 64³ v runs of chapter 14 (the paper's recipe at the book's rate: Adam at a constant 1e-4, EMA 0.995; each
    GPU's ``anatomy/train/v-s*-fast``): per run, its last step and the first step at or below ``target`` (NaN: not
    reached)."""
    rows = []
    for path in sorted(Path(root).glob("*/anatomy/train/v-s*-fast/heldout.csv")):
        if gpus is not None and path.parts[-5] not in gpus:
            continue
        g = pd.read_csv(path).query("weights == 'ema'").groupby("step")["loss"].mean()
        hit = g[g <= target]
        rows.append({"gpu": path.parts[-5], "run": path.parent.name, "steps": int(g.index.max()),
                     "lowest loss": g.min(), "step at target": hit.index[0] if len(hit) else float("nan")})
    return pd.DataFrame(rows, columns=["gpu", "run", "steps", "lowest loss", "step at target"])


def record_table(root: str | Path, gpus: list[str], target: float) -> pd.DataFrame:
    """The modded-nanogpt-style record table at 64³: one row per recipe that held the record, the paper's first (its
    chapter-14 runs: steps only, they ran on another GPU), then each recipe A/B run's fastest arm to ``target``."""
    rows = []
    paper = paper_recipe_steps(root, target, gpus=None)
    hit = paper["step at target"].dropna()
    if len(hit):
        first = paper.loc[hit.idxmin()]
        rows.append({"date": "", "change": "Med-DDPM's recipe at the book's rate (Adam at a constant 10⁻⁴, EMA 0.995)",
                     "steps to target": int(first["step at target"]), "wall to target (s)": float("nan"),
                     "GPUs": gpu_label(first["gpu"]), "run": f"{first['gpu']}/anatomy/train/{first['run']}"})
    for gpu, run, m in reversed(manifests.runs(root, KIND, gpus)):
        best = fastest(run, m)
        if best is not None:
            rows.append({"date": m["date"], "change": f"{best['arm']}: {best['flags']}",
                         "steps to target": int(best["step at target"]), "wall to target (s)": best["wall at target (s)"],
                         "GPUs": gpu_label(gpu), "run": f"{gpu}/{run.relative_to(Path(root) / gpu)}"})
    return pd.DataFrame(rows, columns=["date", "change", "steps to target", "wall to target (s)", "GPUs", "run"])


def gpu_label(slug: str) -> str:
    """One GPU of a store folder, by its readers' name."""
    return f"1 × {gpu_name(slug)}"
