"""Chapter 15, time to result (issue 48): what a user waits for, from ``scripts/time_to_result.sh``
(``<gpu>/time_to_result/time_to_result.csv`` and ``same_files.csv``, ``medddpm.profiling.waiting``),
as a table and facts against the issue's targets.

A store may hold these results on any GPU, or on none: every function returns its full shape then,
and every fact reads "—" with what is missing.
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from ..core.config import FAST_FROM, FAST_FROM_CALLS, SAMPLING_ALIASES
from ..diffusion.solvers import FEW_STEP, RECOMMENDED
from ..profiling.waiting import COLUMNS, SAME_COLUMNS
from ..sample.sampler import fast_from
from .present import gpu_name
from .tables import results_csv
from .wording import missing, number

FOLDER = "time_to_result"
STORE_FREE = ("tr_fast_from", "tr_fast_from_calls", "tr_fast_from_ddpm", "tr_default_sampler")  # the package's rules, whatever the store holds
# `sample`'s default sampler until 2026-11-26 (issue 47 made DDPM 250 the default): what a row without the
# ``sampler`` column (written before it) ran unless its command names --sampler
EARLIER_DEFAULT = FEW_STEP.sampler
# issue 48's targets (s, process start to files written): 1 mask by default, warm and cold; 100 masks, warm
TARGETS = {("default", 1, "warm"): 5.0, ("default", 1, "cold"): 15.0, ("default", 100, "warm"): 25.0}


def rows(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Every timed command of the store's GPUs, with ``what`` (sample or train), ``nproc`` (ranks) and
    the newest row of duplicates."""
    df = results_csv(Path(root), gpus, f"{FOLDER}/time_to_result")
    if df.empty:
        df = pd.DataFrame(columns=[*COLUMNS, "gpu_slug"])
        return df.assign(what=pd.Series(dtype=str), nproc=pd.Series(dtype=int), sampler=pd.Series(dtype=str))
    nproc = pd.to_numeric(df["command"].str.extract(r"--nproc (\d+)")[0]).fillna(1).astype(int)
    df = df.assign(what=df["command"].str.split().str[0], nproc=nproc)
    named = df["command"].str.extract(r"--sampler (\S+)")[0]
    stored = df["sampler"].astype(object) if "sampler" in df else pd.Series(None, index=df.index, dtype=object)
    df["sampler"] = stored.fillna(named.astype(object)).fillna(EARLIER_DEFAULT).where(df["what"] == "sample", "")
    keys = ["gpu_slug", "what", "config", "sampler", "volumes", "cache", "nproc"]
    return df.drop_duplicates(keys, keep="last").reset_index(drop=True)


def same_files(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Every bit-for-bit comparison of two runs' files the store holds (the newest of each, per
    sampler: a row written before the ``sampler`` column ran ``EARLIER_DEFAULT``)."""
    df = results_csv(Path(root), gpus, f"{FOLDER}/same_files")
    if df.empty:
        return pd.DataFrame(columns=[*SAME_COLUMNS, "gpu_slug"])
    stored = df["sampler"].astype(object) if "sampler" in df else pd.Series(None, index=df.index, dtype=object)
    df["sampler"] = stored.fillna(EARLIER_DEFAULT)
    return df.drop_duplicates(["gpu_slug", "what", "sampler"], keep="last").reset_index(drop=True)


def table(root: Path, gpus: list[str]) -> pd.DataFrame:
    """The chapter's table: one row per command, as a reader names it."""
    df = rows(root, gpus)
    out = pd.DataFrame({"GPU": df["gpu_slug"].map(gpu_name), "command": df["what"], "--config": df["config"],
                        "sampler": df["sampler"], "volumes": df["volumes"], "ranks": df["nproc"], "compile cache": df["cache"],
                        "wall s": df["wall_s"]})
    return out.sort_values(["GPU", "command", "--config", "volumes", "ranks", "compile cache"]).reset_index(drop=True)


def newest(df: pd.DataFrame, config: str, volumes: int, cache: str, nproc: int = 1,
           sampler: str | None = None) -> pd.Series | None:
    """The newest successful `sample` row of ``rows``' table for that configuration, number of masks,
    cache state and ranks (of ``sampler``, or any), or None."""
    hit = df[(df["what"] == "sample") & (df["config"] == config) & (df["volumes"] == volumes) & (df["cache"] == cache)
             & (df["nproc"] == nproc) & (df["rc"] == 0) & ((df["sampler"] == sampler) if sampler else True)] if len(df) else df
    return hit.iloc[-1] if len(hit) else None


def wall(df: pd.DataFrame, config: str, volumes: int, cache: str, nproc: int = 1,
         sampler: str | None = None) -> float | None:
    """``newest``'s seconds, or None."""
    row = newest(df, config, volumes, cache, nproc, sampler)
    return float(row["wall_s"]) if row is not None else None


# what cProfile's lines of `medddpm sample` name (scripts/time_to_result.sh STAGES=profile): part → (pattern, column)
PROFILE_PARTS = {
    "Python compiling source to bytecode": (r"\{built-in method builtins\.compile\}", "tottime"),
    "registering custom operators": (r"custom_ops\.py:\d+\(_register_to_dispatcher\)", "tottime"),
    "the CUDA driver's start": (r"\{built-in method torch\._C\._cuda_getDeviceCount\}", "tottime"),
    "the 12-step chain": (r"gaussian\.py:\d+\(sample\)", "cumtime"),
}


def profile_parts(path: Path) -> dict[str, float]:
    """Seconds of ``PROFILE_PARTS`` (and ``total``), and each part's calls ("<part> calls"), in a
    ``pstats`` print of a `sample` run; a part the print does not list is left out."""
    text = Path(path).read_text()
    out: dict[str, float] = {}
    total = re.search(r"function calls .* in ([0-9.]+) seconds", text)
    if total:
        out["total"] = float(total[1])
    for part, (pattern, column) in PROFILE_PARTS.items():
        for line in text.splitlines():
            cells = line.split()
            if re.search(pattern, line) and len(cells) >= 6:
                out[part] = float(cells[1] if column == "tottime" else cells[3])
                out[f"{part} calls"] = float(cells[0].split("/")[0])
                break
    return out


def _chain_s(root: Path, gpu: str) -> float | None:
    """The default 12-step chain's seconds a volume (batch 1, 128³) in the GPU's ``sample_bench.csv``."""
    df = results_csv(Path(root), [gpu], "sample_bench")
    if df.empty:
        return None
    hit = df[(df["config"] == SAMPLING_ALIASES["fast"]) & (df["sampler"] == FEW_STEP.sampler)
             & (df["steps"] == FEW_STEP.steps) & (df["spacing"] == FEW_STEP.spacing) & (df["batch"] == 1)
             & (df["size"] == "128x128x128")]
    return float(hit["s_per_volume_median"].iloc[-1]) if len(hit) else None


def facts(root: Path, gpus: list[str]) -> dict[str, str]:
    """Chapter 15's facts (``tr_``), from the first GPU of the store that holds the measurement."""
    have = [g for g in gpus if (Path(root) / g / FOLDER / "time_to_result.csv").exists()]
    df = rows(root, have[:1])
    f = {"tr_fast_from": str(FAST_FROM), "tr_fast_from_calls": str(FAST_FROM_CALLS), "tr_fast_from_ddpm": str(fast_from(RECOMMENDED.steps)),
         "tr_default_sampler": f"`{RECOMMENDED.sampler}`", "tr_gpu": gpu_name(have[0]) if have else missing("time_to_result.csv")}

    def quote(key: str, config: str, volumes: int, cache: str) -> float | None:
        row = newest(df, config, volumes, cache)  # the newest of any sampler, named beside its time
        f[key] = f"{row['wall_s']:.1f} s (`{row['sampler']}`)" if row is not None else \
            missing(f"`sample` row of {volumes} masks ({config}, {cache})")
        return float(row["wall_s"]) if row is not None else None

    quote("tr_one_cold", "default", 1, "cold")
    quote("tr_one_warm", "default", 1, "warm")
    quote("tr_default8_cold", "default", 8, "cold")
    quote("tr_default8_warm", "default", 8, "warm")
    quote("tr_fast8_cold", "fast", 8, "cold")
    quote("tr_fast8_warm", "fast", 8, "warm")
    w100 = quote("tr_hundred_warm", "default", 100, "warm")
    # the per-volume cost between 8 and 100 masks: both rows of one sampler (the 100-mask row's)
    w8 = wall(df, "fast", 8, "warm", sampler=newest(df, "default", 100, "warm")["sampler"]) if w100 is not None else None
    ran = sorted({row["sampler"] for key in TARGETS if (row := newest(df, *key)) is not None})
    f["tr_sampler"] = ", ".join(f"`{s}`" for s in ran) if ran else missing("`sample` rows by default")
    mine = df[(df["what"] == "sample") & (df["sampler"] == RECOMMENDED.sampler) & (df["rc"] == 0)] if len(df) else df
    f["tr_default_rows"] = ("; ".join(f"{r.volumes} mask{'s' if r.volumes > 1 else ''}, "
                                      f"{'no `--config`' if r.config == 'default' else f'`--config {r.config}`'}, {r.cache}: "
                                      f"{r.wall_s:.1f} s" for r in mine.sort_values(["volumes", "config", "cache"]).itertuples())
                            if len(mine) else missing(f"`sample` rows of {RECOMMENDED.sampler}"))
    f["tr_per_volume"] = (f"{(w100 - w8) / (100 - 8):.2f} s" if w8 is not None and w100 is not None
                          else missing("fast's 8- and 100-mask warm rows"))
    chain = _chain_s(root, have[0]) if have else None
    f["tr_chain"] = number(chain, ".3f", "bench-sample row of the 12-step chain (sample_bench.csv)") + \
        (" s" if chain is not None else "")
    w8 = wall(df, "fast", 8, "warm", sampler=FEW_STEP.sampler)  # fast's 8 masks of the chain, less 8 chains
    f["tr_fast_fixed"] = (f"{w8 - 8 * chain:.1f} s" if w8 is not None and chain is not None
                          else missing("fast's 8-mask warm row and the chain's bench-sample row"))
    nproc = df[(df["what"] == "sample") & (df["nproc"] > 1) & (df["rc"] == 0)] if len(df) else df
    if len(nproc):
        last = nproc.iloc[-1]
        config, volumes, state = last["config"], int(last["volumes"]), last["cache"]
        one = wall(df, config, volumes, state)
        ranks = sorted(nproc[(nproc["config"] == config) & (nproc["volumes"] == volumes)
                             & (nproc["cache"] == state)]["nproc"].unique())
        parts = [f"one GPU {one:.1f} s ({volumes / one:.1f} volumes/s)" if one is not None else "no one-GPU row"]
        for n in ranks:
            w = wall(df, config, volumes, state, int(n))
            parts.append(f"{n} ranks {w:.1f} s ({volumes / w:.1f} volumes/s"
                         + (f", {one / w:.1f}×)" if one is not None else ")"))
        f["tr_nproc"] = f"{volumes} masks under `{config}`, {state} cache: " + "; ".join(parts)
    else:
        f["tr_nproc"] = missing("`sample --nproc` row")
    prof = Path(root) / have[0] / FOLDER / "profile-sample-1-warm.txt" if have else None
    split = profile_parts(prof) if prof is not None and prof.is_file() else {}
    f["tr_profile_total"] = (f"{split['total']:.1f} s" if "total" in split
                             else missing("cProfile of the 1-mask default (profile-sample-1-warm.txt)"))
    ops = split.get("registering custom operators calls")
    f["tr_profile_ops"] = (f"{ops:.0f}" if ops is not None
                           else missing("custom-operator registrations in the cProfile of the 1-mask default"))
    f["tr_profile_parts"] = ("; ".join(f"{part} {split[part]:.1f} s" for part in PROFILE_PARTS if part in split)
                             if split else missing("cProfile of the 1-mask default (profile-sample-1-warm.txt)"))
    met = []
    for (config, volumes, cache), limit in TARGETS.items():
        row = newest(df, config, volumes, cache)
        if row is not None:
            met.append(f"{volumes} mask{'s' if volumes > 1 else ''} {cache}, ≤ {limit:g} s: "
                       f"{'met' if row['wall_s'] <= limit else 'missed'} ({row['wall_s']:.1f} s, {row['sampler']})")
    f["tr_targets"] = "; ".join(met) if met else missing("rows of the targets")
    same = same_files(root, have[:1])
    f["tr_same"] = ("; ".join(f"{r['what']} (`{r['sampler']}`): {r['identical']} of {r['files']} files identical" for _, r in same.iterrows())
                    if len(same) else missing("same_files.csv"))
    return f

