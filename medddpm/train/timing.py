"""What a training run prints about its time (``train``'s ``timing:`` and ``steady state:`` lines) and the steady
step of its ``timing.csv``: pandas only, so the report layer reads runs without PyTorch."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..core.config import TrainConfig


def timing_line(phases: dict[str, float], ready_s: float | None = None, time_limit_s: float | None = None) -> str:
    """``timing: ready 3.2 s, first step 41.0 s, steady steps 150.3 s (14,999 at 10.0 ms), held-out 9.1 s (8),
    checkpoints 2.2 s (4)`` from ``Trainer.phases`` (``ready_s``: seconds from the command's start to training);
    with a time limit, the share of it spent in steady steps."""
    n = int(phases.get("steady steps n", 0))
    per = f" at {1e3 * phases['steady steps'] / n:.1f} ms" if n else ""
    parts = ([f"ready {ready_s:.1f} s"] if ready_s is not None else []) + [
        f"first step {phases.get('first step', 0.0):.1f} s"] + (
        [f"first whole-volume step {phases['switch step']:.1f} s"] if phases.get("switch step n") else []) + [
        f"steady steps {phases.get('steady steps', 0.0):.1f} s ({n:,}{per})",
        f"held-out {phases.get('held-out', 0.0):.1f} s ({int(phases.get('held-out n', 0))})",
        f"checkpoints {phases.get('checkpoints', 0.0):.1f} s ({int(phases.get('checkpoints n', 0))})"]
    if time_limit_s:
        parts.append(f"{100 * phases.get('steady steps', 0.0) / time_limit_s:.1f} % of --time-limit in steady steps")
    return "timing: " + ", ".join(parts)


def steady_intervals(timing: pd.DataFrame) -> pd.Series:
    """ms/step of a run's read-back intervals (``Trainer.timing`` / ``timing.csv``) after the
    first, which holds compilation and warm-up: the steady state."""
    return timing["ms_per_step"].iloc[1:]


def phase_intervals(timing: pd.DataFrame, first: int = 1, last: float = float("inf")) -> pd.Series:
    """ms/step of a run's read-back intervals from step ``first`` to ``last``: by default every one after the first
    step; a curriculum's patches are ``(1, patch_steps)``, its whole volumes ``(patch_steps + 1, ∞)`` (the interval of
    the first whole step, a compilation, left out)."""
    return timing.loc[(timing["step_from"] >= first) & (timing["step_to"] <= last), "ms_per_step"]


def steady_line(timing: pd.DataFrame, cfg: TrainConfig, path: Path) -> str:
    """``train``'s steady-state line: the median read-back interval after the first, or for a curriculum that reached
    whole volumes each phase's apart (``phase_intervals``, whole volumes first), so that neither phase's step reads as
    the other's; empty where no interval follows the first."""
    steady = steady_intervals(timing)
    if not len(steady):
        return ""
    whole, on_patches = phase_intervals(timing, cfg.patch_steps + 1), phase_intervals(timing, 1, cfg.patch_steps)
    if not cfg.patch_steps or whole.empty or on_patches.empty:
        return (f"steady state: {steady.median():.1f} ms/step (median of {len(steady)} read-back intervals after the "
                f"first; {path})")
    return (f"steady state: {whole.median():.1f} ms/step on whole volumes, {on_patches.median():.1f} ms/step on "
            f"{cfg.patch_size}³ patches (medians of {len(whole)} and {len(on_patches)} read-back intervals, each phase's "
            f"first left out; {path})")
