"""GPU clocks while a run ran (issue 49): an N-rank step waits for the slowest of N GPUs, and a GPU
that boosts less under load is slower without any fault of the code. ``scripts/_run.sh``'s
``clocks_on`` logs every GPU's SM clock, power, temperature, utilisation and clock-event reasons
(``nvidia-smi --query-gpu … -lms``); ``clock_table`` reduces such logs to one row per (run, GPU)
over the samples where that GPU was busy.
"""
from __future__ import annotations

import argparse
import functools
import operator
import re
from pathlib import Path
from typing import Sequence

import pandas as pd

QUERY = "timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active"
BUSY = 90  # % utilisation from which a sample counts as the run's work (not start-up, not compilation)
# NVML's clock-event reason bits (nvidia-smi --help-query-gpu, clocks_event_reasons.*)
REASONS = {0x1: "idle", 0x2: "application clocks", 0x4: "software power cap", 0x8: "hardware slowdown",
           0x10: "sync boost", 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
           0x80: "hardware power brake", 0x100: "display clock"}
COLUMNS = ["run", "gpu_index", "busy_samples", "sm_mhz_median", "sm_mhz_p10", "mem_mhz_median", "power_w_median",
           "temp_c_max", "event_reasons"]


def reason_names(mask: str | int) -> list[str]:
    """The names of the bits set in a clock-event reason mask ('0x4' → ['software power cap'])."""
    bits = int(mask, 16) if isinstance(mask, str) else int(mask)
    return [name for bit, name in REASONS.items() if bits & bit] + ([f"{bits & ~sum(REASONS):#x}"] if bits & ~sum(REASONS) else [])


def _numbers(values: pd.Series) -> pd.Series:
    """nvidia-smi's cells as numbers, with or without their units ('1830 MHz', '689.59')."""
    return pd.to_numeric(values.astype(str).str.extract(r"([0-9.]+)")[0], errors="coerce")


def _columns(df: pd.DataFrame) -> pd.DataFrame:
    """nvidia-smi's header names without their units ('power.limit [W]' → 'power.limit')."""
    return df.set_axis([re.sub(r"\s*\[.*\]$", "", c.strip()) for c in df.columns], axis=1)


def read_log(path: str | Path) -> pd.DataFrame:
    """One nvidia-smi CSV log (with or without units) as numbers: index, sm, mem, power, temp, util,
    reasons (the active clock-event bit mask, an int)."""
    df = _columns(pd.read_csv(path, skipinitialspace=True))
    names = {"index": "index", "clocks.current.sm": "sm", "clocks.sm": "sm", "clocks.current.memory": "mem",
             "clocks.mem": "mem", "power.draw": "power", "temperature.gpu": "temp", "utilization.gpu": "util",
             "clocks_event_reasons.active": "reasons"}
    df = df.rename(columns={c: names[c] for c in df.columns if c in names})
    out = pd.DataFrame({"index": pd.to_numeric(df["index"], errors="coerce")})
    for c in ("sm", "mem", "power", "temp", "util"):
        out[c] = _numbers(df[c]) if c in df else float("nan")
    out["reasons"] = (df["reasons"].astype(str).map(lambda s: int(s, 16) if s.startswith("0x") else 0)
                      if "reasons" in df else 0)
    return out.dropna(subset=["index"])


def power_limit(path: str | Path) -> float | None:
    """The highest power limit (W) in an ``nvidia-smi --query-gpu=…,power.limit`` CSV; None where
    the file or the column is missing."""
    if not Path(path).is_file():
        return None
    df = _columns(pd.read_csv(path, skipinitialspace=True))
    vals = _numbers(df["power.limit"]) if "power.limit" in df else pd.Series(dtype=float)
    return float(vals.max()) if vals.notna().any() else None


def clock_table(logs: dict[str, str | Path], busy: int = BUSY) -> pd.DataFrame:
    """{run name: log} → one row per (run, GPU) that was busy (utilisation ≥ ``busy`` %) in it:
    the median and 10th percentile SM clock, the median memory clock and power, the hottest
    temperature and the clock-event reasons seen (bit mask OR-ed over the busy samples)."""
    rows = []
    for run, path in logs.items():
        df = read_log(path)
        for gpu, g in df[df["util"] >= busy].groupby("index"):
            reasons = functools.reduce(operator.or_, (int(r) for r in g["reasons"]), 0)
            rows.append({"run": run, "gpu_index": int(gpu), "busy_samples": len(g),
                         "sm_mhz_median": float(g["sm"].median()), "sm_mhz_p10": float(g["sm"].quantile(0.1)),
                         "mem_mhz_median": float(g["mem"].median()), "power_w_median": float(g["power"].median()),
                         "temp_c_max": float(g["temp"].max()), "event_reasons": f"{reasons:#x}"})
    return pd.DataFrame(rows, columns=COLUMNS)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m medddpm.profiling.clocks",
                                description="clocks.csv from nvidia-smi logs named clocks-RUN.csv")
    p.add_argument("logs", nargs="+", help="clocks-RUN.csv logs (scripts/_run.sh clocks_on)")
    p.add_argument("--out", required=True, help="CSV to write")
    a = p.parse_args(argv)
    logs = {Path(f).stem.removeprefix("clocks-"): f for f in a.logs if Path(f).stat().st_size > 0}
    table = clock_table(logs)
    table.to_csv(a.out, index=False, lineterminator="\n")
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
