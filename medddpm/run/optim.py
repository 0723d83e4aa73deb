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
    X ← aX + (b·XXᵀ + c·(XXᵀ)²)·X from X = M / ‖M‖_F, on the wide side, in bf16 on a GPU (else float32).
    Three batched matrix products a step, the sums folded into them (``baddbmm``): few launches."""
    a, b, c = NS_COEFFICIENTS
    x = m.to(torch.bfloat16 if m.is_cuda else torch.float32)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    flat = x.reshape(-1, *x.shape[-2:])
    for _ in range(steps):
        s = torch.bmm(flat, flat.mT)
        flat = torch.baddbmm(flat, torch.baddbmm(s, s, s, beta=b, alpha=c), flat, beta=a)
    x = flat.view(x.shape)
    return x.mT if tall else x


def _order(p: Tensor) -> tuple[int, ...] | None:
    """The dimension order in which parameter ``p`` lies in memory, where that is not its own: a channels-last
    kernel's (out, k…, in); None for a contiguous one."""
    if p.ndim == 5 and not p.is_contiguous() and p.is_contiguous(memory_format=torch.channels_last_3d):
        return (0, 2, 3, 4, 1)
    return None


def _matrix(t: Tensor, order: tuple[int, ...] | None) -> Tensor:
    """``t`` (out, in, k…) as an out × in·k… matrix with its columns in ``order`` (``_order`` of its parameter): a
    view of the parameter itself, and of a tensor laid out like it; a copy of one laid out otherwise. The column order
    changes no U Vᵀ but the order of its columns."""
    t = t.permute(order) if order else t
    return t.reshape(t.shape[0], -1)


class Muon(torch.optim.Optimizer):
    """Nesterov momentum whose update is orthogonalized matrix by matrix (a convolution's kernel as
    out × in·k³) and scaled to Adam's RMS (``RMS_SCALE``). The momentum runs over every parameter at
    once (``_foreach``), and the matrices of one shape share one batched Newton–Schulz. No host sync,
    and the rate may be a device tensor: a CUDA graph can capture it."""

    def __init__(self, params, lr: float | Tensor, momentum: float = MUON_MOMENTUM) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum})

    @torch.no_grad()
    def step(self, closure=None) -> None:
        for group in self.param_groups:
            ps = [p for p in group["params"] if p.grad is not None]
            for p in ps:
                if "momentum" not in self.state[p]:
                    self.state[p]["momentum"] = torch.zeros_like(p)
            grads, bufs, mu = [p.grad for p in ps], [self.state[p]["momentum"] for p in ps], group["momentum"]
            torch._foreach_mul_(bufs, mu)
            torch._foreach_add_(bufs, grads)
            ahead = torch._foreach_add(grads, bufs, alpha=mu)  # Nesterov: g + μ·B
            orders = [_order(p) for p in ps]  # each update's columns in its parameter's memory order
            mats = [_matrix(u, o) for u, o in zip(ahead, orders)]
            by_shape: dict[tuple[int, int], list[int]] = defaultdict(list)
            for i, m in enumerate(mats):
                by_shape[tuple(m.shape)].append(i)
            for (rows, cols), idx in by_shape.items():
                updates = orthogonalize(torch.stack([mats[i] for i in idx]))
                updates = updates * (group["lr"] * (RMS_SCALE * math.sqrt(max(rows, cols))))
                torch._foreach_sub_([_matrix(ps[i], orders[i]) for i in idx], list(updates.unbind(0)))


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
