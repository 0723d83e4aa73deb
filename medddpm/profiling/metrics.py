"""One function per figure of the paper, each computed from tidy ncu tables (``tidy.py``).

Aggregation rules (the paper does not state them; these are ours, used everywhere):

* Totals (cycles, instructions, stalls) are sums over the kernels of a report.
* IPC of a report is the geometric mean of per-kernel IPC (paper §3.2).
* Rates and percentages (pipe utilizations, hit rates, throughputs, active warps) are
  kernel-duration-weighted means, so a long kernel counts for its time.
* Normalized values divide each configuration by ``baseline`` on the same GPU (paper §6).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

# Fig 13: the paper's three stall counters (§3.2) and the ratios ncu's full set reports instead.
STALLS = ("long_scoreboard", "math_pipe_throttle", "branch_resolving")


def _weighted(df: pd.DataFrame, column: str) -> float:
    sub = df[[column, "duration_ns"]].dropna()
    if sub.empty or sub["duration_ns"].sum() == 0:
        return float("nan")
    return float(np.average(sub[column], weights=sub["duration_ns"]))


def geomean(values: pd.Series) -> float:
    v = values.dropna()
    v = v[v > 0]
    return float(np.exp(np.log(v).mean())) if len(v) else float("nan")


def ipc_stack(kernels: pd.DataFrame, instructions: pd.DataFrame, top: int = 5) -> pd.DataFrame:
    """Fig 4: the ``top`` longest kernels with cycles (gpc__cycles_elapsed.max), IPC
    (sm__inst_executed.avg.per_cycle_active) and their instruction classes as shares of IPC
    (sass__inst_executed_per_opcode_category)."""
    longest = kernels.nlargest(top, "duration_ns")[["id", "short_name", "abbr", "category", "duration_ns", "cycles", "ipc"]]
    merged = longest.merge(instructions, on="id", how="left")
    merged["ipc_part"] = merged["ipc"] * merged["share"]
    return merged[["id", "short_name", "abbr", "category", "duration_ns", "cycles", "ipc", "class", "share", "ipc_part"]]


def priority_scores(kernels: pd.DataFrame, rules: pd.DataFrame) -> pd.DataFrame:
    """Fig 5 / Eq. 1: priority = duration × estimated speedup, clamped to [0, 1], summed per category.

    A kernel has several rule estimates; they overlap (each is an upper bound on one bottleneck),
    so a kernel's estimated speedup is the **largest** of its OPT rules' estimates, not their sum.
    """
    opt = rules[(rules["type"] == "OPT") & rules["speedup_pct"].notna()]
    best = opt.groupby("id")["speedup_pct"].max().rename("speedup_pct")
    k = kernels[["id", "category", "duration_ns"]].merge(best, on="id", how="left").fillna({"speedup_pct": 0.0})
    k["speedup"] = (k["speedup_pct"] / 100).clip(0, 1)
    k["priority"] = k["duration_ns"] * k["speedup"]
    out = k.groupby("category", as_index=False)["priority"].sum()
    out["share"] = out["priority"] / out["priority"].sum() if out["priority"].sum() else np.nan
    return out.sort_values("priority", ascending=False).reset_index(drop=True)


def kernel_mix(kernels: pd.DataFrame, by: str = "category", duration: str = "duration_ns",
               group: list[str] | None = None) -> pd.DataFrame:
    """Figs 6 and 8: share of summed kernel time per ``by`` ('category', 'abbr', 'short_name')
    within each ``group`` (e.g. gpu_slug, config; none: the whole table), largest first.
    ``duration``: 'duration_ns' for ncu tables, 'duration_us' for torch.profiler's."""
    group = list(group or [])
    total = kernels.groupby(group, observed=True)[duration].transform("sum") if group else kernels[duration].sum()
    out = (kernels.assign(share=kernels[duration] / total)
           .groupby(group + [by], as_index=False, observed=True)["share"].sum())
    return out.sort_values(group + ["share"], ascending=[True] * len(group) + [False]).reset_index(drop=True)


def instruction_mix(instructions: pd.DataFrame, kernel_ids=None, group: list[str] | None = None) -> pd.DataFrame:
    """Figs 7 and 9: instruction classes as shares of executed instructions, summed over kernels
    (all of them, or ``kernel_ids``) within each ``group`` (e.g. gpu_slug, config), largest first."""
    ins = instructions if kernel_ids is None else instructions[instructions["id"].isin(list(kernel_ids))]
    group = list(group or [])
    out = ins.groupby(group + ["class"], as_index=False, observed=True)["count"].sum()
    total = out.groupby(group, observed=True)["count"].transform("sum") if group else out["count"].sum()
    out["share"] = out["count"] / total
    return out.sort_values(group + ["share"], ascending=[True] * len(group) + [False]).reset_index(drop=True)


def dominant_instruction_mix(kernels: pd.DataFrame, instructions: pd.DataFrame) -> pd.DataFrame:
    """Fig 7: ``instruction_mix`` of the kernel function (``short_name``) with the most summed
    time in the report, over all its launches; its name in column ``kernel``."""
    dominant = kernels.groupby("short_name")["duration_ns"].sum().idxmax()
    ids = kernels.loc[kernels["short_name"] == dominant, "id"]
    return instruction_mix(instructions, ids).assign(kernel=dominant)


def stall_totals(kernels: pd.DataFrame) -> dict[str, float]:
    """Fig 13: total warp stall cycles per reason: the paper's ``smsp__warps_issue_stalled_*.sum``
    where collected, else the per-issue ratio × ``smsp__inst_issued.sum`` (the same quantity)."""
    out = {}
    for s in STALLS:
        direct = kernels.get(f"stall_{s}")
        if direct is not None and direct.notna().any():
            out[s] = float(direct.sum())
        else:
            out[s] = float((kernels[f"stall_{s}_ratio"] * kernels["issued_instructions"]).sum())
    return out


def report_summary(kernels: pd.DataFrame) -> dict[str, float]:
    """Every aggregate the figures need from one report (one GPU × configuration)."""
    s = {
        "kernels": int(len(kernels)),
        "duration_ns": float(kernels["duration_ns"].sum()),
        "cycles": float(kernels["cycles"].sum()),
        "instructions": float(kernels["instructions"].sum()),
        "ipc_geomean": geomean(kernels["ipc"]),
        # Fig 10
        "tensor_pipe_pct": _weighted(kernels, "tensor_pipe_pct"),
        "fma_pipe_pct": _weighted(kernels, "fma_pipe_pct"),
        "alu_pipe_pct": _weighted(kernels, "alu_pipe_pct"),
        "sm_throughput_pct": _weighted(kernels, "sm_throughput_pct"),
        # Fig 11
        "l1_hit_pct": _weighted(kernels, "l1_hit_pct"),
        "l2_hit_pct": _weighted(kernels, "l2_hit_pct"),
        "dram_throughput_pct": _weighted(kernels, "dram_throughput_pct"),
        # Fig 12
        "warps_active": _weighted(kernels, "warps_active"),
    }
    s.update({f"stall_{k}": v for k, v in stall_totals(kernels).items()})
    return s


def normalized(summaries: pd.DataFrame, baseline: str = "baseline") -> pd.DataFrame:
    """Each configuration's summary divided by ``baseline``'s on the same GPU (§6: cycles,
    instructions, IPC, utilizations, warps, stalls). ``summaries`` has columns gpu, config, …;
    a GPU without a ``baseline`` row is left out."""
    if summaries.empty:
        return pd.DataFrame()
    rows = []
    for gpu, g in summaries.groupby("gpu"):
        base = g[g["config"] == baseline]
        if base.empty:
            continue
        b = base.iloc[0]
        for _, r in g.iterrows():
            row = {"gpu": gpu, "config": r["config"]}
            for col in g.columns.drop(["gpu", "config"]):
                if pd.api.types.is_numeric_dtype(g[col]):
                    row[col] = r[col] / b[col] if b[col] else np.nan
            rows.append(row)
    return pd.DataFrame(rows)


# Roofline (issue 9, "Beyond the paper"): FLOPs per thread instruction of the FP32 pipes; one
# tensor-path op is one FLOP (checked on known matmuls by scripts/probes/roofline_probe.py).
FLOPS_PER_INST = {"ffma_thread_inst": 2.0, "fadd_thread_inst": 1.0, "fmul_thread_inst": 1.0}
TENSOR_OPS = ("tensor_ops_bf16", "tensor_ops_fp16", "tensor_ops_tf32")


def counter(kernels: pd.DataFrame, ours: str) -> pd.Series | None:
    """Per-kernel count of a roofline counter by our name (``tidy.METRICS``): our column, else ncu's
    own column (tables parsed before the name existed), else ncu's ``<metric>.per_cycle_elapsed``
    rate times the unit's elapsed cycles, which is how ``--set full`` (paper mode) reports the FP32
    instruction counters. None when the report has none of them."""
    from .tidy import METRICS

    if ours in kernels and kernels[ours].notna().any():
        return kernels[ours].fillna(0)
    raw = METRICS[ours]
    if raw in kernels:
        return kernels[raw].fillna(0)
    rate, cycles = f"{raw}.per_cycle_elapsed", f"{raw.split('__')[0]}__cycles_elapsed.avg"
    if rate in kernels and cycles in kernels:
        return (kernels[rate] * kernels[cycles]).fillna(0)
    return None


def roofline_points(kernels: pd.DataFrame, group: list[str] | None = None) -> pd.DataFrame:
    """Every kernel as a roofline point: FLOPs (tensor-path ops + FP32 FMA/ADD/MUL), DRAM bytes
    (read + write), arithmetic intensity (FLOP/byte), achieved TFLOP/s and DRAM TB/s, and its share
    of the summed kernel time within its ``group`` (e.g. gpu_slug, config). Needs DRAM byte counters
    (``--mode roofline``, or paper mode's full set); a FLOP counter the report lacks
    counts as zero, and ``fp32_counted`` says whether the FP32-pipe counters were there."""
    read, write = counter(kernels, "dram_read_bytes"), counter(kernels, "dram_write_bytes")
    if read is None or write is None:
        raise ValueError("no DRAM byte counters in these kernels: profile with --mode roofline")
    group = list(group or [])
    k = kernels[group + ["id", "short_name", "category", "duration_ns"]].copy()
    found = {n: counter(kernels, n) for n in (*TENSOR_OPS, *FLOPS_PER_INST)}
    count = {n: 0.0 if c is None else c for n, c in found.items()}  # a counter not in the report: no FLOPs
    k["flops"] = sum(count[n] for n in TENSOR_OPS) + sum(w * count[n] for n, w in FLOPS_PER_INST.items())
    k["fp32_counted"] = all(found[n] is not None for n in FLOPS_PER_INST)
    # the pipe whose ceiling bounds the kernel: the tensor path it used, else the FP32 pipes
    half = pd.Series(count["tensor_ops_bf16"] + count["tensor_ops_fp16"], index=kernels.index)
    tf32 = pd.Series(count["tensor_ops_tf32"], index=kernels.index)
    k["path"] = np.select([half > 0, tf32 > 0], ["bf16 tensor", "TF32 tensor"], "FP32")
    k["dram_bytes"] = read + write
    k["intensity"] = k["flops"] / k["dram_bytes"].where(k["dram_bytes"] > 0)
    seconds = k["duration_ns"] * 1e-9
    k["tflops"] = k["flops"] / seconds / 1e12
    k["dram_tbps"] = k["dram_bytes"] / seconds / 1e12
    total = k.groupby(group)["duration_ns"].transform("sum") if group else k["duration_ns"].sum()
    k["share"] = k["duration_ns"] / total
    return k.reset_index(drop=True)
