"""Running Nsight Compute on the workload and turning each report into small tables.

Two modes (``medddpm profile --mode``):

``paper``  the paper's options (§3.2): ``--set full --call-stack --nvtx --csv --export
           --launch-skip 10 --launch-count 100 --target-processes all``, plus
           ``--clock-control none`` (required where clocks may not be touched: the one deviation)
           and ``--metrics sass__inst_executed_per_opcode_category`` (adds the per-class instance
           values Figs 7/9 need). The window is counted from process start, as in the paper.
``step``   every kernel of one steady-state training step: the workload runs ``warmup`` steps and
           wraps the last one in cudaProfilerStart/Stop (``--profile-from-start off``) and ncu
           replays the whole application once per pass (``--replay-mode application``). An NVTX
           filter is *not* used to select the step: backward kernels are launched from
           autograd's own thread, outside the main thread's ``train_step`` push/pop range, and
           ``--nvtx-include train_step/`` drops all of them (seen on an H200: 439 of ~1,300
           kernels kept). ``--nvtx`` still records ranges where they apply. Instead of sections it
           collects only ``STEP_METRICS`` (the metrics every figure but Fig 5 needs; Fig 5 needs
           the rule estimates of full sections, which only ``paper`` mode has). Measured on an
           H200 with kernel replay: ~0.5 s per kernel, so a 128³ FP32 step (~1,300 kernels)
           takes ~11 minutes, over the 8 we aimed for; ``--replay application`` re-runs the
           workload once per pass instead (ran past 320 s for baseline on an H200: not faster
           there).

The ``.ncu-rep`` report stays in a temporary folder; what is kept are gzipped CSV exports (raw
page, instance values, rule rows) and parquet tables, written into ``OUT/<config>/`` only once
everything for that configuration succeeded.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from ..errors import InputError, MedddpmError
from .tidy import INSTANCE_METRIC, METRICS, tidy

PAPER_OPTIONS = ["--set", "full", "--call-stack", "--nvtx", "--launch-skip", "10", "--launch-count", "100",
                 "--target-processes", "all"]
CLOCK = ["--clock-control", "none"]
STEP_METRICS = sorted(set(METRICS.values()) | {INSTANCE_METRIC, "launch__grid_size", "launch__block_size",
                                                "launch__registers_per_thread"})


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


def ncu_command(ncu: str, mode: str, export: Path, workload: list[str], metrics: Sequence[str] = STEP_METRICS,
                replay: str = "kernel") -> list[str]:
    """The full ncu command line for ``mode`` ('paper' or 'step'); ``replay`` applies to step mode."""
    if replay not in ("kernel", "application"):
        raise InputError(f"replay must be 'kernel' or 'application', got {replay!r}")
    if mode == "paper":
        opts = PAPER_OPTIONS + ["--metrics", INSTANCE_METRIC]
    elif mode == "step":
        # The step is selected with cudaProfilerStart/Stop, not with an NVTX filter: autograd
        # launches the backward kernels from its own thread, outside the main thread's push/pop
        # `train_step` range, so `--nvtx-include train_step/` would silently drop the backward
        # pass. LaunchStats costs no counter pass and keeps ncu from adding its default set.
        opts = ["--profile-from-start", "off", "--replay-mode", replay, "--nvtx",
                "--section", "LaunchStats", "--metrics", ",".join(metrics)]
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


def export_csvs(ncu: str, report: Path, folder: Path) -> dict[str, Path]:
    """raw / details / instances CSVs of a report, gzipped, in ``folder``."""
    import gzip

    pages = {
        "raw": ["--page", "raw", "--print-units", "base"],
        "details": ["--page", "details", "--print-units", "base"],
        "instances": ["--page", "raw", "--print-units", "base", "--print-metric-instances", "details",
                      "--metrics", INSTANCE_METRIC],
    }
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


def run_group(cmd: list[str], timeout_s: float | None, config: str) -> subprocess.CompletedProcess:
    """Run ncu in its own process group; on time-out or interrupt the whole group (ncu and the
    profiled workload it started) is killed, so no orphan keeps the GPU's counters busy."""
    import signal

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException as exc:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise ProfilerError(f"{config}: ncu ran past {timeout_s:.0f} s and was stopped; nothing was written") from None
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def profile_config(ncu: str, mode: str, model: str, config: str, size: int, warmup: int, out: Path,
                   timeout_s: float | None = None, replay: str = "kernel") -> dict[str, Any]:
    """Profile one configuration; on success ``out/<config>/ncu_<mode>_*`` exist, else nothing new."""
    steps = 1 if mode == "paper" else warmup + 1
    work = workload_command(model, config, size, steps, profile_last=(mode == "step"))
    final = out / config
    final.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".ncu-{config}-", dir=out) as tmp:
        tmp = Path(tmp)
        cmd = ncu_command(ncu, mode, tmp / "report", work, replay=replay)
        p = run_group(cmd, timeout_s, config)
        check_output(p.stdout + p.stderr, p.returncode)
        report = tmp / "report.ncu-rep"
        if not report.exists():
            raise ProfilerError(f"{config}: ncu wrote no report; last output: {(p.stdout + p.stderr)[-300:]}")
        staged = tmp / "staged"
        staged.mkdir()
        csvs = export_csvs(ncu, report, staged)
        tables = tidy(csvs["raw"], csvs["details"], csvs["instances"])
        if tables["kernels"].empty:
            raise ProfilerError(f"{config}: the report holds zero kernels")
        for name, df in tables.items():
            df.to_parquet(staged / f"{name}.parquet", index=False)
        meta = {"mode": mode, "config": config, "model": model, "size": size, "warmup": warmup if mode == "step" else 0,
                "kernels": int(len(tables["kernels"])), "command": " ".join(cmd),
                "settings": workload_settings(p.stdout)}
        (staged / "meta.json").write_text(json.dumps(meta, indent=2))
        for f in staged.iterdir():  # all succeeded: move into place, one rename each
            os.replace(f, final / f"ncu_{mode}_{f.name}")
    return meta


def ncu_version(ncu: str) -> str:
    p = subprocess.run([ncu, "--version"], capture_output=True, text=True)
    return p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else "unknown"
