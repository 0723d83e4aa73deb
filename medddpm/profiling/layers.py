"""Per-layer accounting of a training step (issue 21): every convolution of the model with its
shape and FLOPs per pass, and the kernels of a profiled step attributed to them; every GroupNorm
with the bytes it must move, timed in both implementations of the fast path.

Layers that share a shape (two 64→64 3³ convolutions at 128³, say) cannot be told apart by their
kernels' arguments, so kernels are attributed to a shape *signature* and the table lists every
layer of that signature. FLOPs of a pass are 2 · C_in · C_out · k³ · output voxels · batch; the
forward, data-gradient and weight-gradient passes each do that much (paper §3.2's step is forward
+ backward).

    python -m medddpm.profiling.layers --size 128            # the whole-head model's convolutions (no GPU)
    python -m medddpm.profiling.layers --profile --config fast --out data/results/<gpu>/fast_path/layers.csv   # GPU
    python -m medddpm.profiling.layers --norms --out data/results/<gpu>/fast_path/norms.csv                    # GPU

A GroupNorm(+SiLU) of N elements stored in 2 bytes moves at least 3·2N bytes forward (read x for
the statistics, read x and write y) and 5·2N backward (read x and dy for the reductions, read both
and write dx): ``MIN_PASSES``.
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import Iterable

import pandas as pd
import torch
from torch import nn

from ..core.config import Knobs, ModelConfig, model_preset, run_config, ungraphed
from ..net.model import GroupNorm, UNet3D
from .categories import CONV_PASSES, conv_pass, short_name

MIN_PASSES = {"forward": 3, "step": 8}  # tensor-sized reads + writes of a GroupNorm: forward; forward + backward
PASSES = tuple(CONV_PASSES.values())  # forward convolution, data gradient, weight gradient
THIN_CONV_OPS = ("medddpm::conv3d_thin", "medddpm::conv3d_thin_backward")  # the Triton thin convolutions' ops
OTHER_PASS = "other kernels of the op"  # layout transforms, reductions… launched by a convolution op


def volume_text(v: Iterable[int]) -> str:
    """'128³' for a cube, else the sides joined by '×' ('4096' for a flat token axis)."""
    v = tuple(v)
    return f"{v[0]}³" if len(v) == 3 and len(set(v)) == 1 else "×".join(map(str, v))


def signature(cin: int, cout: int, kernel: int, in_volume: Iterable[int], out_volume: Iterable[int]) -> str:
    """A convolution's shape as one string: '64→64 k3 128³→64³' (a cube's side once)."""
    return f"{cin}→{cout} k{kernel} {volume_text(in_volume)}→{volume_text(out_volume)}"


def _module_rows(cfg: ModelConfig, size: tuple[int, int, int], batch: int, kind: type, row, **model_kw) -> pd.DataFrame:
    """One ``row(name, module, input, output)`` per call of a ``kind`` module in a forward pass of
    the U-Net at ``size`` on the meta device (no memory, seconds on a laptop)."""
    cfg.check_size(size)
    with torch.device("meta"):
        model = UNet3D(cfg, **model_kw)
        x = torch.empty(batch, cfg.in_channels, *size)
        t = torch.zeros(batch, dtype=torch.long)
    rows: list[dict] = []
    hooks = [m.register_forward_hook(lambda mod, args, out, name=name: rows.append(row(name, mod, args[0], out)))
             for name, m in model.named_modules() if isinstance(m, kind)]
    with torch.no_grad():
        model(x, t)
    for h in hooks:
        h.remove()
    return pd.DataFrame(rows)


def conv_layers(cfg: ModelConfig, size: tuple[int, int, int], batch: int = 1) -> pd.DataFrame:
    """One row per 3-D convolution of the U-Net at ``size`` (meta device, seconds on a laptop):
    module name, channels, kernel, stride, input and output volume, signature and GFLOP per pass."""
    def row(name: str, mod: nn.Conv3d, x: torch.Tensor, out: torch.Tensor) -> dict:
        k, vin, vout = mod.kernel_size[0], tuple(x.shape[2:]), tuple(out.shape[2:])
        return {"layer": name, "cin": mod.in_channels, "cout": mod.out_channels, "kernel": k, "stride": mod.stride[0],
                "in_volume": vin, "out_volume": vout, "signature": signature(mod.in_channels, mod.out_channels, k, vin, vout),
                "gflop_per_pass": 2 * mod.in_channels * mod.out_channels * k ** 3 * math.prod(vout) * out.shape[0] / 1e9}
    return _module_rows(cfg, size, batch, nn.Conv3d, row)


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

    work = Workload(cfg, ungraphed(knobs), size, device)
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
        elif e.name in THIN_CONV_OPS:  # medddpm/net/kernels.py: (x, weight, …) or (dy, x, weight, …); same volume out
            inp, weight = e.input_shapes[:2] if e.name == THIN_CONV_OPS[0] else e.input_shapes[1:3]
            sig, default = kernel_signature(inp, weight, None), OTHER_PASS
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

    return _median_ms(call, device, reps)


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


def norm_layers(cfg: ModelConfig, size: tuple[int, int, int], batch: int = 1) -> pd.DataFrame:
    """One row per GroupNorm of the U-Net at ``size`` (meta device): module name, channels,
    groups, volume, whether SiLU follows and whether a time embedding is added to its input, its
    signature ('64 ch 128³ +emb SiLU'), elements and the minimal megabytes (2-byte activations)."""
    def row(name: str, mod: nn.GroupNorm, x: torch.Tensor, out: torch.Tensor) -> dict:
        add = name.endswith("out_layers.0")  # a ResBlock's second norm: h + emb
        n, vol = x.numel(), tuple(x.shape[2:])
        return {"layer": name, "channels": x.shape[1], "groups": mod.num_groups, "volume": vol, "silu": mod.silu,
                "add": add, "signature": f"{x.shape[1]} ch {volume_text(vol)}{' +emb' if add else ''}"
                                         f"{' SiLU' if mod.silu else ''}",
                "elements": n, **{f"min_{k}_mb": p * 2 * n / 1e6 for k, p in MIN_PASSES.items()}}
    return _module_rows(cfg, size, batch, nn.GroupNorm, row, fused_ops=True)


def norm_ms(row: pd.Series, impl: str, backward: bool, device: torch.device, reps: int = 10) -> float:
    """Median milliseconds of one GroupNorm ``row`` (a ``norm_layers`` row) as the fast path's
    model runs it (``model.GroupNorm``, bf16 NDHWC, with its addend), forward only or forward +
    backward, replayed as a CUDA graph, in ``impl``: "inductor" (the fused norm, compiled: the
    kernels Inductor generates) or "triton" (``kernels.group_norm_silu``)."""
    if impl not in ("inductor", "triton"):
        raise ValueError(f"impl must be 'inductor' or 'triton', got {impl!r}")
    c = int(row["channels"])
    norm = GroupNorm(int(row["groups"]), c, fp32=True, fused=True, silu=bool(row["silu"]),
                     triton=impl == "triton").to(device).requires_grad_(backward)
    fn = norm
    if impl == "inductor":
        torch._dynamo.reset()
        fn = torch.compile(norm)
    x = torch.randn(1, c, *map(int, row["volume"]), device=device, dtype=torch.bfloat16)
    x = x.movedim(1, -1).contiguous().movedim(-1, 1).requires_grad_(backward)
    a = torch.randn(1, c, device=device, dtype=torch.bfloat16, requires_grad=backward) if row["add"] else None
    g = torch.randn_like(x)

    def call():
        with torch.set_grad_enabled(backward):
            y = fn(x, add=a)
            if backward:
                y.backward(g)

    return _replay_ms(call, device, reps)


def _replay_ms(call, device: torch.device, reps: int) -> float:
    """Median milliseconds of ``call`` replayed as a CUDA graph (as the fast path runs it: no host
    overhead), or called plainly on a CPU."""
    from ..run.engine import side_stream

    run = call
    if device.type == "cuda":
        with side_stream(device):
            for _ in range(3):
                call()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        run = graph.replay
    return _median_ms(run, device, reps)


def _median_ms(run, device: torch.device, reps: int) -> float:
    """Median milliseconds of ``run()`` over ``reps`` calls after 3 untimed ones (``bench.Timer``)."""
    from .bench import Timer

    for _ in range(3):
        run()
    timer, times = Timer(device), []
    for _ in range(reps):
        t0 = timer.mark()
        run()
        times.append(timer.ms(t0, timer.mark()))
    return float(pd.Series(times).median())


def norm_table(cfg: ModelConfig, size: tuple[int, int, int], device: torch.device,
               min_elements: int = 4_000_000) -> pd.DataFrame:
    """Per GroupNorm signature with at least ``min_elements`` (they hold nearly all the bytes):
    its layers, the minimal megabytes of the step's norms, and the milliseconds of each
    implementation forward and forward + backward (per layer × count), with the bandwidth that
    the minimal bytes imply (TB/s)."""
    layers = norm_layers(cfg, size)
    big = layers[layers["elements"] >= min_elements]
    rows = []
    for sig, group in big.groupby("signature", sort=False):
        row = group.iloc[0]
        out = {"signature": sig, "layers": ", ".join(group["layer"]), "count": len(group),
               "min_forward_mb": row["min_forward_mb"] * len(group), "min_step_mb": row["min_step_mb"] * len(group)}
        for impl in ("inductor", "triton"):
            for which, backward in (("forward", False), ("step", True)):
                ms = norm_ms(row, impl, backward, device) * len(group)
                out[f"{impl}_{which}_ms"] = ms
                out[f"{impl}_{which}_tbs"] = out[f"min_{which}_mb"] / ms / 1e3  # MB/ms = GB/s → TB/s
        rows.append(out)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m medddpm.profiling.layers", description="the model's convolutions, by shape")
    p.add_argument("--model", default="whole-head")
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--profile", action="store_true", help="profile a training step on the GPU (needs CUDA)")
    p.add_argument("--norms", action="store_true", help="time every large GroupNorm shape in both "
                   "implementations against its minimal bytes (needs CUDA)")
    p.add_argument("--config", default="fast", help="run configuration of the profiled step")
    p.add_argument("--out", help="CSV for the table of --profile or --norms")
    a = p.parse_args(argv)
    try:
        cfg = model_preset(a.model)
        if a.profile or a.norms:
            knobs = run_config(a.config, training=True) if a.profile else None  # a bad name: one error first
            if not torch.cuda.is_available():
                raise ValueError(f"{'--profile' if a.profile else '--norms'} needs a CUDA GPU; this machine has none")
            from ..core.io import atomic_path

            if a.profile:
                t = layer_table(cfg, knobs, (a.size,) * 3, torch.device("cuda"))
                t.insert(0, "config", knobs.name)
            else:
                t = norm_table(cfg, (a.size,) * 3, torch.device("cuda"))
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
