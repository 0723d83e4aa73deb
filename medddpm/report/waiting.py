"""Chapter 15, time to result (issue 48): what a user waits for, from ``scripts/time_to_result.sh``
(``<gpu>/time_to_result/time_to_result.csv`` and ``same_files.csv``, ``medddpm.profiling.waiting``),
as a table and facts against the issue's targets.

A store may hold these results on any GPU, or on none: every function returns its full shape then,
and every fact reads "—" with what is missing.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..core.config import FAST_FROM
from ..profiling.waiting import COLUMNS, SAME_COLUMNS
from .present import gpu_name
from .tables import results_csv
from .wording import missing

FOLDER = "time_to_result"
STORE_FREE = ("tr_fast_from",)  # the package's rule, whatever the store holds
# issue 48's targets (s, process start to files written): 1 mask by default, warm and cold; 100 masks, warm
TARGETS = {("default", 1, "warm"): 5.0, ("default", 1, "cold"): 15.0, ("default", 100, "warm"): 25.0}


def rows(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Every timed command of the store's GPUs, with ``what`` (sample or train), ``nproc`` (ranks) and
    the newest row of duplicates."""
    df = results_csv(Path(root), gpus, f"{FOLDER}/time_to_result")
    if df.empty:
        df = pd.DataFrame(columns=[*COLUMNS, "gpu_slug"])
        return df.assign(what=pd.Series(dtype=str), nproc=pd.Series(dtype=int))
    nproc = pd.to_numeric(df["command"].str.extract(r"--nproc (\d+)")[0]).fillna(1).astype(int)
    df = df.assign(what=df["command"].str.split().str[0], nproc=nproc)
    keys = ["gpu_slug", "what", "config", "volumes", "cache", "nproc"]
    return df.drop_duplicates(keys, keep="last").reset_index(drop=True)


def same_files(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Every bit-for-bit comparison of two runs' files the store holds."""
    df = results_csv(Path(root), gpus, f"{FOLDER}/same_files")
    return df if len(df) else pd.DataFrame(columns=[*SAME_COLUMNS, "gpu_slug"])


def table(root: Path, gpus: list[str]) -> pd.DataFrame:
    """The chapter's table: one row per command, as a reader names it."""
    df = rows(root, gpus)
    out = pd.DataFrame({"GPU": df["gpu_slug"].map(gpu_name), "command": df["what"], "--config": df["config"],
                        "volumes": df["volumes"], "ranks": df["nproc"], "compile cache": df["cache"],
                        "wall s": df["wall_s"]})
    return out.sort_values(["GPU", "command", "--config", "volumes", "ranks", "compile cache"]).reset_index(drop=True)


def _wall(df: pd.DataFrame, config: str, volumes: int, cache: str, nproc: int = 1) -> float | None:
    hit = df[(df["what"] == "sample") & (df["config"] == config) & (df["volumes"] == volumes) & (df["cache"] == cache)
             & (df["nproc"] == nproc) & (df["rc"] == 0)] if len(df) else df
    return float(hit["wall_s"].iloc[-1]) if len(hit) else None


def facts(root: Path, gpus: list[str]) -> dict[str, str]:
    """Chapter 15's facts (``tr_``), from the first GPU of the store that holds the measurement."""
    have = [g for g in gpus if (Path(root) / g / FOLDER / "time_to_result.csv").exists()]
    df = rows(root, have[:1])
    f = {"tr_fast_from": str(FAST_FROM), "tr_gpu": gpu_name(have[0]) if have else missing("time_to_result.csv")}

    def wall(key: str, config: str, volumes: int, cache: str, nproc: int = 1) -> float | None:
        w = _wall(df, config, volumes, cache, nproc)
        f[key] = f"{w:.1f} s" if w is not None else missing(f"`sample` row of {volumes} masks ({config}, {cache})")
        return w

    wall("tr_one_cold", "default", 1, "cold")
    wall("tr_one_warm", "default", 1, "warm")
    wall("tr_default8_cold", "default", 8, "cold")
    wall("tr_default8_warm", "default", 8, "warm")
    wall("tr_fast8_cold", "fast", 8, "cold")
    w8 = wall("tr_fast8_warm", "fast", 8, "warm")
    w100 = wall("tr_hundred_warm", "default", 100, "warm")
    f["tr_per_volume"] = (f"{(w100 - w8) / 92:.2f} s" if w8 is not None and w100 is not None
                          else missing("fast's 8- and 100-mask warm rows"))
    nproc = df[(df["what"] == "sample") & (df["nproc"] > 1)] if len(df) else df
    if len(nproc):
        r = nproc.iloc[-1]
        one = _wall(df, r["config"], int(r["volumes"]), r["cache"])
        f["tr_nproc"] = (f"{r['volumes']} masks on {r['nproc']} ranks took {r['wall_s']:.1f} s"
                         + (f", one GPU {one:.1f} s ({one / r['wall_s']:.1f}×)" if one is not None
                            else "; the store has no one-GPU row of the same masks"))
    else:
        f["tr_nproc"] = missing("`sample --nproc` row")
    met = []
    for (config, volumes, cache), limit in TARGETS.items():
        w = _wall(df, config, volumes, cache)
        if w is not None:
            met.append(f"{volumes} mask{'s' if volumes > 1 else ''} {cache}, ≤ {limit:g} s: "
                       f"{'met' if w <= limit else 'missed'} ({w:.1f} s)")
    f["tr_targets"] = "; ".join(met) if met else missing("rows of the targets")
    same = same_files(root, have[:1])
    f["tr_same"] = ("; ".join(f"{r['what']}: {r['identical']} of {r['files']} files identical" for _, r in same.iterrows())
                    if len(same) else missing("same_files.csv"))
    return f

