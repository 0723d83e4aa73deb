"""Running Nsight Compute on the workload and turning each report into small tables.

Three modes (``medddpm profile --mode``):

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

``roofline`` the same steady step as ``step`` mode, with only what a roofline point needs: kernel
           time, DRAM bytes read and written, and the FLOP counters of the one pipe the
           configuration's maths runs on (``flop_paths``: bf16 or TF32 tensor path, or the FP32
           pipes), so that the run stays at one counter pass where it can and a whole 128³ step
           fits a 10-minute run (see ``ROOFLINE_FLOPS``). Stored apart from step mode's tables
           (``ncu_roofline_*``), every point self-consistent: time, bytes and FLOPs of one launch.

The ``.ncu-rep`` report stays in a temporary folder; what is kept are gzipped CSV exports (raw
page, instance values, rule rows) and parquet tables, written into ``OUT/<config>/`` only once
everything for that configuration succeeded.
"""
from __future__ import annotations

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
from typing import Any, Sequence

from ..core.config import Knobs, run_config
from ..core.errors import InputError, MedddpmError
from .tidy import INSTANCE_METRIC, METRICS, tidy

MODES = ("paper", "step", "roofline")
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
}
# Named step sets: cumulative groups. Only `core` (1 counter pass) profiles a whole 128³ FP32 step
# in about a minute; `full` has every step metric the figures use (12 passes on the H100).
STEP_SETS: dict[str, tuple[str, ...]] = {
    "core": ("core",),
    "lean": ("core", "pipes"),
    "standard": ("core", "pipes", "memory", "stalls"),
    "full": ("core", "pipes", "memory", "stalls", "classes"),
}
DEFAULT_STEP_SET = "core"
LAUNCH = ["launch__grid_size", "launch__block_size", "launch__registers_per_thread"]


# Roofline mode: what a roofline point needs (time, DRAM bytes) and the FLOP counters of the pipe
# the configuration's maths runs on (``flop_paths``). Counter passes a kernel on an H200 (ncu
# 2025.3.1, fast_path/ncu_passes.csv): DRAM bytes 1, bf16 ops 1, TF32 ops 1, bf16 + TF32 ops 3.
# That is why one run counts one path: with ≥ 2 passes ncu replays every kernel and restores the
# device memory before each pass, which cost ~0.2 s a kernel at 128³ (a 1,600-kernel step then
# outruns a 10-minute run), while one pass costs ~30 ms.
ROOFLINE_BASE = [METRICS[k] for k in ("duration_ns", "dram_read_bytes", "dram_write_bytes")]
ROOFLINE_FLOPS: dict[str, list[str]] = {
    "bf16": [METRICS["tensor_ops_bf16"]],  # bf16 tensor-core path (autocast)
    "tf32": [METRICS["tensor_ops_tf32"]],  # TF32 tensor-core path
    "fp32": [METRICS[k] for k in ("ffma_thread_inst", "fadd_thread_inst", "fmul_thread_inst")],  # FP32 pipes (SASS-instrumented)
}


def flop_paths(knobs: Knobs) -> tuple[str, ...]:
    """The FLOP counters a configuration's convolutions and matmuls need: bf16 autocast → the bf16
    tensor path; TF32 on, or PyTorch's default (TF32 convolutions) → the TF32 tensor path; true
    FP32 → the FP32 pipes."""
    if knobs.precision == "bf16":
        return ("bf16",)
    return ("fp32",) if knobs.tf32 is False else ("tf32",)


def roofline_metrics(paths: Sequence[str]) -> list[str]:
    """The ncu metric names of roofline mode for the FLOP ``paths`` (keys of ``ROOFLINE_FLOPS``)."""
    unknown = set(paths) - set(ROOFLINE_FLOPS)
    if unknown or not paths:
        raise InputError(f"FLOP paths must be some of {sorted(ROOFLINE_FLOPS)}, got {list(paths)}")
    return sorted({*ROOFLINE_BASE, *(m for p in paths for m in ROOFLINE_FLOPS[p]), *LAUNCH})


def step_metrics(step_set: str = DEFAULT_STEP_SET) -> list[str]:
    """The ncu metric names of a named step set (see ``STEP_SETS``)."""
    if step_set not in STEP_SETS:
        raise InputError(f"--step-set must be one of {sorted(STEP_SETS)}, got {step_set!r}")
    return sorted({m for g in STEP_SETS[step_set] for m in STEP_GROUPS[g]} | set(LAUNCH))


class ProfilerError(MedddpmError, RuntimeError):
    """ncu is missing, may not read the counters, or produced no usable report."""


def find_ncu(ncu: str | None = None) -> str:
    path = shutil.which(ncu or os.environ.get("NCU", "ncu"))
    if not path:
        raise ProfilerError("ncu (Nsight Compute CLI) was not found on PATH; install Nsight Compute or set NCU=/path/to/ncu")
    return path


def workload_command(model: str, config: str, size: int, steps: int, profile_last: bool) -> list[str]:
    cmd = [sys.executable, "-m", "medddpm.profiling.workload", "--model", model, "--config", config,
           "--size", str(size), "--steps", str(steps)]
    return cmd + (["--profile-last"] if profile_last else [])


def ncu_command(ncu: str, mode: str, export: Path, workload: list[str], metrics: Sequence[str] | None = None,
                replay: str = "kernel", max_kernels: int | None = None) -> list[str]:
    """The full ncu command line for ``mode`` (``MODES``); ``replay`` and ``max_kernels`` (the
    first N kernels of the step only) apply to step and roofline mode."""
    if replay not in ("kernel", "application"):
        raise InputError(f"replay must be 'kernel' or 'application', got {replay!r}")
    if mode == "paper":
        opts = PAPER_OPTIONS + ["--metrics", INSTANCE_METRIC]
    elif mode in ("step", "roofline"):
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
        raise InputError(f"--mode must be one of {MODES}, got {mode!r}")
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


def export_csvs(ncu: str, report: Path, folder: Path, instances: bool = True) -> dict[str, Path]:
    """raw / details (/ instances, when the report has the instruction-class metric) CSVs of a
    report, gzipped, in ``folder``."""
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
        path = folder / f"ncu_{name}.csv.gz"
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


def run_group(cmd: list[str], timeout_s: float | None, config: str, log: Path) -> subprocess.CompletedProcess:
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
                raise ProfilerError(f"{config}: ncu ran past {timeout_s:.0f} s after {done} kernels and was stopped; "
                                    "nothing was written") from None
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, log.read_text(errors="replace"), "")


def profile_config(ncu: str, mode: str, model: str, config: str, size: int, warmup: int, out: Path,
                   timeout_s: float | None = None, replay: str = "kernel",
                   step_set: str = DEFAULT_STEP_SET, max_kernels: int | None = None) -> dict[str, Any]:
    """Profile one configuration; on success ``out/<config>/ncu_<mode>_*`` exist, else nothing new."""
    steps = 1 if mode == "paper" else warmup + 1
    paths = flop_paths(run_config(config)) if mode == "roofline" else None
    metrics = step_metrics(step_set) if mode == "step" else roofline_metrics(paths) if paths else None
    work = workload_command(model, config, size, steps, profile_last=(mode != "paper"))
    final = out / config
    final.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".ncu-{config}-", dir=out) as tmp:
        tmp = Path(tmp)
        cmd = ncu_command(ncu, mode, tmp / "report", work, metrics=metrics, replay=replay, max_kernels=max_kernels)
        t0 = time.monotonic()
        p = run_group(cmd, timeout_s, config, tmp / "ncu.log")
        seconds = time.monotonic() - t0
        check_output(p.stdout, p.returncode)
        report = tmp / "report.ncu-rep"
        if not report.exists():
            raise ProfilerError(f"{config}: ncu wrote no report; last output: {p.stdout[-300:]}")
        staged = tmp / "staged"
        staged.mkdir()
        csvs = export_csvs(ncu, report, staged, instances=metrics is None or INSTANCE_METRIC in metrics)
        tables = tidy(csvs["raw"], csvs["details"], csvs.get("instances"))
        if tables["kernels"].empty:
            raise ProfilerError(f"{config}: the report holds zero kernels")
        for name, df in tables.items():
            df.to_parquet(staged / f"{name}.parquet", index=False)
        meta = {"mode": mode, "config": config, "model": model, "size": size, "warmup": warmup if mode != "paper" else 0,
                "flop_paths": list(paths) if paths else None,
                "kernels": int(len(tables["kernels"])), "seconds": round(seconds, 1), **progress(p.stdout),
                "step_set": {"name": step_set, "groups": list(STEP_SETS[step_set])} if mode == "step" else None,
                "replay": replay if mode != "paper" else "kernel", "max_kernels": max_kernels,
                "command": " ".join(cmd), "settings": workload_settings(p.stdout)}
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
