"""Compiled work kept across processes (issue 48): one folder, ``MEDDDPM_CACHE`` (default
``~/.cache/medddpm``), holds Inductor's and Triton's on-disk caches and one Mega-Cache file
(``torch.compiler.save_cache_artifacts``) per key: torch, Triton, CUDA, the GPU, the run
configuration and the volume size. Anything that invalidates compiled code changes the key.

``medddpm warmup`` fills it; ``Sampler`` loads a key's file before its first compile and saves it
after each new batch size it compiled.
"""
from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

import torch

from ..core.io import atomic_path

CACHE_ENV = "MEDDDPM_CACHE"
ALLOW_AUTOGRAD_FUNCTIONS = "autograd_cache_allow_custom_autograd_functions"  # torch._functorch.config's switch
DEFAULT_CACHE = Path("~/.cache/medddpm")


def root() -> Path:
    """The cache folder: ``$MEDDDPM_CACHE``, else ``~/.cache/medddpm``."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def use() -> Path:
    """Point Inductor's and Triton's caches into the folder (unless the user set them) and return it.

    Also let AOT autograd's cache keep graphs that hold a custom ``torch.autograd.Function``
    (``model._DenseGradCat``, ``fast``'s skip concatenation: pure, its forward and backward traced
    into the graph the cache key hashes). PyTorch bypasses the cache for them by default, so a warm
    ``train --config fast`` traced and partitioned its joint graph again in every process (issue 48:
    "Bypassing autograd cache due to: Unsupported call_function target autograd_function_apply",
    H100, ``time_to_result/small-job-precompile-2026-11-26/train-cache/``)."""
    folder = root()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(folder / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(folder / "triton"))
    import torch._functorch.config as functorch_config

    if hasattr(functorch_config, ALLOW_AUTOGRAD_FUNCTIONS):  # a torch without the switch caches as it does
        setattr(functorch_config, ALLOW_AUTOGRAD_FUNCTIONS, True)
    return folder


def key(config: str, size: tuple[int, ...], device: torch.device) -> str:
    """A readable, filesystem-safe key of everything compiled code depends on."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    parts = [torch.__version__, triton_version, str(torch.version.cuda), gpu, config, "x".join(map(str, size))]
    digest = hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
    return f"{config}-{'x'.join(map(str, size))}-{digest}"


def artifact(k: str) -> Path:
    return root() / "mega" / f"{k}.bin"


def load(k: str) -> bool:
    """Load the key's Mega-Cache into this process's compile caches; whether it did. A cache that
    cannot be read only costs the compilation it would have saved (one warning)."""
    path = artifact(k)
    if not path.is_file():
        return False
    try:
        return torch.compiler.load_cache_artifacts(path.read_bytes()) is not None  # None: nothing in it was usable
    except Exception as exc:  # a stale or damaged file: compile as if cold
        warnings.warn(f"compile cache {path} not loaded ({type(exc).__name__}: {exc}); compiling anew", stacklevel=2)
        return False


def save(k: str) -> Path | None:
    """Write what this process compiled (and loaded) as the key's Mega-Cache, atomically; None
    when nothing was compiled (a CPU, an eager configuration) or it could not be written (one
    warning: the samples are what matters)."""
    path = artifact(k)
    try:
        got = torch.compiler.save_cache_artifacts()
        if not got or not got[0]:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_bytes(got[0])
    except Exception as exc:
        warnings.warn(f"compile cache {path} not written ({type(exc).__name__}: {exc})", stacklevel=2)
        return None
    return path
