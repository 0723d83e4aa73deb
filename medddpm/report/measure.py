"""``measure=True`` in the notebooks: measure this machine's GPU through the package first, so
the same notebook is a per-GPU papermill run on a GPU machine and a pure renderer on a laptop."""
from __future__ import annotations

from pathlib import Path

from ..errors import InputError


def local_gpu_folder(root: Path) -> Path:
    import torch

    from ..runtime import env_info

    if not torch.cuda.is_available():
        raise InputError("measure=True needs a CUDA GPU; this machine has none (use measure=False to render)")
    return root / env_info()["gpu_slug"]


def _run(argv: list[str]) -> None:
    from ..cli import main

    if main(argv) != 0:
        raise InputError(f"medddpm {' '.join(argv)} failed (see the message above)")


def end_to_end(root: Path, size: int, configs: str) -> Path:
    """bench.csv, info.json and torch.profiler tables of every configuration for the local GPU."""
    import json

    from ..runtime import env_info

    folder = local_gpu_folder(root)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "info.json").write_text(json.dumps(env_info(), indent=2, default=str))
    _run(["bench", "--model", "whole-head", "--size", str(size), "--config", configs, "--out", str(folder / "bench.csv")])
    _run(["torch-kernels", "--model", "whole-head", "--size", str(size), "--configs", configs, "--out", str(folder)])
    return folder


def ncu_paper_mode(root: Path, size: int, configs: str) -> Path:
    """The paper's ncu options for every configuration on the local GPU (minutes per configuration)."""
    folder = local_gpu_folder(root)
    _run(["profile", "--gpu-label", folder.name, "--out", str(folder), "--mode", "paper", "--configs", configs,
          "--size", str(size)])
    return folder
