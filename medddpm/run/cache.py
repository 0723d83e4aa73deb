"""Compiled work kept across processes (issue 48): one folder, ``MEDDDPM_CACHE`` (default
``~/.cache/medddpm``), holds Inductor's and Triton's on-disk caches and one Mega-Cache file
(``torch.compiler.save_cache_artifacts``) per key: torch, Triton, CUDA, the GPU, the run
configuration and the volume size. Anything that invalidates compiled code changes the key.

``medddpm warmup`` fills it; ``Sampler`` loads a key's file before its first compile and saves it
after each new batch size it compiled. It also remembers Triton's own cache key
(``remember_triton_key``), which Triton recomputes in every process before its first kernel.
"""
from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

import torch

from ..core.io import atomic_path, write_text_atomic

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
    H100, the small-job-precompile run's ``train-cache/`` in ``time_to_result/``)."""
    folder = root()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(folder / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(folder / "triton"))
    if torch.cuda.is_available():  # where Triton's kernels launch (a CPU runs their references)
        remember_triton_key(folder)
    import torch._functorch.config as functorch_config

    if hasattr(functorch_config, ALLOW_AUTOGRAD_FUNCTIONS):  # a torch without the switch caches as it does
        setattr(functorch_config, ALLOW_AUTOGRAD_FUNCTIONS, True)
    return folder


def triton_fingerprint(base: Path, version: str) -> str:
    """What Triton's key (``triton.runtime.cache.triton_key``) hashes, by path, size and modification
    time instead of by content: its version, its frontend's cache module and every file of its
    compiler, backends, language and ``_C`` (libtriton) folders. Stat calls only, no reading."""
    h = hashlib.sha256(version.encode())
    for part in ("runtime/cache.py", "compiler", "backends", "language", "_C"):
        p = base / part
        for f in [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file()):
            st = f.stat()
            h.update(f"{f.relative_to(base)}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()[:32]


def remember_triton_key(folder: Path) -> str | None:
    """Triton's installation key, read from ``folder/triton-key/<fingerprint>.txt`` and installed as
    ``triton.runtime.cache.triton_key`` (and ``triton.compiler.compiler``'s name for it); computed
    by Triton and written there when the fingerprint is new. The key, or None without Triton.

    Triton hashes its whole installation (every compiler, backend and language module, walked with
    ``pkgutil``, and the 500 MB libtriton) once in each process, before its first kernel launch,
    even when every kernel is in its on-disk cache: 3.5 s of a warm 1-mask ``sample`` on an H100
    (the start-up-tried run's ``call-a/profile-new-1-warm.txt`` in ``time_to_result/``). A different
    installation changes the fingerprint, so its key is computed anew."""
    try:
        import triton
        import triton.compiler.compiler as tcompiler
        import triton.runtime.cache as tcache
    except ImportError:
        return None
    original = getattr(tcache, "triton_key", None)
    if original is None:  # a Triton without the function: nothing to remember
        return None
    if getattr(original, "remembered", False):
        return original()
    path = folder / "triton-key" / f"{triton_fingerprint(Path(triton.__file__).parent, triton.__version__)}.txt"
    try:
        value = path.read_text()
    except OSError:
        value = original()
        try:
            write_text_atomic(path, value)
        except OSError as exc:  # only a later process's 3 s are lost
            warnings.warn(f"Triton's key not kept in {path} ({exc})", stacklevel=2)

    def remembered() -> str:
        return value

    remembered.remembered = True
    for module in (tcache, tcompiler):
        if getattr(module, "triton_key", None) is original:
            module.triton_key = remembered
    return value


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
