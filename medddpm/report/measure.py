"""Measuring the local GPU through the package: the one path behind ``make gpu-measure``
(``scripts/measure_gpu.sh``), ``make gpu-book`` (``gpu_book``) and ``measure=True`` in the
notebooks, so the same notebook is a per-GPU papermill run on a GPU machine and a pure renderer
on a laptop. ``STAGES`` are the kinds of measurement, each owned by one chapter.

    python -m medddpm.report.measure [--out data/results/<gpu-slug>] [--size 128] [--configs …]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from ..core.config import ALL_CONFIGS
from ..core.errors import InputError
from ..core.io import write_text_atomic
from ..profiling.store import check_one_setup

MODEL = "whole-head"  # the paper's model (the book's figures are of it)
SMI_FIELDS = "name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit,pcie.link.gen.max"


def local_gpu_folder(root: Path) -> Path:
    import torch

    from ..core.runtime import env_info

    if not torch.cuda.is_available():
        raise InputError("measuring needs a CUDA GPU; this machine has none (use measure=False to render)")
    return root / env_info()["gpu_slug"]


def _run(argv: list[str]) -> None:
    from ..cli import main

    if main(argv) != 0:
        raise InputError(f"medddpm {' '.join(argv)} failed (see the message above)")


def _nvidia_smi_csv(folder: Path) -> None:
    if not shutil.which("nvidia-smi"):
        return
    p = subprocess.run(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv"], capture_output=True, text=True)
    if p.returncode == 0:
        write_text_atomic(folder / "nvidia-smi.csv", p.stdout)


def _environment(folder: Path) -> None:
    """info.json (versions, GPU) and nvidia-smi.csv of the local GPU in ``folder``."""
    from ..core.runtime import env_info

    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / "info.json", json.dumps(env_info(), indent=2, default=str))
    _nvidia_smi_csv(folder)


def end_to_end(root: Path, size: int = 128, configs: str = ALL_CONFIGS, folder: Path | None = None) -> Path:
    """info.json, nvidia-smi.csv, bench.csv and torch.profiler tables of every configuration for the
    local GPU, in ``folder`` (default ``root/<gpu-slug>``)."""
    folder = folder or local_gpu_folder(root)
    local_gpu_folder(root)  # a GPU is required even when the folder is given
    check_one_setup(folder, MODEL, size)
    _environment(folder)
    _run(["bench", "--model", MODEL, "--size", str(size), "--config", configs, "--steps", "10",
          "--warmup", "3", "--device", "cuda", "--out", str(folder / "bench.csv")])
    _run(["torch-kernels", "--model", MODEL, "--size", str(size), "--configs", configs, "--out", str(folder)])
    return folder


def ncu_modes(root: Path, size: int, configs: str) -> Path:
    """Nsight Compute on the local GPU for every configuration: the paper's options (the window,
    ~4 min each at 128³) and one whole step with the default step set (~1 min each)."""
    folder = local_gpu_folder(root)
    check_one_setup(folder, MODEL, size)  # before the first of several runs, not after it
    for mode in ("paper", "step"):
        _run(["profile", "--gpu-label", folder.name, "--out", str(folder), "--mode", mode, "--configs", configs,
              "--size", str(size)])
    return folder


def ladder(root: Path, size: int, configs: str) -> Path:
    """The fast-path ladder's rungs timed on the local GPU (bench.csv rows, 5 warm-up steps for
    compilation, autotuning and graph capture)."""
    folder = local_gpu_folder(root)
    check_one_setup(folder, MODEL, size)
    _environment(folder)
    _run(["bench", "--model", MODEL, "--size", str(size), "--config", configs, "--steps", "10", "--warmup", "5",
          "--device", "cuda", "--out", str(folder / "bench.csv")])
    return folder


def sampling(root: Path, size: int, configs: str) -> Path:
    """Seconds per sampled volume on the local GPU (sample_bench.csv): DDIM 50 and DDPM (all 250
    steps) of each configuration, batch 1."""
    folder = local_gpu_folder(root)
    _environment(folder)
    out = str(folder / "sample_bench.csv")
    for sampler, extra in (("ddim", ["--steps", "50", "--repeats", "2"]), ("ddpm", ["--repeats", "1"])):
        _run(["bench-sample", "--model", MODEL, "--size", str(size), "--config", configs, "--sampler", sampler,
              *extra, "--device", "cuda", "--out", out])
    return folder


STAGES = {"end_to_end": end_to_end, "ncu": ncu_modes, "ladder": ladder, "sampling": sampling}


def prepare(results_dir, gpus, measure: bool, what: str, size: int, configs: str) -> tuple[Path, list[str]]:
    """A notebook's first step: measure the local GPU if asked (``what``: one of ``STAGES``), then
    return the results folder and the GPUs to render."""
    from . import paper

    if what not in STAGES:
        raise ValueError(f"what must be one of {sorted(STAGES)}, got {what!r}")
    if measure:
        STAGES[what](paper.results_dir(results_dir), size, configs)
    return _store(results_dir, gpus)  # read after measuring: the GPU just measured is among them


def render_only(results_dir, gpus, measure: bool, source: str) -> tuple[Path, list[str]]:
    """``prepare`` for a chapter that owns no stage: with ``measure`` it says in one line where its
    data comes from (``source``) instead of timing a stage another chapter owns a second time."""
    if measure:
        print(f"measure=True: this chapter times nothing itself; its data comes from {source}")
    return _store(results_dir, gpus)


def _store(results_dir, gpus) -> tuple[Path, list[str]]:
    """The results folder (``paper.results_dir``) and the GPUs to render from it (``tables.select_gpus``)."""
    from . import paper, tables

    root = paper.results_dir(results_dir)
    return root, tables.select_gpus(root, gpus)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m medddpm.report.measure")
    p.add_argument("--out", help="results folder (default: data/results/<gpu-slug>)")
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--configs", default=ALL_CONFIGS)
    a = p.parse_args(argv)
    try:
        folder = end_to_end(Path("data/results"), a.size, a.configs, Path(a.out) if a.out else None)
    except InputError as exc:
        print(f"measure: error: {exc}", file=sys.stderr)
        return 2
    print(f"measurements in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
