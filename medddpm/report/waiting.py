"""Chapter 15, time to result (issue 48): what a user waits for, from ``scripts/time_to_result.sh``
(``<gpu>/time_to_result/time_to_result.csv`` and ``same_files.csv``, ``medddpm.profiling.waiting``): where it stands
per GPU against the targets (``state``, from the newest run of current rows), every row measured (``table``), and the
chapter's history (``history``: one ``history.json`` per GPU, ``report.history``).

A store may hold these results on any GPU, or on none: every function returns its full shape then,
and every fact reads "—" with what is missing.
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from ..core.config import FAST_FROM_CALLS, SMALL_JOB, DiffusionConfig, fast_from
from ..diffusion.solvers import CANDIDATE, FEW_STEP, REFERENCE, denoiser_calls
from ..profiling.waiting import COLUMNS, SAME_COLUMNS
from .anatomy import train_folder
from .present import gpu_name
from .recipe import by_default, first_step_s
from . import history as chapter_history, manifests
from .tables import results_csv
from .wording import missing

FOLDER = "time_to_result"
STORE_FREE = ("tr_fast_from_calls", "tr_fast_from_ddpm", "tr_fast_from_chain", "tr_small", "tr_default_sampler")  # the package's rules, whatever the store holds
CHAIN_TARGETS = {(1, "warm"): 5.0, (1, "cold"): 15.0, (100, "warm"): 30.0}  # issue 64: seconds, process start to file
# `sample`'s default sampler before issue 47 made DDPM 250 the default: what a row without the
# ``sampler`` column (written before it) ran unless its command names --sampler
EARLIER_DEFAULT = FEW_STEP.sampler
# `sample`'s rule without --config before issue 47 (rows written before the ``ran`` column): fast from 35 masks or
# 750 denoiser calls, else eager bf16
EARLIER_RULE = (35, 750, "bf16")
# issue 48's targets (s, process start to files written): 1 mask by default, warm and cold; 100 masks, warm
TARGETS = {("default", 1, "warm"): 5.0, ("default", 1, "cold"): 15.0, ("default", 100, "warm"): 25.0}


def rows(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Every timed command of the store's GPUs, with ``what`` (sample or train), ``nproc`` (ranks) and
    the newest row of duplicates."""
    return tidy(results_csv(Path(root), gpus, f"{FOLDER}/time_to_result"))


def _nproc(commands: pd.Series) -> pd.Series:
    """Each command's ranks: its ``--nproc``, else 1."""
    return pd.to_numeric(commands.str.extract(r"--nproc (\d+)")[0]).fillna(1).astype(int)


def tidy(df: pd.DataFrame) -> pd.DataFrame:
    """``rows``' table of raw ``time_to_result.csv`` rows."""
    if df.empty:
        df = pd.DataFrame(columns=[*COLUMNS, "gpu_slug"])
        return df.assign(what=pd.Series(dtype=str), nproc=pd.Series(dtype=int), sampler=pd.Series(dtype=str))
    df = _parsed(df)
    named = df["command"].str.extract(r"--sampler (\S+)")[0]
    stored = df["sampler"].astype(object) if "sampler" in df else pd.Series(None, index=df.index, dtype=object)
    df["sampler"] = stored.fillna(named.astype(object)).fillna(EARLIER_DEFAULT).where(df["what"] == "sample", "")
    told = df["ran"].astype(object) if "ran" in df else pd.Series(None, index=df.index, dtype=object)
    df["ran"] = told.where(told.notna() & (told != ""), [_earlier(r) for r in df.itertuples()])
    keys = ["gpu_slug", "what", "config", "sampler", "volumes", "cache", "nproc", *(["host"] if "host" in df else [])]
    return df.drop_duplicates(keys, keep="last").reset_index(drop=True)


def _parsed(df: pd.DataFrame) -> pd.DataFrame:
    """Rows with what their command says: ``what`` (sample, train, …), ``nproc`` (its ranks) and ``batch``
    (its ``--batch``, else 1)."""
    return df.assign(what=df["command"].str.split().str[0], nproc=_nproc(df["command"]),
                     batch=pd.to_numeric(df["command"].str.extract(r"--batch (\d+)")[0]).fillna(1).astype(int))


def _earlier(row) -> str:
    """What a row without ``ran`` ran: its --config, else ``EARLIER_RULE``'s pick; "" for train."""
    if row.what != "sample":
        return ""
    if row.config != "default":
        return row.config
    first, calls, small = EARLIER_RULE
    steps = re.search(r"--steps (\d+)", row.command)
    each = denoiser_calls(row.sampler, int(steps[1]) if steps else None, DiffusionConfig().timesteps)
    return "fast" if row.volumes >= min(first, -(-calls // each)) else small


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
                        "ran": df["ran"], "sampler": df["sampler"], "volumes": df["volumes"], "ranks": df["nproc"], "compile cache": df["cache"],
                        "wall s": df["wall_s"]})
    return out.sort_values(["GPU", "command", "--config", "volumes", "ranks", "compile cache"]).reset_index(drop=True)


def newest(df: pd.DataFrame, config: str, volumes: int, cache: str, nproc: int = 1,
           sampler: str | None = None) -> pd.Series | None:
    """The newest successful `sample` row of ``rows``' table for that configuration, number of masks,
    cache state and ranks (of ``sampler``, or any), or None."""
    hit = df[(df["what"] == "sample") & (df["config"] == config) & (df["volumes"] == volumes) & (df["cache"] == cache)
             & (df["nproc"] == nproc) & (df["rc"] == 0) & ((df["sampler"] == sampler) if sampler else True)] if len(df) else df
    return hit.iloc[-1] if len(hit) else None


# train's last line (its share printed whole at first, with one decimal since)
TIMING_LINE = re.compile(r"^timing: (.*?(\d+(?:\.\d+)?) % of --time-limit in steady steps)\s*$", re.MULTILINE)


def _content(folder: str) -> str:
    """A run folder's content name, its date left out."""
    m = manifests.DATED.match(folder)
    return m["name"] if m else folder


def limit_runs(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Every training run whose own output (``<gpu>/anatomy/train/NAME/train-stdout.txt``, a ``recipe-plateau`` arm's
    ``stdout.txt`` on its GPU, or a timed command's ``<gpu>/time_to_result/FOLDER/train*-stdout-*.txt``) ends with
    `train`'s timing line under ``--time-limit``: run, GPU folder, the line and its share of the limit in steady steps."""
    rows = []
    for g in gpus:
        runs = [(f.parent.name, f) for f in sorted(train_folder(root, g).glob("*/train-stdout.txt"))]
        runs += [(arm, run / arm / "stdout.txt") for _, run, m in manifests.runs(root, manifests.PLATEAU, [g])
                 for arm in m["arms"]]
        runs += [(f"{_content(f.parent.name)}/{f.stem}", f)
                 for f in sorted((Path(root) / g / FOLDER).glob("*/train*-stdout-*.txt"))]
        for run, f in runs:
            m = TIMING_LINE.search(f.read_text())
            if m:
                rows.append({"run": run, "gpu": g, "line": m[1], "share": float(m[2]) / 100})
    return pd.DataFrame(rows, columns=["run", "gpu", "line", "share"])


EVAL_CUT = "train-eval-cut"  # a warm 64³ `train --time-limit` with its held-out evaluations and checkpoints cut


def facts(root: Path, gpus: list[str]) -> dict[str, str]:
    """Chapter 15's facts (``tr_``): the package's rule for picking a configuration, the samplers the first rows ran,
    and the same-files check, from the first GPU of the store that holds the measurement."""
    have = [g for g in gpus if (Path(root) / g / FOLDER / "time_to_result.csv").exists()]
    df = rows(root, have[:1])
    f = {"tr_fast_from_calls": f"{FAST_FROM_CALLS:,}", "tr_fast_from_ddpm": str(fast_from(REFERENCE.steps)),
         "tr_fast_from_chain": str(fast_from(FEW_STEP.steps)), "tr_small": f"`{SMALL_JOB}`",
         "tr_default_sampler": f"`{REFERENCE.describe()}` on every checkpoint since the gate's 12-call chain, "
                               f"`{CANDIDATE.describe()}`, the v-prediction default these rows measured, was not "
                               "confirmed on checkpoints that took no part in choosing it",
         "tr_gpu": gpu_name(have[0]) if have else missing("time_to_result.csv")}
    ran = sorted({row["sampler"] for key in TARGETS if (row := newest(df, *key)) is not None})
    f["tr_sampler"] = ", ".join(f"`{s}`" for s in ran) if ran else missing("`sample` rows by default")
    same = same_files(root, have[:1])
    f["tr_same"] = ("; ".join(f"{r['what']} (`{r['sampler']}`): {r['identical']} of {r['files']} files identical"
                              for _, r in same.iterrows()) if len(same) else missing("same_files.csv"))
    return f


CHAIN_WHEN = f"the {CANDIDATE.steps}-call chain (`--sampler {CANDIDATE.sampler} …`)"  # a v checkpoint's default until
# issue 75, since then by its flags
STATE_ROWS = (  # chapter 15's first table: (what, volumes, cache, target in s or None, the sampler that ran)
    (f"`sample`, 1 mask, {REFERENCE.sampler.upper()} {REFERENCE.steps} (today's default), warm cache", 1, "warm", TARGETS[("default", 1, "warm")],
     REFERENCE.sampler),
    (f"`sample`, 1 mask, {REFERENCE.sampler.upper()} {REFERENCE.steps} (today's default), empty cache", 1, "cold",
     TARGETS[("default", 1, "cold")], REFERENCE.sampler),
    (f"`sample`, 1 mask, {CHAIN_WHEN}, warm cache (median)", 1, "warm", CHAIN_TARGETS[(1, "warm")], CANDIDATE.sampler),
    (f"`sample`, 1 mask, {CHAIN_WHEN}, empty cache", 1, "cold", CHAIN_TARGETS[(1, "cold")], CANDIDATE.sampler),
    (f"`sample`, 100 masks, {CHAIN_WHEN}, warm cache", 100, "warm", CHAIN_TARGETS[(100, "warm")], CANDIDATE.sampler),
)


def where(row: pd.Series) -> str:
    """Where a timed row's seconds went, as its command's timing line said (``profiling.waiting.phases``): a
    `sample`'s ready and first volume (seconds since the process started), a `train`'s ready and how long its first
    step took; "" for a row written before its command's line was kept."""
    train = row["command"].startswith("train ")
    ready, first = (row.get(c) for c in ("ready_s", "first_step_s" if train else "first_volume_s"))
    if pd.isna(ready) or pd.isna(first):
        return ""
    return f"ready at {ready:.1f} s, " + (f"its first step {first:.1f} s" if train else f"its first volume at {first:.1f} s")


def _first_step(timing: Path) -> str:
    """How long a `train` row's first step took, from the ``timing.csv`` its run kept beside its rows
    (``recipe.first_step_s``), for a row written before its timing line was; "" without one."""
    first = first_step_s(pd.read_csv(timing)) if timing.exists() else float("nan")
    return "" if pd.isna(first) else f"its first step {first:.1f} s ({timing.name})"


def state(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Where time to result stands: per GPU and row of ``STATE_ROWS``, the newest run of current rows (manifest kind
    ``sample-rows``, none superseding it, of the GPU's newest date) that has it, against its target; and `train`'s first 100 steps at 128³,
    process start to checkpoint, warm and cold, from the newest run that has them; with where each row's seconds went
    (``where``) and its run folder."""
    rows = []
    for g in gpus:
        found, newest = [], None
        for _, folder, m in manifests.runs(root, "sample-rows", [g]):  # newest first; the rows of its date alone
            newest = newest or m["date"]
            if m["date"] != newest:
                break
            raw = pd.read_csv(folder / "time_to_result.csv") if (folder / "time_to_result.csv").exists() else pd.DataFrame()
            if len(raw):
                found.append((str(folder.relative_to(Path(root) / g)), raw[raw["rc"] == 0]))
        for what, n, cache, target, sampler in STATE_ROWS:
            for run, raw in found:
                s = raw[raw["command"].str.startswith("sample ") & (raw["sampler"] == sampler) & (raw["volumes"] == n)
                        & (raw["cache"] == cache)]
                if len(s):
                    now = s["wall_s"].median()
                    typical = s.loc[(s["wall_s"] - now).abs().idxmin()]  # the row nearest the median: its phases
                    rows.append({"GPU": gpu_name(g), "what": what, "today (s)": now, "target (s)": target,
                                 "met": "yes" if now <= target else "no", "where": where(typical), "run": run})
                    break
        for cache in ("warm", "cold"):
            for run, raw in found:
                t = raw[raw["command"].str.startswith("train ") & raw["command"].map(by_default) & (raw["cache"] == cache)]
                if len(t):
                    rows.append({"GPU": gpu_name(g), "what": f"`train --config fast`, first 100 steps at 128³ (`train`'s defaults of the run's date), {cache} cache",
                                 "today (s)": t["wall_s"].iloc[-1], "target (s)": None, "met": "",
                                 "where": where(t.iloc[-1]) or _first_step(Path(root) / g / run / f"timing128-{cache}.csv"),
                                 "run": run})
                    break
    return pd.DataFrame(rows, columns=["GPU", "what", "today (s)", "target (s)", "met", "where", "run"])


def history(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Chapter 15's history table: every change it measured on ``gpus``, oldest first (``report.history``)."""
    return chapter_history.table(root, gpus, FOLDER)
