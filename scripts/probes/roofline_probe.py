"""How Nsight Compute's FLOP counters count, checked on known work (issue 9's roofline).

    ncu --profile-from-start off --metrics <roofline set> python scripts/probes/roofline_probe.py run
    python scripts/probes/roofline_probe.py check RAW.csv OUT.csv

``run`` does three n×n×n matmuls (bf16, TF32, true FP32) between cudaProfilerStart/Stop, each
2n³ FLOPs. ``check`` reads the raw export through the package's parser and writes, per kernel, the
FLOPs the roofline counts (``medddpm.profiling.metrics.roofline_points``) beside 2n³: the ratio
must be 1 for the tensor-path counters and for the FFMA-based FP32 kernel alike.
"""
from __future__ import annotations

import argparse
import sys

N = 2048  # matmul side: large enough for the production kernels, small enough to replay quickly


def run() -> None:
    import torch

    from medddpm.core.runtime import set_tf32

    cases = [("bf16", torch.bfloat16, False), ("tf32", torch.float32, True), ("fp32", torch.float32, False)]
    operands = {name: [torch.randn(N, N, device="cuda", dtype=dt) for _ in range(2)] for name, dt, _ in cases}
    for name, _, tf32 in cases:  # warm-up: cuBLAS picks its kernels outside the profiled range
        set_tf32(tf32)
        operands[name][0] @ operands[name][1]
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, _, tf32 in cases:
        set_tf32(tf32)
        operands[name][0] @ operands[name][1]
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def check(raw: str, out: str) -> int:
    from medddpm.profiling.metrics import roofline_points
    from medddpm.profiling.tidy import parse_raw

    k = parse_raw(raw)
    pts = roofline_points(k)
    pts = pts.assign(case=["bf16", "tf32", "fp32"][: len(pts)] if len(pts) <= 3 else "",
                     expected_flops=2.0 * N**3)
    pts["flops_over_expected"] = pts["flops"] / pts["expected_flops"]
    cols = ["case", "short_name", "duration_ns", "flops", "expected_flops", "flops_over_expected", "dram_bytes",
            "tensor_ops_bf16", "tensor_ops_tf32", "ffma_thread_inst"]
    pts = pts.merge(k[["id", "tensor_ops_bf16", "tensor_ops_tf32", "ffma_thread_inst"]], on="id")
    pts[cols].to_csv(out, index=False)
    print(pts[cols].to_string(index=False))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("run", help="the profiled matmuls")
    c = sub.add_parser("check", help="compare the counted FLOPs with 2n³")
    c.add_argument("raw", help="ncu --page raw --csv --print-units base export")
    c.add_argument("out", help="CSV to write")
    a = p.parse_args()
    if a.what == "run":
        run()
        return 0
    return check(a.raw, a.out)


if __name__ == "__main__":
    sys.exit(main())
