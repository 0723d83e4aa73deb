"""A post-hoc EMA (Karras et al. 2024, EDM2 §3): during training, EMAs of power-function profile are kept and
snapshotted; after it, an EMA of any other length is rebuilt from the snapshots by least squares, so the EMA's
length is chosen on the held-out loss without training again.

A power-function EMA of exponent γ averages the weights θ(τ) up to update t with density (γ+1) τ^γ / t^(γ+1): its
update is θ̂_t = β_t θ̂_{t−1} + (1 − β_t) θ_t with β_t = (1 − 1/t)^(γ+1), and its relative width is
σ_rel = √((γ+1) / ((γ+2)² (γ+3))) (the profile's standard deviation over t). Time is counted in EMA updates (one every
``TrainConfig.ema_every`` steps), so each snapshot averages exactly the piecewise-constant weights it saw."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..core.config import POSTHOC_SIGMA_MAX
from ..core.io import atomic_path

FOLDER = "posthoc"  # <run>/posthoc/<step>.pt: the snapshots


def gamma_of(sigma_rel: float) -> float:
    """The exponent γ ≥ 0 of the power-function profile of relative width ``sigma_rel`` (EDM2 eq. 3 solved for γ:
    the real root of σ²(γ+2)²(γ+3) − (γ+1) = 0 above zero)."""
    if not 0 < sigma_rel < POSTHOC_SIGMA_MAX:
        raise ValueError(f"sigma_rel must be in (0, {POSTHOC_SIGMA_MAX:.3f}), got {sigma_rel}")
    s2 = sigma_rel ** 2
    roots = np.roots([s2, 7 * s2, 16 * s2 - 1, 12 * s2 - 1])  # σ²(γ³ + 7γ² + 16γ + 12) − γ − 1
    return float(max(r.real for r in roots if abs(r.imag) < 1e-9 and r.real >= 0))


class PowerEMAs:
    """Power-function EMAs of the parameters ``named`` (name, tensor), one per σ_rel, updated together (one
    multi-tensor lerp each)."""

    def __init__(self, named: list[tuple[str, Tensor]], sigma_rels: tuple[float, ...]) -> None:
        self.names = [n for n, _ in named]
        params = [p for _, p in named]
        self.sigma_rels = tuple(sigma_rels)
        self.gammas = [gamma_of(s) for s in self.sigma_rels]
        self.updates = 0
        self.averages = [[p.detach().clone().float() for p in params] for _ in self.sigma_rels]

    @torch.no_grad()
    def update(self, params: list[Tensor]) -> None:
        """One EMA update of every profile from ``params`` (the first copies them: β_1 = 0)."""
        self.updates += 1
        current = [p.detach().float() for p in params]
        for gamma, avg in zip(self.gammas, self.averages):
            torch._foreach_lerp_(avg, current, 1 - (1 - 1 / self.updates) ** (gamma + 1))

    def state_dict(self) -> dict:
        return {"sigma_rels": list(self.sigma_rels), "updates": self.updates,
                "averages": [[t.detach().cpu() for t in avg] for avg in self.averages]}

    def load_state_dict(self, state: dict) -> None:
        if tuple(state["sigma_rels"]) != self.sigma_rels:
            raise ValueError(f"post-hoc EMAs of σ_rel {state['sigma_rels']}, not {list(self.sigma_rels)}")
        self.updates = int(state["updates"])
        for avg, saved in zip(self.averages, state["averages"]):
            torch._foreach_copy_(avg, [t.to(a.device) for t, a in zip(saved, avg)])


def overlaps(ts: np.ndarray, gammas: np.ndarray, t2: np.ndarray, g2: np.ndarray) -> np.ndarray:
    """∫ p_i p_j dτ of the power-function profiles (t_i, γ_i) × (t_j, γ_j), with times scaled to the largest (the
    integral of two profiles on [0, min(t_i, t_j)], in closed form)."""
    scale = max(ts.max(), t2.max())
    a, b = np.log(ts / scale)[:, None], np.log(t2 / scale)[None, :]  # in logs: long profiles underflow otherwise
    ga, gb = gammas[:, None], g2[None, :]
    return np.exp(np.log((ga + 1) * (gb + 1) / (ga + gb + 1)) + (ga + gb + 1) * np.minimum(a, b)
                  - (ga + 1) * a - (gb + 1) * b)


def weights(snapshots: list[tuple[int, float]], t: int, sigma_rel: float) -> np.ndarray:
    """The least-squares combination (EDM2 §3.2) of ``snapshots`` — (updates, γ) each — whose profile is nearest,
    in L2, to the power-function profile of ``sigma_rel`` at update ``t``, its weights constrained to sum to 1 (a
    Lagrange multiplier): every profile integrates to 1, so the combination stays an average of the weights. Unconstrained,
    few snapshots leave the sum off 1 and scale every parameter with it (0.93 for σ_rel 0.03 from 4 snapshots of 0.05 and
    0.10)."""
    ts, gs = (np.array([s[i] for s in snapshots], dtype=np.float64) for i in (0, 1))
    n = len(ts)
    kkt = np.block([[overlaps(ts, gs, ts, gs), np.ones((n, 1))], [np.ones((1, n)), np.zeros((1, 1))]])
    target = overlaps(ts, gs, np.array([float(t)]), np.array([gamma_of(sigma_rel)]))[:, 0]
    return np.linalg.lstsq(kkt, np.append(target, 1.0), rcond=None)[0][:n]


def snapshot_path(run: str | Path, step: int) -> Path:
    return Path(run) / FOLDER / f"{step:09d}.pt"


def save_snapshot(run: str | Path, step: int, emas: PowerEMAs) -> Path:
    """``emas`` at optimizer step ``step`` to ``<run>/posthoc/<step>.pt``, atomically: what ``reconstruct`` reads."""
    path = snapshot_path(run, step)
    with atomic_path(path) as tmp:
        torch.save({"step": step, "names": emas.names, **emas.state_dict()}, tmp)
    return path


def snapshots(run: str | Path, step: int | None = None) -> list[Path]:
    """The snapshot files of ``run`` up to ``step`` (every one: None), oldest first; FileNotFoundError where none."""
    found = [p for p in sorted((Path(run) / FOLDER).glob("*.pt")) if step is None or int(p.stem) <= step]
    if not found:
        raise FileNotFoundError(f"{Path(run) / FOLDER} holds no snapshot"
                                + (f" at or before step {step}" if step is not None else "")
                                + ": train with --posthoc-ema to keep them")
    return found


def load(run: str | Path, step: int | None = None) -> list[dict]:
    """The snapshots of ``run`` up to ``step`` (``snapshots``), read once for every width ``reconstruct`` rebuilds."""
    return [torch.load(p, map_location="cpu", weights_only=True) for p in snapshots(run, step)]


def reconstruct(loaded: list[dict], sigma_rel: float) -> tuple[dict[str, Tensor], dict]:
    """The parameters (by name) of the EMA of ``sigma_rel`` at the newest of the ``loaded`` snapshots (``load``),
    rebuilt from all of them, and how: its step, update count and each snapshot's weight."""
    parts = [(s["updates"], gamma_of(sr), avg) for s in loaded for sr, avg in zip(s["sigma_rels"], s["averages"])]
    last = loaded[-1]
    w = weights([(u, g) for u, g, _ in parts], last["updates"], sigma_rel)
    params = {name: sum(float(wi) * avg[k].double() for wi, (_, _, avg) in zip(w, parts)).float()
              for k, name in enumerate(last["names"])}
    return params, {"step": int(last["step"]), "updates": int(last["updates"]), "sigma_rel": sigma_rel,
                    "snapshots": len(loaded), "weights": [float(x) for x in w]}
