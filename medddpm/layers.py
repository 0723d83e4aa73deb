"""Per-layer accounting of a training step's convolutions (issue 21): every convolution of the
model with its shape and FLOPs per pass, and the kernels of a profiled step attributed to them.

Layers that share a shape (two 64→64 3³ convolutions at 128³, say) cannot be told apart by their
kernels' arguments, so kernels are attributed to a shape *signature* and the table lists every
layer of that signature. FLOPs of a pass are 2 · C_in · C_out · k³ · output voxels · batch; the
forward, data-gradient and weight-gradient passes each do that much (paper §3.2's step is forward
+ backward).

    python -m medddpm.layers --size 128            # the whole-head model's convolutions (no GPU)
    python -m medddpm.layers --profile --config fast --out data/results/<gpu>/fast_path/layers.csv   # GPU
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import Iterable

import pandas as pd
import torch
from torch import nn

from .config import Knobs, ModelConfig, model_preset, replace, run_config
from .model import UNet3D
from .profiling.categories import CONV_PASSES, conv_pass, short_name

PASSES = tuple(CONV_PASSES.values())  # forward convolution, data gradient, weight gradient
OTHER_PASS = "other kernels of the op"  # layout transforms, reductions… launched by a convolution op


def signature(cin: int, cout: int, kernel: int, in_volume: Iterable[int], out_volume: Iterable[int]) -> str:
    """A convolution's shape as one string: '64→64 k3 128³→64³' (a cube's side once)."""
    def vol(v: Iterable[int]) -> str:
        v = tuple(v)
        return f"{v[0]}³" if len(set(v)) == 1 else "×".join(map(str, v))
    return f"{cin}→{cout} k{kernel} {vol(in_volume)}→{vol(out_volume)}"


def conv_layers(cfg: ModelConfig, size: tuple[int, int, int], batch: int = 1) -> pd.DataFrame:
    """One row per 3-D convolution of the U-Net at ``size`` (meta device, seconds on a laptop):
    module name, channels, kernel, stride, input and output volume, signature and GFLOP per pass."""
    cfg.check_size(size)
    with torch.device("meta"):
        model = UNet3D(cfg)
        x = torch.empty(batch, cfg.in_channels, *size)
        t = torch.zeros(batch, dtype=torch.long)
    rows: list[dict] = []
    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv3d):
            def hook(mod, args, out, name=name):
                k, s = mod.kernel_size[0], mod.stride[0]
                vin, vout = tuple(args[0].shape[2:]), tuple(out.shape[2:])
                rows.append({"layer": name, "cin": mod.in_channels, "cout": mod.out_channels, "kernel": k,
                             "stride": s, "in_volume": vin, "out_volume": vout,
                             "signature": signature(mod.in_channels, mod.out_channels, k, vin, vout),
                             "gflop_per_pass": 2 * mod.in_channels * mod.out_channels * k ** 3
                             * math.prod(vout) * out.shape[0] / 1e9})
            hooks.append(m.register_forward_hook(hook))
    with torch.no_grad():
        model(x, t)
    for h in hooks:
        h.remove()
    return pd.DataFrame(rows)


def kernel_signature(input_shape: list[int], weight_shape: list[int], output_volume: Iterable[int] | None) -> str | None:
    """The signature of a profiled convolution from its input (N, C_in, D, H, W) and weight
    (C_out, C_in, k, k, k) shapes and, where the profiler has it, its output volume; None when the
    shapes are not those of a 3-D convolution."""
    if len(input_shape) != 5 or len(weight_shape) != 5:
        return None
    cin, cout, k = input_shape[1], weight_shape[0], weight_shape[2]
    out = tuple(output_volume) if output_volume is not None else tuple(input_shape[2:])
    return signature(cin, cout, k, input_shape[2:], out)


def attribute(kernels: pd.DataFrame, layers: pd.DataFrame) -> pd.DataFrame:
    """Per (signature, pass): the layers of that signature, their count, kernel milliseconds of the
    step, GFLOP (the pass's FLOPs × layers) and achieved TFLOP/s. ``kernels`` has one row per
    kernel with ``signature``, ``pass`` (one of ``PASSES``) and ``duration_us``; kernels whose
    signature is no layer's are kept under 'unattributed'."""
    groups = layers.groupby("signature").agg(layers=("layer", lambda s: ", ".join(s)), count=("layer", "size"),
                                             gflop_per_pass=("gflop_per_pass", "first"))
    k = kernels.assign(signature=kernels["signature"].where(kernels["signature"].isin(groups.index), "unattributed"))
    per = k.groupby(["signature", "pass"], as_index=False).agg(kernels=("duration_us", "size"),
                                                               ms=("duration_us", lambda s: s.sum() / 1e3))
    per = per.join(groups, on="signature")
    per["gflop"] = per["gflop_per_pass"] * per["count"]
    per["tflops"] = per["gflop"] / per["ms"]  # GFLOP/ms = TFLOP/s
    return per.drop(columns="gflop_per_pass").sort_values("ms", ascending=False).reset_index(drop=True)


def _output_volume(event, input_shape: list[int], weight_shape: list[int]) -> list[int] | None:
    """A forward convolution's output volume from the op's recorded padding and stride
    (``aten::cudnn_convolution(input, weight, padding, stride, …)``), where the profiler kept them."""
    concrete = getattr(event, "concrete_inputs", None) or []
    try:
        padding, stride = concrete[2], concrete[3]
        return [(d + 2 * p - k) // s + 1 for d, p, k, s in zip(input_shape[2:], padding, weight_shape[2:], stride)]
    except (IndexError, TypeError, ValueError):
        return None


def profile_step_convs(cfg: ModelConfig, knobs: Knobs, size: tuple[int, int, int], device: torch.device,
                       warmup: int = 3) -> pd.DataFrame:
    """Every kernel launched by a convolution op in one steady training step of ``knobs`` (without
    its CUDA graph: inside a replayed graph the profiler sees no ops), with the op's signature and
    the kernel's pass: columns signature, pass, kernel, duration_us."""
    from torch.profiler import ProfilerActivity, profile

    from .workload import Workload

    work = Workload(cfg, replace(knobs, cuda_graphs=False), size, device)
    for _ in range(warmup):
        work.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        work.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    rows = []
    for e in prof.events():
        if e.name == "aten::convolution_backward":
            grad_out, inp, weight = e.input_shapes[:3]
            sig, default = kernel_signature(inp, weight, grad_out[2:] if grad_out else None), OTHER_PASS
        elif e.name == "aten::cudnn_convolution":
            inp, weight = e.input_shapes[:2]
            sig, default = kernel_signature(inp, weight, _output_volume(e, inp, weight)), OTHER_PASS
        else:
            continue
        stack = [e]
        while stack:  # the op's kernels and those of the ops it called
            ev = stack.pop()
            stack.extend(ev.cpu_children)
            for k in ev.kernels:
                name = short_name(k.name)
                rows.append({"signature": sig or "unattributed", "pass": conv_pass(name) or default, "kernel": name,
                             "duration_us": k.duration})
    return pd.DataFrame(rows, columns=["signature", "pass", "kernel", "duration_us"])


def isolated_ms(row: pd.Series, which: str, dtype: torch.dtype, device: torch.device, reps: int = 20) -> float:
    """Median milliseconds of one call of ``which`` pass of the convolution ``row`` (a
    ``conv_layers`` row) on its own, NDHWC, under the process's cuDNN flags (``layer_table`` turns
    the autotuner on: the shape's best that cuDNN offers PyTorch)."""
    import torch.nn.functional as F

    from .bench import Timer

    fmt = torch.channels_last_3d
    x = torch.randn(1, row["cin"], *row["in_volume"], device=device, dtype=dtype).contiguous(memory_format=fmt)
    w = torch.randn(row["cout"], row["cin"], *(row["kernel"],) * 3, device=device, dtype=dtype).contiguous(memory_format=fmt)
    stride, pad = (row["stride"],) * 3, (row["kernel"] // 2,) * 3
    g = torch.randn(1, row["cout"], *row["out_volume"], device=device, dtype=dtype).contiguous(memory_format=fmt)
    mask = {"data gradient": (True, False, False), "weight gradient": (False, True, False)}

    def call():
        if which == PASSES[0]:
            return F.conv3d(x, w, None, stride, pad)
        return torch.ops.aten.convolution_backward(g, x, w, None, stride, pad, (1, 1, 1), False, (0, 0, 0), 1, mask[which])

    for _ in range(3):
        call()
    timer, times = Timer(device), []
    for _ in range(reps):
        a = timer.mark()
        call()
        times.append(timer.ms(a, timer.mark()))
    return float(pd.Series(times).median())


def layer_table(cfg: ModelConfig, knobs: Knobs, size: tuple[int, int, int], device: torch.device) -> pd.DataFrame:
    """``attribute`` of a profiled step, each (signature, pass) beside its isolated best × its layer
    count and the milliseconds lost to it, the largest loss first."""
    layers = conv_layers(cfg, size)
    table = attribute(profile_step_convs(cfg, knobs, size, device), layers)
    torch.backends.cudnn.benchmark = True  # the isolated times: cuDNN's autotuner picks each shape's best
    dtype = torch.bfloat16 if knobs.precision == "bf16" else torch.float32
    first = layers.drop_duplicates("signature").set_index("signature")
    best = [isolated_ms(first.loc[s], p, dtype, device) * c if s in first.index and p in PASSES else float("nan")
            for s, p, c in zip(table["signature"], table["pass"], table["count"])]
    table["isolated_ms"] = best
    table["isolated_tflops"] = table["gflop"] / table["isolated_ms"]
    table["lost_ms"] = table["ms"] - table["isolated_ms"].fillna(0)
    return table.sort_values("lost_ms", ascending=False).reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m medddpm.layers", description="the model's convolutions, by shape")
    p.add_argument("--model", default="whole-head")
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--profile", action="store_true", help="profile a training step on the GPU (needs CUDA)")
    p.add_argument("--config", default="fast", help="run configuration of the profiled step")
    p.add_argument("--out", help="CSV for the profiled table (with --profile)")
    a = p.parse_args(argv)
    try:
        cfg = model_preset(a.model)
        if a.profile:
            knobs = run_config(a.config, training=True)
            if not torch.cuda.is_available():
                raise ValueError("--profile needs a CUDA GPU; this machine has none")
            from .io import atomic_path

            t = layer_table(cfg, knobs, (a.size,) * 3, torch.device("cuda"))
            if a.out:
                with atomic_path(a.out, ".csv") as tmp:
                    t.to_csv(tmp, index=False)
            print(t.head(20).round(3).to_string())
            return 0
        t = conv_layers(cfg, (a.size,) * 3)
    except ValueError as exc:
        print(f"layers: error: {exc}", file=sys.stderr)
        return 2
    g = t.groupby("signature", sort=False).agg(layers=("layer", "size"), gflop=("gflop_per_pass", "sum"))
    print(g.sort_values("gflop", ascending=False).round(1).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
