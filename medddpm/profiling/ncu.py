"""Running Nsight Compute on the workload and turning each report into small tables.

Two modes (``medddpm profile --mode``):

``paper``  the paper's options (§3.2): ``--set full --call-stack --nvtx --csv --export
           --launch-skip 10 --launch-count 100 --target-processes all``, plus
           ``--clock-control none`` (required where clocks may not be touched: the one deviation)
           and ``--metrics sass__inst_executed_per_opcode_category`` (adds the per-class instance
           values Figs 7/9 need). The window is counted from process start, as in the paper.
``step``   every kernel of one steady-state training step: the workload runs ``warmup`` steps and
           wraps the last one in cudaProfilerStart/Stop (``--profile-from-start off``); ncu replays
           each kernel once per counter pass (``--replay-mode kernel``, or ``application`` to re-run
           the workload once per pass). An NVTX filter is *not* used to select the step: backward
           kernels are launched from autograd's own thread, outside the main thread's
           ``train_step`` push/pop range, and ``--nvtx-include train_step/`` drops all of them (seen
           on an H200: 439 of ~1,300 kernels kept). ``--nvtx`` still records ranges where they
           apply. Instead of sections it collects one of ``STEP_SETS`` (``--step-set``): metric
           groups chosen by what each costs in counter passes, since a 128³ FP32 step has ~1,300
           kernels and every pass replays each of them. Fig 5 needs the rule estimates of full
           sections, which only ``paper`` mode has.

           Measured on an H100 (ncu 2025.3.1, ``data/results/h100-80gb-hbm3/queue_log.jsonl``):
           ``core`` takes 1 counter pass a kernel, ``lean`` 10, ``standard`` 11, ``full`` 12 (the
           pipe-utilization and SM-throughput metrics cost the passes). A pass costs ~45 ms a
           kernel at 128³, so ``core`` profiles a whole step (1,304–1,726 kernels) in 52–77 s on an
           H100 or H200, while ``lean`` reached 525 kernels in 230 s (a step would take ~10 min).
           ``core`` is the default; the larger sets are there for smaller volumes or partial steps
           (``--max-kernels``).

The ``.ncu-rep`` report stays in a temporary folder; what is kept are gzipped CSV exports (raw
page, instance values, rule rows) and parquet tables, written into ``OUT/<config>/`` only once
everything for that configuration succeeded.
"""
from __future__ import annotations

import difflib
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from ..errors import InputError, MedddpmError
from .tidy import INSTANCE_METRIC, METRICS, tidy

PAPER_OPTIONS = ["--set", "full", "--call-stack", "--nvtx", "--launch-skip", "10", "--launch-count", "100",
                 "--target-processes", "all"]
CLOCK = ["--clock-control", "none"]
# Step-mode metric groups (names from tidy.METRICS) and the figures each one feeds.
STEP_GROUPS: dict[str, list[str]] = {
    # Figs 4, 6/8, normalized table (cycles, instructions, IPC), Fig 12.
    "core": [METRICS[k] for k in ("duration_ns", "cycles", "sm_active_cycles", "instructions", "ipc",
                                  "issued_instructions", "warps_active")],
    # Fig 10: tensor / FMA / ALU pipe utilization, SM throughput.
    "pipes": [METRICS[k] for k in ("tensor_pipe_pct", "fma_pipe_pct", "alu_pipe_pct", "sm_throughput_pct")],
    # Fig 11: L1 / L2 hit rate, DRAM throughput.
    "memory": [METRICS[k] for k in ("l1_hit_pct", "l2_hit_pct", "dram_throughput_pct")],
    # Fig 13: the three stall reasons, as sums and per issue.
    "stalls": [v for k, v in METRICS.items() if k.startswith("stall_")],
    # Figs 7/9: instruction classes (SASS-patched; one more pass on the H100).
    "classes": [INSTANCE_METRIC],
    # The roofline of "Beyond the paper": DRAM bytes and tensor-path FLOPs (hardware counters), as
    # two groups so that each can be collected in a run of its own (``split``).
    # Counter passes on an H200 (ncu 2025.3.1, fast_path/ncu_passes.csv): dram 1; bf16 + TF32 ops
    # together 3; core + dram + both 4.
    "dram": [METRICS[k] for k in ("dram_read_bytes", "dram_write_bytes")],
    "tensor_bf16": [METRICS["tensor_ops_bf16"]],
    "tensor_tf32": [METRICS["tensor_ops_tf32"]],
    # FP32-pipe FLOPs (FFMA/FADD/FMUL): SASS-instrumented counters, the expensive part. With them
    # the roofline set took 5 passes a kernel (~0.19 s a kernel on an H200, at 64³ as at 128³), so
    # a whole 128³ step (1,300-1,700 kernels) does not fit a 10-minute run; only FP32 kernels
    # (the baseline's convolutions) need them.
    "fp32_flops": [METRICS[k] for k in ("ffma_thread_inst", "fadd_thread_inst", "fmul_thread_inst")],
}
# Named step sets: cumulative groups. Only `core` (1 counter pass) profiles a whole 128³ FP32 step
# in about a minute; `full` has every step metric the figures use (12 passes on the H100).
STEP_SETS: dict[str, tuple[str, ...]] = {
    "core": ("core",),
    "lean": ("core", "pipes"),
    "standard": ("core", "pipes", "memory", "stalls"),
    "full": ("core", "pipes", "memory", "stalls", "classes"),
    "roofline": ("core", "dram", "tensor_bf16", "tensor_tf32"),  # a whole step's kernels as roofline points
    "roofline-bf16": ("core", "dram", "tensor_bf16"),  # the same for bf16 rungs, whose matmuls are all bf16
    "roofline-fp32": ("core", "dram", "tensor_bf16", "tensor_tf32", "fp32_flops"),  # + FP32-pipe FLOPs (small volumes, partial steps)
}
DEFAULT_STEP_SET = "core"
LAUNCH = ["launch__grid_size", "launch__block_size", "launch__registers_per_thread"]


def step_metrics(step_set: str = DEFAULT_STEP_SET, group: str | None = None) -> list[str]:
    """The ncu metric names of a named step set (see ``STEP_SETS``), or of one of its groups."""
    if step_set not in STEP_SETS:
        raise InputError(f"--step-set must be one of {sorted(STEP_SETS)}, got {step_set!r}")
    groups = STEP_SETS[step_set] if group is None else (group,)
    if group is not None and group not in STEP_SETS[step_set]:
        raise InputError(f"step set {step_set!r} has no group {group!r}; it has {list(STEP_SETS[step_set])}")
    return sorted({m for g in groups for m in STEP_GROUPS[g]} | set(LAUNCH))


class ProfilerError(MedddpmError, RuntimeError):
    """ncu is missing, may not read the counters, or produced no usable report."""


def find_ncu(ncu: str | None = None) -> str:
    path = shutil.which(ncu or os.environ.get("NCU", "ncu"))
    if not path:
        raise ProfilerError("ncu (Nsight Compute CLI) was not found on PATH; install Nsight Compute or set NCU=/path/to/ncu")
    return path


def workload_command(model: str, config: str, size: int, steps: int, profile_last: bool) -> list[str]:
    cmd = [sys.executable, "-m", "medddpm.workload", "--model", model, "--config", config,
           "--size", str(size), "--steps", str(steps)]
    return cmd + (["--profile-last"] if profile_last else [])


def ncu_command(ncu: str, mode: str, export: Path, workload: list[str], metrics: Sequence[str] | None = None,
                replay: str = "kernel", max_kernels: int | None = None) -> list[str]:
    """The full ncu command line for ``mode`` ('paper' or 'step'); ``replay`` and ``max_kernels``
    (the first N kernels of the step only) apply to step mode."""
    if replay not in ("kernel", "application"):
        raise InputError(f"replay must be 'kernel' or 'application', got {replay!r}")
    if mode == "paper":
        opts = PAPER_OPTIONS + ["--metrics", INSTANCE_METRIC]
    elif mode == "step":
        # The step is selected with cudaProfilerStart/Stop, not with an NVTX filter: autograd
        # launches the backward kernels from its own thread, outside the main thread's push/pop
        # `train_step` range, so `--nvtx-include train_step/` would silently drop the backward
        # pass. LaunchStats costs no counter pass and keeps ncu from adding its default set.
        # Only the workload itself is profiled: Inductor's compile workers are child processes, and
        # ncu attached to them crashed a compile (exit 139, H200, data/results/h200/fast_path/).
        opts = ["--profile-from-start", "off", "--replay-mode", replay, "--target-processes", "application-only",
                "--nvtx", "--section", "LaunchStats", "--metrics", ",".join(metrics or step_metrics())]
        if max_kernels is not None:
            if max_kernels < 1:
                raise InputError(f"--max-kernels must be ≥ 1, got {max_kernels}")
            opts += ["--launch-count", str(max_kernels)]
    else:
        raise InputError(f"--mode must be 'paper' or 'step', got {mode!r}")
    return [ncu, *CLOCK, *opts, "--export", str(export), "--force-overwrite", *workload]


def check_output(text: str, returncode: int) -> None:
    """Turn ncu's known failures into one clear message each."""
    if "ERR_NVGPUCTRPERM" in text:
        raise ProfilerError("ncu may not read the GPU performance counters (ERR_NVGPUCTRPERM): run as root or "
                            "allow profiling for all users (NVreg_RestrictProfilingToAdminUsers=0)")
    if "No kernels were profiled" in text:
        raise ProfilerError("ncu profiled zero kernels (check the NVTX filter and that the workload ran on the GPU)")
    if returncode != 0:
        tail = "; ".join(line.strip() for line in text.strip().splitlines()[-3:])
        raise ProfilerError(f"ncu failed with exit code {returncode}: {tail}")


def export_csvs(ncu: str, report: Path, folder: Path, instances: bool = True, suffix: str = "") -> dict[str, Path]:
    """raw / details (/ instances, when the report has the instruction-class metric) CSVs of a
    report, gzipped, in ``folder`` as ``ncu_<page><suffix>.csv.gz``."""
    pages = {
        "raw": ["--page", "raw", "--print-units", "base"],
        "details": ["--page", "details", "--print-units", "base"],
    }
    if instances:
        pages["instances"] = ["--page", "raw", "--print-units", "base", "--print-metric-instances", "details",
                              "--metrics", INSTANCE_METRIC]
    out = {}
    for name, args in pages.items():
        p = subprocess.run([ncu, "--import", str(report), "--csv", *args], capture_output=True, text=True)
        if p.returncode != 0:
            raise ProfilerError(f"ncu --import ({name} page) failed: {p.stderr.strip()[-300:]}")
        path = folder / f"ncu_{name}{suffix}.csv.gz"
        with gzip.open(path, "wt") as f:
            f.write(p.stdout)
        out[name] = path
    return out


def workload_settings(stdout: str) -> dict[str, Any]:
    """The effective knobs the workload printed (its JSON line among ncu's own output)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith('{"config"'):
            return json.loads(line).get("settings", {})
    return {}


PASSES = re.compile(r" - (\d+) pass(?:es)?\s*$")


def progress(log: str) -> dict[str, Any]:
    """Kernels ncu reported profiling in its log, and the counter passes each took
    (``==PROF== Profiling "kernel" - 0: 0%....50%....100% - 9 passes``)."""
    lines = [line.strip() for line in log.splitlines() if line.startswith("==PROF== Profiling ")]
    passes = [int(m[1]) for line in lines if (m := PASSES.search(line))]
    return {"kernels_logged": len(lines), "passes_min": min(passes, default=None), "passes_max": max(passes, default=None)}


def run_group(cmd: list[str], timeout_s: float | None, label: str, log: Path) -> subprocess.CompletedProcess:
    """Run ncu in its own process group, its stdout and stderr into ``log``; on time-out or
    interrupt the whole group (ncu and the profiled workload it started) is killed, so no orphan
    keeps the GPU's counters busy, and the error says how far it got."""
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except BaseException as exc:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            if isinstance(exc, subprocess.TimeoutExpired):
                done = progress(log.read_text(errors="replace"))["kernels_logged"]
                raise ProfilerError(f"{label}: ncu ran past {timeout_s:.0f} s after {done} kernels and was stopped; "
                                    "nothing was written") from None
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, log.read_text(errors="replace"), "")


KERNEL_KEY = ["kernel", "grid", "block"]  # what identifies a kernel launch across runs of the same step


def align(base: pd.DataFrame, other: pd.DataFrame) -> dict[int, int]:
    """Row positions of ``other``'s kernels → row positions of the same launches in ``base``: the
    two kernel sequences (name, grid, block) aligned with ``difflib``, so that a launch one run has
    and the other lacks (cuDNN's autotuner may choose differently in another process) shifts
    nothing after it."""
    a = [tuple(map(str, r)) for r in base[KERNEL_KEY].itertuples(index=False, name=None)]
    b = [tuple(map(str, r)) for r in other[KERNEL_KEY].itertuples(index=False, name=None)]
    blocks = difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks()
    return {j + n: i + n for i, j, size in blocks for n in range(size)}


def merge_runs(runs: list[dict[str, pd.DataFrame]]) -> tuple[dict[str, pd.DataFrame], list[int]]:
    """One set of tables from several ncu runs of the same step (one run per metric group,
    ``split``): the first run's kernels and rules, plus every column that run lacks (or holds
    only empty) from the later runs, kernel by kernel along ``align``; a later run's
    instruction classes come with their kernel ids mapped. Also returns how many kernels each
    later run matched (a kernel no run matched keeps gaps, never a zero)."""
    tables = {name: df.copy() for name, df in runs[0].items()}
    base = tables["kernels"]
    matched = []
    for run in runs[1:]:
        k = run["kernels"]
        pos = align(base, k)
        matched.append(len(pos))
        mine, theirs = list(pos.values()), list(pos)
        added = {}
        for c in k.columns:
            if c in KERNEL_KEY or c == "id" or not k[c].notna().any() or (c in base and base[c].notna().any()):
                continue
            col = pd.Series(np.nan, index=base.index, dtype="float64" if k[c].dtype.kind in "fiub" else "object")
            col.iloc[mine] = k[c].iloc[theirs].to_numpy()
            added[c] = col
        base = pd.concat([base.drop(columns=[c for c in added if c in base]), pd.DataFrame(added)], axis=1)
        if "instructions" in run and "instructions" not in tables:
            ids = dict(zip(k["id"].iloc[theirs], base["id"].iloc[mine]))
            ins = run["instructions"]
            tables["instructions"] = ins[ins["id"].isin(ids)].assign(id=lambda d: d["id"].map(ids))
    tables["kernels"] = base
    return tables, matched


def _profile_run(ncu: str, mode: str, work: list[str], folder: Path, label: str, timeout_s: float | None,
                 metrics: list[str] | None, replay: str, max_kernels: int | None, suffix: str = ""
                 ) -> tuple[dict[str, pd.DataFrame], dict[str, Any], str]:
    """One ncu run into ``folder``: its tables, its summary (seconds, kernels, passes, command) and
    its stdout; the gzipped CSV exports are written as ``ncu_<page><suffix>.csv.gz``."""
    cmd = ncu_command(ncu, mode, folder / f"report{suffix}", work, metrics=metrics, replay=replay,
                      max_kernels=max_kernels)
    t0 = time.monotonic()
    p = run_group(cmd, timeout_s, label, folder / f"ncu{suffix}.log")
    seconds = time.monotonic() - t0
    check_output(p.stdout, p.returncode)
    report = folder / f"report{suffix}.ncu-rep"
    if not report.exists():
        raise ProfilerError(f"{label}: ncu wrote no report; last output: {p.stdout[-300:]}")
    staged = folder / "staged"
    staged.mkdir(exist_ok=True)
    csvs = export_csvs(ncu, report, staged, instances=metrics is None or INSTANCE_METRIC in metrics, suffix=suffix)
    report.unlink()
    tables = tidy(csvs["raw"], csvs["details"], csvs.get("instances"))
    if tables["kernels"].empty:
        raise ProfilerError(f"{label}: the report holds zero kernels")
    summary = {"seconds": round(seconds, 1), "kernels": int(len(tables["kernels"])), **progress(p.stdout),
               "command": " ".join(cmd)}
    return tables, summary, p.stdout


def profile_config(ncu: str, mode: str, model: str, config: str, size: int, warmup: int, out: Path,
                   timeout_s: float | None = None, replay: str = "kernel",
                   step_set: str = DEFAULT_STEP_SET, max_kernels: int | None = None,
                   split: bool = False, on_run: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Profile one configuration; on success ``out/<config>/ncu_<mode>_*`` exist, else nothing new.

    ``split`` (step mode) collects each metric group of ``step_set`` in an ncu run of its own and
    merges the runs kernel by kernel (``merge_runs``). A group that fits one counter pass then needs
    no replay, hence no save and restore of the device memory before every pass, which is what
    makes a multi-pass set cost ~0.3 s a kernel at 128³; ``timeout_s`` applies to each run, and
    ``on_run`` is called with each run's summary as it finishes.
    """
    if split and mode != "step":
        raise InputError("--split applies to step mode only (paper mode uses the paper's --set full)")
    steps = 1 if mode == "paper" else warmup + 1
    groups: list[str | None] = list(STEP_SETS[step_set]) if (split and mode == "step") else [None]
    if mode == "step":
        step_metrics(step_set)  # validates the name before anything runs
    work = workload_command(model, config, size, steps, profile_last=(mode == "step"))
    final = out / config
    final.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".ncu-{config}-", dir=out) as tmp:
        tmp = Path(tmp)
        runs, summaries, stdout = [], [], ""
        for i, group in enumerate(groups, 1):
            metrics = step_metrics(step_set, group) if mode == "step" else None
            label = f"{config} ({group} run, {i} of {len(groups)})" if group else config
            tables, summary, stdout = _profile_run(ncu, mode, work, tmp, label, timeout_s, metrics, replay, max_kernels,
                                                   suffix=f"_{group}" if group else "")
            runs.append(tables)
            summaries.append({"group": group, **summary} if group else summary)
            if on_run:
                on_run({"label": label, **summary})
        tables, matched = merge_runs(runs)
        staged = tmp / "staged"
        for name, df in tables.items():
            df.to_parquet(staged / f"{name}.parquet", index=False)
        meta = {"mode": mode, "config": config, "model": model, "size": size, "warmup": warmup if mode == "step" else 0,
                "kernels": int(len(tables["kernels"])), "seconds": round(sum(r["seconds"] for r in summaries), 1),
                "kernels_logged": sum(r["kernels_logged"] for r in summaries),
                "passes_min": min((r["passes_min"] for r in summaries if r["passes_min"] is not None), default=None),
                "passes_max": max((r["passes_max"] for r in summaries if r["passes_max"] is not None), default=None),
                "step_set": {"name": step_set, "groups": list(STEP_SETS[step_set])} if mode == "step" else None,
                "replay": replay if mode == "step" else "kernel", "max_kernels": max_kernels, "split": split,
                "command": " && ".join(r["command"] for r in summaries), "settings": workload_settings(stdout)}
        if split:
            meta["runs"] = [{**r, "matched": m} for r, m in zip(summaries, [summaries[0]["kernels"], *matched])]
        (staged / "meta.json").write_text(json.dumps(meta, indent=2))
        kept = set()
        for f in staged.iterdir():  # all succeeded: move into place, one rename each
            os.replace(f, final / f"ncu_{mode}_{f.name}")
            kept.add(f"ncu_{mode}_{f.name}")
        for old in final.glob(f"ncu_{mode}_*"):  # a table an earlier, larger metric set left behind
            if old.name not in kept:
                old.unlink()
    return meta


def ncu_version(ncu: str) -> str:
    p = subprocess.run([ncu, "--version"], capture_output=True, text=True)
    return p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else "unknown"
