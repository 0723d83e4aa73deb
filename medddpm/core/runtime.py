"""Applying run knobs to PyTorch (paper §5, Alg. 1–2) and recording the environment they ran in."""
from __future__ import annotations

import contextlib
import os
import platform
import re
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from .errors import InputError


def default_device() -> str:
    """The device a command or a ``Sampler`` runs on when none is named: the GPU where there is one."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def process_start() -> float | None:
    """The ``time.perf_counter()`` reading at which this process started (Linux's /proc, to 10 ms),
    None where it cannot be read: the origin of ``sample``'s timing line, so that it counts the
    interpreter's start and the imports too, as a user's clock does."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime: clock ticks after boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.perf_counter() - max(uptime - started, 0.0)


def resolve_device(name: str | None) -> torch.device:
    """'cpu', 'cuda' or 'cuda:N', checked against the hardware; None: ``default_device()``."""
    if name is None:
        name = default_device()
    if name not in ("cpu", "cuda") and not re.fullmatch(r"cuda:\d+", name):
        raise InputError(f"--device must be 'cpu', 'cuda' or 'cuda:N', got {name!r}")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise InputError("--device cuda was asked for, but PyTorch sees no CUDA GPU here")
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise InputError(f"--device {name}: only {torch.cuda.device_count()} GPU(s) visible")
    return torch.device(name)


# TF32 is read and written through ONE API, the legacy ``allow_tf32`` flags: Inductor (torch 2.11)
# reads the legacy getters while it compiles, and those raise once the newer per-backend
# ``fp32_precision`` setters have been used ("mix of the legacy and new APIs"), which broke
# ``torch.compile(mode="max-autotune")``. The legacy setters keep both views consistent.


def tf32_state() -> dict[str, bool]:
    """Effective TF32 use of matmul and cuDNN convolutions."""
    return {"tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
            "tf32_conv": bool(torch.backends.cudnn.allow_tf32)}


def set_tf32(enabled: bool) -> None:
    """Switch TF32 for matmul and cuDNN convolutions on or off, explicitly (paper Alg. 1)."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


# PyTorch's own defaults, read once at import (before any knob is applied), so that the
# 'pytorch-default' configuration means the same thing whatever ran before it in this process.
_DEFAULT_TF32 = tf32_state()
_DEFAULT_BENCHMARK = bool(torch.backends.cudnn.benchmark)
_HAS_CUDNN = torch.backends.cudnn.is_available()


def benchmark_limit() -> int | None:
    """How many algorithms cuDNN's autotuner times per convolution (0: all); None without cuDNN."""
    return torch.backends.cudnn.benchmark_limit if _HAS_CUDNN else None


_DEFAULT_LIMIT = benchmark_limit()


def set_backend_flags(tf32: bool | None, cudnn_benchmark: bool | None, cudnn_benchmark_limit: int | None = None) -> None:
    """Process-wide TF32 and cuDNN-autotuner flags; None = PyTorch's import-time default. The
    autotuner's algorithm limit applies where cuDNN is built in (a CPU build has no autotuner).
    Called by ``medddpm.run.engine`` only, the one place that applies a configuration."""
    if tf32 is None:
        torch.backends.cuda.matmul.allow_tf32 = _DEFAULT_TF32["tf32_matmul"]
        torch.backends.cudnn.allow_tf32 = _DEFAULT_TF32["tf32_conv"]
    else:
        set_tf32(tf32)
    torch.backends.cudnn.benchmark = _DEFAULT_BENCHMARK if cudnn_benchmark is None else cudnn_benchmark
    if _HAS_CUDNN:
        torch.backends.cudnn.benchmark_limit = _DEFAULT_LIMIT if cudnn_benchmark_limit is None else cudnn_benchmark_limit


@contextlib.contextmanager
def preserved_backend_flags() -> Iterator[None]:
    """Whatever the block sets, the TF32 and autotuner flags are as before afterwards (a reference
    forward in the middle of another configuration's run)."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark,
             benchmark_limit())
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark, limit = saved
        if _HAS_CUDNN:
            torch.backends.cudnn.benchmark_limit = limit


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' → 'h200'; 'NVIDIA H100 80GB HBM3' → 'h100-80gb-hbm3'."""
    name = re.sub(r"^(nvidia|tesla)\s+", "", name.strip(), flags=re.I)
    name = re.sub(r"^(nvidia|tesla)\s+", "", name, flags=re.I)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def _nvidia_smi(field: str) -> str | None:
    """One ``nvidia-smi --query-gpu`` field of GPU 0, or None where nvidia-smi is missing."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def env_info(device: torch.device | None = None) -> dict[str, Any]:
    """torch/CUDA/cuDNN versions, the GPU's name, SMs, L2 and memory, effective TF32 settings."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": torch.cuda.is_available(),
        **tf32_state(),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "gpu": None,
    }
    if torch.cuda.is_available():
        dev = device if device is not None and device.type == "cuda" else torch.device("cuda", 0)
        p = torch.cuda.get_device_properties(dev)
        info["gpu"] = p.name
        info["gpu_slug"] = gpu_slug(p.name)
        info["sm_count"] = p.multi_processor_count
        info["compute_capability"] = f"{p.major}.{p.minor}"
        info["memory_gib"] = round(p.total_memory / 2**30, 2)
        info["l2_mib"] = round(getattr(p, "L2_cache_size", 0) / 2**20, 2)
        info["driver"] = _nvidia_smi("driver_version")
    else:
        info["gpu_slug"] = "cpu"
    return info
