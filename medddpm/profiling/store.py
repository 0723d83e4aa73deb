"""The results store: ``data/results/<gpu-slug>/`` with ``bench.csv``, ``env.json``,
``provenance.json`` and ``<config>/`` folders of kernel tables. Loaders return one DataFrame
across every GPU found, with a ``gpu`` column (the folder name)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from ..io import write_text_atomic

RESULTS = Path("data/results")


def gpus(root: str | Path = RESULTS) -> list[str]:
    """GPU folders under ``root`` (those holding a bench.csv or env.json), sorted."""
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


def load_bench(root: str | Path = RESULTS, only: list[str] | None = None) -> pd.DataFrame:
    root = Path(root)
    frames = [pd.read_csv(root / g / "bench.csv").assign(gpu_slug=g) for g in _select(root, only)
              if (root / g / "bench.csv").exists()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_table(name: str, root: str | Path = RESULTS, only: list[str] | None = None) -> pd.DataFrame:
    """Concatenate ``<gpu>/<config>/<name>.parquet`` over GPUs and configurations
    (e.g. 'torch_step_kernels', 'ncu_step_kernels', 'ncu_paper_instructions')."""
    root = Path(root)
    frames = []
    for g in _select(root, only):
        for f in sorted((root / g).glob(f"*/{name}.parquet")):
            frames.append(pd.read_parquet(f).assign(gpu_slug=g, config=f.parent.name))
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
