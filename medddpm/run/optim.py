"""The training step's optimizers: Adam (paper §3.2), and Muon for the U-Net's hidden weight matrices with Adam for
the rest (issue 75's optimizer lever: Jordan et al. 2024's orthogonalized momentum, Liu et al. 2025's update scale)."""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch
from torch import Tensor, nn

from ..core.config import OPTIMIZERS, Knobs

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # the quintic Newton–Schulz step's (a, b, c) (Jordan et al. 2024): five
# steps push every singular value of a normalised matrix to about 0.7–1.2, which is all an update needs
NS_STEPS = 5  # Newton–Schulz iterations per update
MUON_MOMENTUM = 0.95  # Muon's Nesterov momentum (Jordan et al. 2024)
RMS_SCALE = 0.2  # an orthogonal A×B update × 0.2·sqrt(max(A, B)) has about Adam's update RMS (Liu et al. 2025), so
# Muon runs at the recipe's rate and schedule, with no rate of its own


def orthogonalize(m: Tensor, steps: int = NS_STEPS) -> Tensor:
    """≈ U Vᵀ of every matrix M = U S Vᵀ of a batch (…, A, B): the quintic Newton–Schulz iteration
    X ← aX + (b·XXᵀ + c·(XXᵀ)²)·X from X = M / ‖M‖_F, on the wide side, in bf16 on a GPU (float32 elsewhere)."""
    a, b, c = NS_COEFFICIENTS
    x = m.to(torch.bfloat16 if m.is_cuda else torch.float32)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        s = x @ x.mT
        x = a * x + (b * s + c * (s @ s)) @ x
    return (x.mT if tall else x).to(m.dtype)


class Muon(torch.optim.Optimizer):
    """Nesterov momentum whose update is orthogonalized matrix by matrix (a convolution's kernel as
    out × in·k³) and scaled to Adam's RMS (``RMS_SCALE``). Parameters of one shape share one batched
    Newton–Schulz. No host sync, and the rate may be a device tensor: a CUDA graph can capture it."""

    def __init__(self, params, lr: float | Tensor, momentum: float = MUON_MOMENTUM) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum})

    @torch.no_grad()
    def step(self, closure=None) -> None:
        for group in self.param_groups:
            by_shape: dict[torch.Size, list[nn.Parameter]] = defaultdict(list)
            for p in group["params"]:
                if p.grad is not None:
                    by_shape[p.shape].append(p)
            mu = group["momentum"]
            for shape, ps in by_shape.items():
                grads = [p.grad for p in ps]
                for p in ps:
                    if "momentum" not in self.state[p]:
                        self.state[p]["momentum"] = torch.zeros_like(p)
                bufs = [self.state[p]["momentum"] for p in ps]
                torch._foreach_mul_(bufs, mu)
                torch._foreach_add_(bufs, grads)
                ahead = torch._foreach_add(grads, bufs, alpha=mu)  # Nesterov: g + μ·B
                rows, cols = shape[0], math.prod(shape[1:])
                updates = orthogonalize(torch.stack([u.reshape(rows, cols) for u in ahead]))
                rate = group["lr"] * (RMS_SCALE * math.sqrt(max(rows, cols)))
                for p, u in zip(ps, updates):
                    p.sub_(u.view(shape) * rate)


class Hybrid:
    """Optimizers over disjoint parameters, stepped, zeroed and saved as one: Muon's matrices, Adam's rest."""

    def __init__(self, **parts: torch.optim.Optimizer) -> None:
        self.parts = parts

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for o in self.parts.values() for g in o.param_groups]

    def step(self) -> None:
        for o in self.parts.values():
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.parts.values():
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {name: o.state_dict() for name, o in self.parts.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != set(self.parts):
            raise ValueError(f"an optimizer state of {sorted(state)}, not of {sorted(self.parts)}")
        for name, o in self.parts.items():
            o.load_state_dict(state[name])


def make_optimizer(model: nn.Module, lr: float, knobs: Knobs, device: torch.device,
                   betas: tuple[float, float] = (0.9, 0.999), kind: str = "adam") -> torch.optim.Optimizer | Hybrid:
    """Adam (paper §3.2) with ``betas`` over ``model``'s parameters; with ``kind`` "muon", Muon over its hidden weight
    matrices (``model.hidden_matrices()``) and Adam over the rest. Adam is fused on CUDA when asked, capturable when
    the step is a CUDA graph, and then every rate is a device tensor that the graph reads at every replay (``set_lr``
    writes it)."""
    if kind not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {kind!r}")
    cuda = device.type == "cuda"
    graphed = bool(knobs.cuda_graphs and cuda)

    def rate() -> float | Tensor:
        return torch.tensor(lr, dtype=torch.float32, device=device) if graphed else lr

    def adam(params) -> torch.optim.Adam:
        return torch.optim.Adam(params, lr=rate(), betas=betas, fused=bool(knobs.fused_adam and cuda) or None,
                                capturable=graphed)

    if kind == "adam":
        return adam(model.parameters())
    matrices = {id(p) for p in model.hidden_matrices()}
    return Hybrid(muon=Muon([p for p in model.parameters() if id(p) in matrices], rate()),
                  adam=adam([p for p in model.parameters() if id(p) not in matrices]))


def set_lr(optimizer: torch.optim.Optimizer | Hybrid, lr: float) -> None:
    """Every parameter group's rate to ``lr``: written into the device tensor a captured step reads, else set."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr
