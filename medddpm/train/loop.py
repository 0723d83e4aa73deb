"""The real training loop against its benchmark: ``loop/loop_vs_bench.csv`` of the results store.

A timed ``medddpm train`` run (its checkpoint config and ``timing.csv``) and a ``medddpm bench
--out`` row of the same configuration, micro-batch and grad-accum from the same device run make one
row: the loop's steady ms per micro-batch (median of its read-back intervals after the first, over
grad-accum), the bench's, and their ratio. A ratio near 1 says the loop adds nothing to the step:
no decode, no synchronous copy, no host stall on the critical path.

    python -m medddpm.train.loop table RUN... --bench BENCH.csv... --out data/results/<gpu>/loop/loop_vs_bench.csv
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from ..core.errors import InputError

COLUMNS = ["gpu", "config", "size", "micro_batch", "grad_accum", "world_size", "data", "loop_ms_per_micro_batch",
           "bench_ms", "ratio", "torch", "cuda", "cudnn"]


def run_summary(run: str | Path) -> dict[str, Any]:
    """What a timed ``train`` run says of itself: configuration, data pipeline, steady ms/step."""
    import torch

    from .timing import steady_intervals

    run = Path(run)
    try:
        ckpt = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=False)
        timing = steady_intervals(pd.read_csv(run / "timing.csv"))
    except (OSError, KeyError, pd.errors.EmptyDataError) as exc:
        raise InputError(f"{run} is not a timed train run: {exc}") from None
    if timing.empty:
        raise InputError(f"{run}/timing.csv has no read-back interval after the first; train more steps than "
                         "--log-every")
    c = ckpt["config"]
    return {"config": c["knobs"]["name"], "size": "x".join(map(str, c["size"])), "micro_batch": c["train"]["batch_size"],
            "grad_accum": c["train"]["grad_accum"], "world_size": int(c.get("world_size", 1)),
            "data": c.get("data", {}).get("pipeline", c["knobs"].get("data_cache", "")),
            "step_ms": statistics.median(timing)}


def bench_rows(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """The rows of ``medddpm bench --out`` CSV files (``bench.COLUMNS``)."""
    frames = []
    for p in paths:
        try:
            frames.append(pd.read_csv(p))
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read bench CSV {p}: {exc}") from None
    return pd.concat(frames, ignore_index=True).to_dict("records") if frames else []


def table(runs: Sequence[str | Path], benches: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per run, beside the bench row of its configuration, size, micro-batch and grad-accum
    (the last such row wins); a run without one gets no bench time and no ratio."""
    index = {(b["config"], b["size"], int(b["batch"]), int(b.get("grad_accum", 1))): b for b in benches}
    rows = []
    for run in runs:
        r = run_summary(run)
        b = index.get((r["config"], r["size"], r["micro_batch"], r["grad_accum"]))
        loop = r["step_ms"] / r["grad_accum"]
        bench = b["step_ms_median"] / r["grad_accum"] if b else float("nan")
        rows.append({**{k: r[k] for k in ("config", "size", "micro_batch", "grad_accum", "world_size", "data")},
                     "gpu": b["gpu"] if b else "", "loop_ms_per_micro_batch": round(loop, 2),
                     "bench_ms": round(bench, 2), "ratio": round(loop / bench, 4),
                     **{k: (b or {}).get(k, "") for k in ("torch", "cuda", "cudnn")}})
    return pd.DataFrame(rows, columns=COLUMNS).sort_values(["config", "grad_accum", "world_size"]).reset_index(drop=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m medddpm.train.loop")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("table", help="loop_vs_bench.csv from timed train runs and bench rows")
    s.add_argument("runs", nargs="+", help="train run folders (checkpoint.pt, timing.csv)")
    s.add_argument("--bench", nargs="+", required=True, help="`medddpm bench --out` CSVs of the same device run")
    s.add_argument("--out", required=True, help="CSV to write")
    a = p.parse_args(argv)
    try:
        df = table(a.runs, bench_rows(a.bench))
    except InputError as exc:
        print(f"medddpm.train.loop: error: {exc}", file=sys.stderr)
        return 2
    from ..core.io import write_text_atomic

    write_text_atomic(a.out, df.to_csv(index=False, lineterminator="\n"))
    print(df.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
