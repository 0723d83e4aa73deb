"""Parameter and FLOP counts of the U-Net, per block (paper Fig. 3), computed on the meta device
so a 128³ count takes seconds on a laptop. FLOPs are ``torch.utils.flop_counter`` forward FLOPs
(2 per multiply-accumulate of convolutions, linear layers and attention matmuls)."""
from __future__ import annotations

from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..core.config import ModelConfig
from .model import UNet3D, count_parameters


def _blocks(model: UNet3D) -> list[tuple[str, torch.nn.Module]]:
    named = [(f"input_blocks.{i}", b) for i, b in enumerate(model.input_blocks)]
    named.append(("middle_block", model.middle_block))
    named += [(f"output_blocks.{i}", b) for i, b in enumerate(model.output_blocks)]
    named.append(("out", model.out))
    return named


def summarize(cfg: ModelConfig, size: tuple[int, int, int], batch: int = 1) -> dict[str, Any]:
    """Total parameters and forward FLOPs at (batch, in_channels, *size), and one row per block."""
    cfg.check_size(size)
    with torch.device("meta"):
        model = UNet3D(cfg)
        x = torch.empty(batch, cfg.in_channels, *size)
        t = torch.zeros(batch, dtype=torch.long)
    shapes: dict[str, tuple[list[int], list[int]]] = {}
    hooks = []
    for name, block in _blocks(model):
        def hook(_module, args, out, name=name):
            shapes[name] = (list(args[0].shape), list(out.shape))
        hooks.append(block.register_forward_hook(hook))
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        out = model(x, t)
    for h in hooks:
        h.remove()
    per_module = counter.get_flop_counts()

    def flops_of(fqn: str) -> int:
        key = f"UNet3D.{fqn}"
        return int(sum(per_module.get(key, {}).values()))

    blocks = []
    for name, block in _blocks(model):
        kinds = [type(m).__name__ for m in (block if isinstance(block, torch.nn.ModuleList) else [block])]
        blocks.append({
            "block": name, "layers": "+".join(kinds), "in_shape": shapes[name][0],
            "out_shape": shapes[name][1], "channels": shapes[name][1][1],
            "params": count_parameters(block), "flops": flops_of(name),
        })
    return {
        "model": cfg.name, "input_shape": list(x.shape), "output_shape": list(out.shape),
        "parameters": count_parameters(model), "forward_flops": int(counter.get_total_flops()),
        "time_embed_params": count_parameters(model.time_embed), "blocks": blocks,
    }
