#!/usr/bin/env python3
"""Run several ``medddpm profile`` jobs inside one time box (a device command may last 10 minutes).

    scripts/profile_queue.py --gpu-label h100-80gb-hbm3 --budget 560 paper:opt1 step:baseline:lean

A job is ``MODE:CONFIG[:STEP_SET]``; ``probe:SET`` profiles the first 30 kernels of a step of the tiny model at
16³ with that step set (the counter passes it costs, in seconds). A job starts only while at least its
``--need`` seconds remain (paper: 300 by default, step and roofline: 120) and is given the time left as its
``--timeout`` (at most its ``--cap``); a job that does not fit is skipped and reported. Each finished job lands in the
results folder on its own (``medddpm profile`` stages and moves), so a later failure loses nothing.
One JSON line a job is appended to ``<out>/queue_log.jsonl``; the exit code is 1 when any job
failed or was skipped.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

NEED = {"paper": 300.0, "step": 120.0, "roofline": 120.0, "probe": 20.0}


def check_job(job: str) -> str:
    """``job`` if it is MODE:CONFIG[:SET] with a known mode (argparse type: a bad job stops the queue
    before the first one runs, not minutes into it)."""
    parts = job.split(":")
    if parts[0] not in NEED or len(parts) < 2 or not all(parts):
        raise argparse.ArgumentTypeError(f"bad job {job!r}; use paper:CONFIG, step:CONFIG[:SET], roofline:CONFIG or probe:SET")
    return job


def mode_seconds(text: str) -> tuple[str, float]:
    """'paper=240' → ('paper', 240.0), for --need and --cap."""
    mode, _, seconds = text.partition("=")
    try:
        if mode in NEED:
            return mode, float(seconds)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected MODE=SECONDS with MODE one of {sorted(NEED)}, got {text!r}")


def job_command(job: str, label: str, out: Path, size: int, timeout: float) -> list[str]:
    parts = job.split(":")
    mode = parts[0]
    cmd = [sys.executable, "-m", "medddpm", "profile", "--gpu-label", label, "--timeout", f"{timeout:.0f}"]
    if mode == "probe":
        return cmd + ["--mode", "step", "--model", "tiny", "--size", "16", "--configs", "baseline",
                      "--step-set", parts[1], "--max-kernels", "30", "--out", f"/tmp/medddpm-probe/{parts[1]}"]
    cmd += ["--mode", mode, "--configs", parts[1], "--size", str(size), "--out", str(out)]
    return cmd + (["--step-set", parts[2]] if mode == "step" and len(parts) > 2 else [])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu-label", required=True)
    p.add_argument("--out", help="results folder (default data/results/<gpu-label>)")
    p.add_argument("--budget", type=float, default=560, help="seconds for all jobs together")
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--need", action="append", default=[], type=mode_seconds,
                   help="MODE=SECONDS: least time a job of MODE needs")
    p.add_argument("--cap", action="append", default=[], type=mode_seconds,
                   help="MODE=SECONDS: most time one job of MODE may take")
    p.add_argument("jobs", nargs="+", type=check_job)
    a = p.parse_args(argv)
    need = dict(NEED, **dict(a.need))
    cap = dict(a.cap)
    out = Path(a.out or f"data/results/{a.gpu_label}")
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    failed = 0
    for job in a.jobs:
        left = a.budget - (time.monotonic() - start)
        record = {"job": job, "left_s": round(left)}
        if left < need.get(job.split(":")[0], 0):
            record["result"] = "skipped: not enough time left"
            failed += 1
        else:
            t0 = time.monotonic()
            timeout = min(left, cap.get(job.split(":")[0], left))
            proc = subprocess.run(job_command(job, a.gpu_label, out, a.size, timeout), capture_output=True, text=True)
            record.update(rc=proc.returncode, seconds=round(time.monotonic() - t0, 1),
                          result=(proc.stdout + proc.stderr).strip()[-600:])
            failed += proc.returncode != 0
        print(json.dumps(record), flush=True)
        with open(out / "queue_log.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
