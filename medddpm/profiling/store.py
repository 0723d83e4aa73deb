"""The results store: ``data/results/<gpu-slug>/`` with ``bench.csv``, ``env.json``,
``provenance.json`` and ``<config>/`` folders of kernel tables. Loaders return one DataFrame
across every GPU found, with a ``gpu_slug`` column (the folder name)."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.errors import InputError
from ..core.io import write_text_atomic

RESULTS = Path("data/results")


def gpus(root: str | Path = RESULTS) -> list[str]:
    """GPU folders under ``root`` (those holding a bench.csv, env.json or info.json), sorted."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and ((p / "bench.csv").exists() or (p / "env.json").exists() or (p / "info.json").exists()))


def _select(root: Path, only: list[str] | None) -> list[str]:
    found = gpus(root)
    if only is None:
        return found
    missing = sorted(set(only) - set(found))
    if missing:
        raise ValueError(f"no results for GPU(s) {missing} under {root}; found {found}")
    return list(only)


def _setup(model: str, size: int | str) -> str:
    cube = f"{size}x{size}x{size}" if isinstance(size, int) or str(size).isdigit() else str(size)
    return f"{model} at {cube}"


def setups_held(folder: str | Path) -> set[str]:
    """Model and volume size ('whole-head at 128x128x128') of each measurement already in one GPU
    folder: bench.csv rows, torch.profiler and ncu metadata."""
    folder = Path(folder)
    held = set()
    if (folder / "bench.csv").exists():
        held |= {_setup(m, s) for m, s in pd.read_csv(folder / "bench.csv")[["model", "size"]].itertuples(index=False)}
    for path in [*folder.glob("*/torch_kernels.json"), *folder.glob("*/ncu_*_meta.json")]:
        meta = json.loads(path.read_text())
        held.add(_setup(meta.get("model"), meta.get("size")))
    return held


def check_one_setup(folder: str | Path, model: str, size: int) -> None:
    """A GPU folder holds one model at one volume size, since its tables are compared configuration
    against configuration (speed-ups, normalized counters). Raise before anything is written."""
    other = setups_held(folder) - {_setup(model, size)}
    if other:
        raise InputError(f"{folder} already holds measurements of {', '.join(sorted(other))}; measuring "
                         f"{_setup(model, size)} into it would mix them in one GPU's tables. Measure into "
                         f"another results folder (--out / results_dir), or with the model and size it holds.")


def load_bench(root: str | Path = RESULTS, only: list[str] | None = None) -> pd.DataFrame:
    """Every GPU's ``bench.csv``, one row per GPU × configuration × model × size × batch, for steps
    of one micro-batch (rows of ``bench --grad-accum`` > 1 are left out)."""
    root = Path(root)
    frames = [pd.read_csv(root / g / "bench.csv").assign(gpu_slug=g) for g in _select(root, only)
              if (root / g / "bench.csv").exists()]
    if not frames:
        return pd.DataFrame()
    b = pd.concat(frames, ignore_index=True)  # bench appends: a rerun's row replaces the earlier one
    accum = b["grad_accum"].fillna(1) if "grad_accum" in b else pd.Series(1, index=b.index)  # stores before the column
    b = b[accum == 1].assign(grad_accum=1)  # the book's step: one micro-batch
    return b.drop_duplicates(["gpu_slug", "config", "model", "size", "batch"], keep="last").reset_index(drop=True)


@functools.lru_cache(maxsize=128)
def _parquet(path: str, mtime_ns: int, size: int) -> pd.DataFrame:
    """One version of a parquet table (path, modification time and size name it), read once: a chapter
    loads the same kernel tables many times."""
    return pd.read_parquet(path)


def read_parquet(path: Path) -> pd.DataFrame:
    """``pd.read_parquet(path)``, from ``_parquet``'s cache while the file is unchanged (a copy: callers may modify it)."""
    st = path.stat()
    return _parquet(str(path.resolve()), st.st_mtime_ns, st.st_size).copy()


def load_table(name: str, root: str | Path = RESULTS, only: list[str] | None = None) -> pd.DataFrame:
    """Concatenate ``<gpu>/<config>/<name>.parquet`` over GPUs and configurations
    (e.g. 'torch_step_kernels', 'ncu_step_kernels', 'ncu_paper_instructions')."""
    root = Path(root)
    frames = []
    for g in _select(root, only):
        for f in sorted((root / g).glob(f"*/{name}.parquet")):
            frames.append(read_parquet(f).assign(gpu_slug=g, config=f.parent.name))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_json(name: str, root: str | Path = RESULTS, only: list[str] | None = None) -> dict[str, Any]:
    """``{gpu: content}`` of ``<gpu>/<name>`` (e.g. 'env.json', 'info.json')."""
    root = Path(root)
    return {g: json.loads((root / g / name).read_text()) for g in _select(root, only) if (root / g / name).exists()}


def update_env(folder: str | Path, **entries: Any) -> dict[str, Any]:
    """Merge ``entries`` into ``folder/env.json`` (nested dicts merged one level deep), atomically."""
    path = Path(folder) / "env.json"
    env = json.loads(path.read_text()) if path.exists() else {}
    for k, v in entries.items():
        if isinstance(v, dict) and isinstance(env.get(k), dict):
            env[k] = {**env[k], **v}
        else:
            env[k] = v
    write_text_atomic(path, json.dumps(env, indent=2, default=str))
    return env
