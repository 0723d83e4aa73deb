"""Chapter 15, time to result (issue 48): what a user waits for, from ``scripts/time_to_result.sh``
(``<gpu>/time_to_result/time_to_result.csv`` and ``same_files.csv``, ``medddpm.profiling.waiting``),
as a table and facts against the issue's targets.

A store may hold these results on any GPU, or on none: every function returns its full shape then,
and every fact reads "—" with what is missing.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Callable

import pandas as pd

from ..core.config import FAST_FROM_CALLS, SAMPLING_ALIASES, SMALL_JOB, DiffusionConfig, fast_from
from ..diffusion.solvers import CANDIDATE, FEW_STEP, REFERENCE, denoiser_calls
from ..profiling.waiting import COLUMNS, PHASES, SAME_COLUMNS
from .anatomy import run_device, train_folder
from .present import gpu_name
from . import manifests
from .tables import results_csv
from .wording import missing, number

FOLDER = "time_to_result"


def run_path(root: Path, gpu: str | None, run: str) -> str:
    """``time_to_result/<run>-<date>[/rest]`` of the newest run of ``run``'s content name (its first part) on ``gpu``
    (``manifests.newest_named``): code names runs by what they hold, the store by what and when."""
    name, _, rest = run.partition("/")
    return manifests.newest_named(root, gpu or "", FOLDER, name) + (f"/{rest}" if rest else "")


def run_csv(root: Path, gpus: list[str], run: str, table: str) -> pd.DataFrame:
    """``table`` of each GPU's newest ``run`` (``run_path``), with a ``gpu_slug`` column."""
    frames = [results_csv(Path(root), [g], f"{run_path(root, g, run)}/{table}") for g in gpus]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
STORE_FREE = ("tr_fast_from_calls", "tr_fast_from_ddpm", "tr_fast_from_chain", "tr_small", "tr_default_sampler")  # the package's rules, whatever the store holds
# sharded `sample` runs whose ranks still saw every GPU (before distributed.own_gpu_only): ranks 1-3 compiled again
BEFORE_OWN_GPU = "own-gpu-ranks/before-own-gpu"
SMALL_RUNS = "small-job"  # the small-job configuration before kernels.precompile, and without its Triton kernels
# start-up changes measured against main (``code`` "main …") on one machine, alternated, and not kept: a ``call`` and
# ``code`` column beside time_to_result.csv's
TRIED = "start-up-tried"
WARMUP_ALL = "warmup-every-config"  # `warmup` without --config (fast-eager and fast), then 1 mask by default
V_DEFAULT = "v-default-chain"  # a v-prediction checkpoint's default (the 12-call chain): 1 and 100 masks, warmup
TRITON_KEY = "triton-key-h200-host"  # the same, with Triton's installation key kept in MEDDDPM_CACHE (run.cache)
CHAIN_TARGETS = {(1, "warm"): 5.0, (1, "cold"): 15.0, (100, "warm"): 30.0}  # issue 64: seconds, process start to file
# start-up cut against main on one machine per call (``call``, ``code`` columns): the code kept is the one named KEPT
CUT = "start-up-cut"
KEPT = "C (this commit)"
TRAIN_AFTER = f"{TRIED}/call-d"  # a warm `train --config fast` under cProfile after AOT autograd's cache took fast's graph
# `sample`'s default sampler before issue 47 made DDPM 250 the default: what a row without the
# ``sampler`` column (written before it) ran unless its command names --sampler
EARLIER_DEFAULT = FEW_STEP.sampler
# `sample`'s rule without --config before issue 47 (rows written before the ``ran`` column): fast from 35 masks or
# 750 denoiser calls, else eager bf16
EARLIER_RULE = (35, 750, "bf16")
# issue 48's targets (s, process start to files written): 1 mask by default, warm and cold; 100 masks, warm
TARGETS = {("default", 1, "warm"): 5.0, ("default", 1, "cold"): 15.0, ("default", 100, "warm"): 25.0}
NPROC_TARGET = (256, 4, 3.0)  # and 256 masks by default, warm, on 4 ranks: ≥ 3× faster than one GPU


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
    "sampling": (r"gaussian\.py:\d+\(sample\)", "cumtime"),
    "Triton's assembler": (r"compiler\.py:\d+\(make_cubin\)", "cumtime"),
}


# what cProfile's lines of a warm `train --config fast` name (profile-train-warm.txt): part → (pattern, column)
TRAIN_PARTS = {
    "replaying the step's CUDA graph (the GPU's time)": (r"cuda/graphs\.py:\d+\(replay\)", "tottime"),
    "loading Inductor's compiled graphs": (r"_inductor/codecache\.py:\d+\(result\)", "cumtime"),
    "AOT autograd's forward/backward partitioner": (r"partitioners\.py:\d+\(min_cut_rematerialization_partition\)",
                                                    "cumtime"),
}


def profile_parts(path: Path, parts: dict[str, tuple[str, str]] = PROFILE_PARTS) -> dict[str, float]:
    """Seconds of ``parts`` (and ``total``), and each part's calls ("<part> calls"), in a
    ``pstats`` print of a `sample` (or `train`) run; a part the print does not list is left out."""
    text = Path(path).read_text()
    out: dict[str, float] = {}
    total = re.search(r"function calls .* in ([0-9.]+) seconds", text)
    if total:
        out["total"] = float(total[1])
    for part, (pattern, column) in parts.items():
        for line in text.splitlines():
            cells = line.split()
            if re.search(pattern, line) and len(cells) >= 5:  # a recursive call prints no cumulative per-call column
                out[part] = float(cells[1] if column == "tottime" else cells[3])
                out[f"{part} calls"] = float(cells[0].split("/")[0])
                break
    return out


def _how(config: str) -> str:
    """How a `sample` row chose its configuration, as a reader says it."""
    return "by default" if config == "default" else f"under `--config {config}`"


def _label(row) -> str:
    """A `sample` row as a reader names it: masks, configuration, ranks, cache and sampler."""
    how = _how(row["config"])
    ranks = f" on {row['nproc']} ranks" if row["nproc"] > 1 else ""
    return f"{row['volumes']} mask{'s' if row['volumes'] > 1 else ''} {how}{ranks}, {row['cache']} (`{row['sampler']}`)"


# What ends at each mark of `sample`'s timing line (``sample.sampler.TIMING``), in a reader's words
SPAN_ENDING = {"imports": "Python's start and the imports", "ready": "checkpoint and masks read, denoiser built",
               "kernels": "Triton kernels compiled or loaded", "captured": "warm-up and the first CUDA graph's capture",
               "first volume": "the first volume's denoiser calls", "last volume": "the other volumes",
               "written": "the last files written"}


def spans(row: pd.Series) -> list[tuple[str, float]]:
    """(what, seconds) from a `sample` row's timing columns, in the order its marks fell: on the
    process's clock where the row has ``imports_s`` (the exit last), else on the command's clock,
    which starts once the imports are done (what lies outside it first)."""
    marks = sorted(((float(row[c]), name) for name, c in PHASES.items() if c in row and pd.notna(row[c])))
    if not marks:
        return []
    wall, process = float(row["wall_s"]), any(name == "imports" for _, name in marks)
    out = [] if process else [("outside the command's clock", wall - marks[-1][0])]
    before = 0.0
    for t, name in marks:
        out.append((SPAN_ENDING[name], t - before))
        before = t
    return out + ([("the exit", wall - before)] if process else [])


def phases(df: pd.DataFrame) -> str:
    """Where the seconds of each newest `sample` row with a timing line went (``spans``, rank 0's)."""
    timed = df[(df["what"] == "sample") & (df["rc"] == 0) & df["written_s"].notna()] if "written_s" in df else df.iloc[:0]
    if not len(timed):
        return missing("`sample` row with its timing line (ready_s … written_s)")
    parts = []
    for _, r in timed.sort_values(["nproc", "volumes", "cache"]).iterrows():
        parts.append(f"{_label(r)}, ran `{r['ran']}`, {r['wall_s']:.1f} s: "
                     + ", ".join(f"{name} {sec:.1f} s" for name, sec in spans(r)))
    return "; ".join(parts)


def tried(root: Path, gpu: str | None) -> str:
    """``TRIED``'s rows: per call (one machine), each command's mean wall time under the changed code
    against main's, both alternated on that machine."""
    df = run_csv(Path(root), [gpu] if gpu else [], TRIED, "time_to_result")
    if df.empty:
        return missing(f"{FOLDER}/{TRIED}/time_to_result.csv")
    df = df.assign(nproc=_nproc(df["command"]), main=df["code"].str.startswith("main "))
    parts = []
    for call, group in df.groupby("call"):
        said = []
        for _, runs in group.groupby(["config", "sampler", "volumes", "cache", "nproc"], sort=False):
            mine, base = runs[~runs["main"]]["wall_s"], runs[runs["main"]]["wall_s"]
            if len(mine) and len(base):
                said.append(f"{_label(runs.iloc[0])} {mine.mean():.1f} s against {base.mean():.1f} s "
                            f"({len(mine)} and {len(base)} run{'s' if len(base) > 1 else ''})")
        if said:
            changed = group[~group["main"]]["code"].iloc[0]
            parts.append(f"call {call} ({changed}; against {group[group['main']]['code'].iloc[0]}): " + "; ".join(said))
    return "; ".join(parts) if parts else missing(f"changed and main rows of one command in {TRIED}")


def cut_rows(root: Path, gpu: str | None) -> pd.DataFrame:
    """``CUT``'s rows with ``what``, ``nproc`` and ``batch`` (its ``--batch``, else 1), and each code's short name
    (``short``: what its description says before the first colon)."""
    df = run_csv(Path(root), [gpu] if gpu else [], CUT, "time_to_result")
    if df.empty:
        return df
    df = _parsed(df).assign(short=df["code"].str.split(":").str[0])
    df["sampler"] = df["sampler"].fillna("")
    return df


def kept_rows(df: pd.DataFrame, volumes: int | None = None) -> pd.DataFrame:
    """``cut_rows``' successful `sample` runs of the kept code (``KEPT``) at batch 1 (of ``volumes`` masks)."""
    if df.empty:
        return df
    mine = df[(df["short"] == KEPT) & (df["rc"] == 0) & (df["what"] == "sample") & (df["batch"] == 1)]
    return mine if volumes is None else mine[mine["volumes"] == volumes]


def cut_codes(df: pd.DataFrame) -> str:
    """What each code of ``CUT`` changed, as its rows say."""
    return "; ".join(f"{short}: {code.split(':', 1)[1].strip()}" if ":" in code else short
                     for short, code in df.drop_duplicates("short")[["short", "code"]].itertuples(index=False))


def cut(df: pd.DataFrame) -> str:
    """Per call (one machine), each command's mean wall time under each code (successful runs), codes in the
    order the call ran them."""
    if df.empty:
        return missing(f"{FOLDER}/{CUT}/time_to_result.csv")
    ok = df[(df["rc"] == 0) & (df["what"] == "sample")]
    parts = []
    for call, group in ok.groupby("call"):
        said = []
        for _, runs in group.groupby(["volumes", "cache", "sampler", "batch"], sort=False):
            if runs["short"].nunique() > 1:
                said.append(f"{_label(runs.iloc[0])}" + (f", --batch {runs['batch'].iloc[0]}" if runs["batch"].iloc[0] > 1 else "")
                            + ": " + ", ".join(
                    f"{code} {g['wall_s'].mean():.1f} s ({len(g)})" for code, g in runs.groupby("short", sort=False)))
        if said:
            parts.append(f"call {call}: " + "; ".join(said))
    return "; ".join(parts) if parts else missing(f"rows of two codes of one command in {CUT}")


def cut_targets(df: pd.DataFrame) -> str:
    """The kept code's rows (``KEPT``) against issue 64's targets: 1 mask warm (median of its runs),
    each cold run, 100 masks warm at batch 1, and where one warm and one cold run's seconds went
    (``spans``)."""
    if df.empty:
        return missing(f"{FOLDER}/{CUT}/time_to_result.csv")
    one = lambda n, cache: kept_rows(df, n)[lambda k: k["cache"] == cache]  # noqa: E731
    warm, cold, hundred = one(1, "warm"), one(1, "cold"), one(100, "warm")
    if warm.empty or cold.empty or hundred.empty:
        return missing(f"{KEPT}'s 1-mask warm and cold and 100-mask warm rows in {CUT}")

    def verdict(seconds: float, n: int, cache: str) -> str:
        return "met" if seconds <= CHAIN_TARGETS[(n, cache)] else "missed"

    med = warm["wall_s"].median()
    said = [f"1 mask warm {med:.1f} s, the median of {len(warm)} runs on {warm['call'].nunique()} machines "
            f"({verdict(med, 1, 'warm')}: {CHAIN_TARGETS[(1, 'warm')]:g} s)",
            "cold " + ", ".join(f"{t:.1f} s" for t in cold["wall_s"]) + f" on {cold['call'].nunique()} machines "
            f"({sum(t <= CHAIN_TARGETS[(1, 'cold')] for t in cold['wall_s'])} of {len(cold)} within "
            f"{CHAIN_TARGETS[(1, 'cold')]:g} s)",
            "100 masks warm " + ", ".join(f"{t:.1f} s" for t in hundred["wall_s"])
            + f" ({verdict(hundred['wall_s'].median(), 100, 'warm')}: {CHAIN_TARGETS[(100, 'warm')]:g} s)"]
    for name, row in (("a warm run", warm.iloc[-1]), ("a cold one", cold.iloc[-1])):
        said.append(f"{name} ({row['wall_s']:.1f} s): " + ", ".join(f"{what} {sec:.1f} s" for what, sec in spans(row)))
    return "; ".join(said)


def _rate(per_s: float) -> str:
    """Volumes a second, to two significant digits below one."""
    return f"{per_s:.2f}" if per_s < 1 else f"{per_s:.1f}"


def sharded(df: pd.DataFrame) -> str:
    """Every sharded `sample` measurement of ``rows``' table (the newest of each), one part per
    configuration, sampler, number of masks and cache state, newest first: each rank count's wall
    time, volumes a second and speed-up over the one-process row of the same command."""
    runs = df[(df["what"] == "sample") & (df["nproc"] > 1) & (df["rc"] == 0)] if len(df) else df
    if not len(runs):
        return missing("`sample --nproc` row")
    parts = []
    for (config, sampler, volumes, state), group in reversed(list(runs.groupby(["config", "sampler", "volumes", "cache"],
                                                                                sort=False))):
        one = wall(df, config, int(volumes), state, sampler=sampler)
        said = [f"one GPU {one:.1f} s ({_rate(volumes / one)} volumes/s)" if one is not None else "no one-GPU row"]
        for n in sorted(group["nproc"].unique()):
            w = wall(df, config, int(volumes), state, int(n), sampler)
            said.append(f"{n} ranks {w:.1f} s ({_rate(volumes / w)} volumes/s"
                        + (f", {one / w:.1f}×)" if one is not None else ")"))
        parts.append(f"{volumes} masks {_how(config)} (`{sampler}`, ran `{group['ran'].iloc[-1]}`), {state} cache: "
                     + "; ".join(said))
    return "; ".join(parts)


def _chain_s(root: Path, gpu: str) -> float | None:
    """The default 12-step chain's seconds a volume (batch 1, 128³) in the GPU's ``sample_bench.csv``."""
    df = results_csv(Path(root), [gpu], "sample_bench")
    if df.empty:
        return None
    hit = df[(df["config"] == SAMPLING_ALIASES["fast"]) & (df["sampler"] == FEW_STEP.sampler)
             & (df["steps"] == FEW_STEP.steps) & (df["spacing"] == FEW_STEP.spacing) & (df["batch"] == 1)
             & (df["size"] == "128x128x128")]
    return float(hit["s_per_volume_median"].iloc[-1]) if len(hit) else None


AFTER_WARMUP_TARGET = 0.10  # issue 64: after `warmup`, the first `sample` of 1 mask within 10 % of a warm run
LIMIT_TARGET = 0.80  # issue 64: `train --time-limit T` spends at least this share of T in steady steps
# train's last line (its share printed whole at first, with one decimal since)
TIMING_LINE = re.compile(r"^timing: (.*?(\d+(?:\.\d+)?) % of --time-limit in steady steps)\s*$", re.MULTILINE)


def _content(folder: str) -> str:
    """A run folder's content name, its date left out."""
    m = manifests.DATED.match(folder)
    return m["name"] if m else folder


def limit_runs(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Every training run whose own output (``<gpu>/anatomy/train/NAME/train-stdout.txt``, or a timed
    command's ``<gpu>/time_to_result/FOLDER/train*-stdout-*.txt``) ends with `train`'s timing line under
    ``--time-limit``: run, GPU folder, the line and its share of the limit in steady steps."""
    rows = []
    for g in gpus:
        runs = [(f.parent.name, f) for f in sorted(train_folder(root, g).glob("*/train-stdout.txt"))]
        runs += [(f"{_content(f.parent.name)}/{f.stem}", f)
                 for f in sorted((Path(root) / g / FOLDER).glob("*/train*-stdout-*.txt"))]
        for run, f in runs:
            m = TIMING_LINE.search(f.read_text())
            if m:
                rows.append({"run": run, "gpu": g, "line": m[1], "share": float(m[2]) / 100})
    return pd.DataFrame(rows, columns=["run", "gpu", "line", "share"])


TRAIN_CLOCK = "train-clock"  # train --time-limit 300 at 64³ and train's first 100 steps at 128³, cold and warm
FIRST_STEPS_OVER = 10.0  # issue 64: s; warm, train's first 100 steps at 128³ within the steady state's 100 steps plus this


def first_steps(root: Path, gpu: str | None, run: str = TRAIN_CLOCK) -> str:
    """``run``'s `train --config fast --steps 100` at 128³, cold and warm: wall time, its first step
    (the step's compile and capture) and the steady state's 100 steps from its own timing.csv, against
    ``FIRST_STEPS_OVER``."""
    folder = Path(root) / (gpu or "") / run_path(root, gpu, run)
    df = run_csv(Path(root), [gpu] if gpu else [], run, "time_to_result")
    df = df[df["command"].str.startswith("train ")] if len(df) else df
    said = []
    for state in ("cold", "warm"):
        row, timing = df[df["cache"] == state] if len(df) else df, folder / f"timing128-{state}.csv"
        if row.empty or not timing.is_file():
            continue
        t = pd.read_csv(timing)
        first = t[t["step_from"] == 0]["ms_per_step"].iloc[0] / 1e3
        steady = t[t["step_from"] > 0].iloc[-1]["ms_per_step"] * 100 / 1e3
        wall_s = float(row["wall_s"].iloc[-1])
        said.append(f"{state} {wall_s:.1f} s (its first step {first:.1f} s; 100 steady steps {steady:.1f} s)"
                    + (f", {'within' if wall_s <= steady + FIRST_STEPS_OVER else 'beyond'} the target of steady + "
                       f"{FIRST_STEPS_OVER:g} s" if state == "warm" else ""))
    return "; ".join(said) or missing(f"train's first 100 steps at 128³ ({run})")


EVAL_CUT = "train-eval-cut"  # TRAIN_CLOCK's warm 64³ run again, its held-out evaluations and checkpoints cut
AFTER_CUT = "after-cut"  # V_DEFAULT's rows and TRAIN_CLOCK's 128³ steps again, on a fresh machine after the cut
DEFAULT_ROWS = "default-rows"  # the same rows again with the fused residual, on a fresh machine of each GPU
PHASE = re.compile(r"(held-out|checkpoints) ([0-9.]+) s \((\d+)\)")  # a phase of train's timing line: seconds (count)


def eval_cut(root: Path, gpu: str | None) -> str:
    """The warm 64³ `train --time-limit` run before (``TRAIN_CLOCK``) and after (``EVAL_CUT``) the
    held-out and checkpoint changes: each phase's seconds a time, and the share in steady steps."""
    said = []
    for run in (TRAIN_CLOCK, EVAL_CUT):
        f = Path(root) / (gpu or "") / run_path(root, gpu, run) / "train64-stdout-warm.txt"
        m = TIMING_LINE.search(f.read_text()) if gpu and f.is_file() else None
        if m is None:
            return missing(f"the warm 64³ runs' output ({TRAIN_CLOCK}, {EVAL_CUT}: train64-stdout-warm.txt)")
        each = {p: float(sec) / int(n) for p, sec, n in PHASE.findall(m[1]) if int(n)}
        said.append(f"{each['held-out']:.1f} s an evaluation, {each['checkpoints']:.2f} s a checkpoint, "
                    f"{float(m[2]):g} % of the limit in steady steps (`{run}`)")
    return "; ".join(said)


EAGER_KERNELS = "eager-kernels"  # every kernel of 10 warm DDPM steps at 128³, fast-eager and fast (denoise_kernels)


def eager_kernels(root: Path, gpu: str | None) -> str:
    """Where a denoiser call's GPU time goes under ``SMALL_JOB`` and under ``fast`` (``EAGER_KERNELS``'s
    tables): milliseconds of kernels a call, the categories that differ most, and the GPU idle."""
    folder = Path(root) / (gpu or "") / run_path(root, gpu, EAGER_KERNELS)
    files = {c: folder / f"denoise_kernels_{c}.csv" for c in (SMALL_JOB, "fast")}
    if not gpu or not all(f.is_file() for f in files.values()):
        return missing(f"kernel tables of {SMALL_JOB} and fast ({EAGER_KERNELS})")
    k = {c: pd.read_csv(f) for c, f in files.items()}
    by = pd.DataFrame({c: t.groupby("category")["ms_per_step"].sum() for c, t in k.items()}).fillna(0.0)
    by = by.assign(diff=by[SMALL_JOB] - by["fast"]).sort_values("diff", key=abs, ascending=False, kind="stable")
    parts = ", ".join(f"{cat} {r[SMALL_JOB]:.2f} against {r['fast']:.2f} ms" for cat, r in by.head(4).iterrows())
    return (f"{k[SMALL_JOB]['ms_per_step'].sum():.2f} ms of kernels a call under `{SMALL_JOB}` without its fused "
            f"residual (`{UNFUSED}`) against "
            f"{k['fast']['ms_per_step'].sum():.2f} ms under `fast` (GPU idle {k[SMALL_JOB]['idle_ms_before'].sum():.2f} "
            f"and {k['fast']['idle_ms_before'].sum():.2f} ms); by category: {parts}")


FUSED_RESIDUAL = "fused-residual"  # fast-eager with fused_residual against fast-eager-unfused, one machine
POOL_TRIED = "process-pool-tried"  # cold 1-mask runs: Triton's kernels compiled by worker processes or threads
TRITON_KEYS = "triton-keys"  # cold 1-mask runs: precompile's launches by exact integers or Triton's integer keys
OVERLAP = "sample-overlap"  # 100 masks warm: int8 masks and read-backs beside the sampling (new) against before
UNFUSED = "fast-eager-unfused"  # SMALL_JOB before fused_residual
BIAS_ADD, RESIDUAL_ADD = "aten::add_", "aten::add"  # PyTorch's bias add after cuDNN's convolution; the residual add


def per_machine(root: Path, gpu: str | None, run: str, quote: Callable[[Path], str | None], what: str) -> str:
    """``quote(folder)`` for the run folder ``run`` on ``gpu`` and each ``machine-*`` in it (the same
    script on another machine of that kind); where one returns None (a file missing), ``what`` is
    named as missing."""
    folder = Path(root) / (gpu or "") / run_path(root, gpu, run)
    said = [quote(f) for f in [folder, *sorted(folder.glob("machine-*"))]] if gpu else [None]
    if None in said:
        return missing(f"{what} in {run}/")
    return said[0] + "".join(f"; again on another machine of the same kind: {s}" for s in said[1:])


def with_arms(raw: pd.DataFrame, arms: Path) -> pd.DataFrame:
    """A run folder's rows with the ``arm`` its ``arms.csv`` gives each (row, arm, in the rows' order)."""
    return raw.assign(arm=pd.read_csv(arms)["arm"].to_numpy()[:len(raw)])


def fused_residual(root: Path, gpu: str | None) -> str:
    """``FUSED_RESIDUAL``'s rows on ``gpu``, per machine (``per_machine``, ``fused_machine``)."""
    return per_machine(root, gpu, FUSED_RESIDUAL, fused_machine,
                       f"rows and op tables of {SMALL_JOB} with and without its fused residual")


def fused_machine(folder: Path) -> str | None:
    """One machine's rows: 100 masks by default (``SMALL_JOB``, fused) against ``UNFUSED``, wall and
    first-to-last-volume span; a denoiser call's kernels under each (``scripts/probes/eager_ops.py``'s
    tables: kernel rows only, an aten op's row repeats its kernels' time). Not its 1-mask rows: the probe
    that timed them kept no bytecode, so every process compiled torch's sources (3–4 s more a process)."""
    ops = {c: folder / f"ops_{c}.csv" for c in (SMALL_JOB, UNFUSED)}
    if not (folder / "time_to_result.csv").is_file() or not all(f.is_file() for f in ops.values()):
        return None
    raw = pd.read_csv(folder / "time_to_result.csv")
    hundred = raw[(raw["volumes"] == 100) & (raw["cache"] == "warm")]
    arm = {c: hundred[hundred["config"] == ("default" if c == SMALL_JOB else c)] for c in (SMALL_JOB, UNFUSED)}
    walls = {c: " and ".join(f"{w:.1f}" for w in a["wall_s"]) for c, a in arm.items()}
    spans = {c: " and ".join(f"{w:.1f}" for w in a["last_volume_s"] - a["first_volume_s"]) for c, a in arm.items()}
    t = {c: pd.read_csv(f) for c, f in ops.items()}

    def ms(c: str, op: str | None = None) -> float:
        d = t[c]
        return d[d["op"] == op]["ms_per_step"].sum() if op else d[~d["op"].str.startswith("aten::")]["ms_per_step"].sum()
    return (f"100 masks by default, warm: {walls[SMALL_JOB]} s against {walls[UNFUSED]} s under `{UNFUSED}` on the "
            f"same machine ({spans[SMALL_JOB]} against {spans[UNFUSED]} s from the first volume to the last); a denoiser "
            f"call's kernels {ms(SMALL_JOB):.2f} against {ms(UNFUSED):.2f} ms, of them the bias adds "
            f"{ms(SMALL_JOB, BIAS_ADD):.2f} against {ms(UNFUSED, BIAS_ADD):.2f} ms, the residual adds "
            f"{ms(SMALL_JOB, RESIDUAL_ADD):.2f} against {ms(UNFUSED, RESIDUAL_ADD):.2f} ms and the new kernel "
            f"{ms(SMALL_JOB, '_residual_kernel'):.2f} ms")


def cold_arms(root: Path, gpu: str | None, run: str) -> str:
    """A run folder's cold 1-mask rows on ``gpu`` by arm (its ``arms.csv``: row, arm, in the rows' order):
    each arm's wall times and how long after ``ready`` Triton's kernels were ready (compiled)."""
    raw = run_csv(Path(root), [gpu] if gpu else [], run, "time_to_result")
    arms = Path(root) / (gpu or "") / run_path(root, gpu, run) / "arms.csv"
    if raw.empty or not arms.is_file():
        return missing(f"cold rows of each arm ({run}: time_to_result.csv, arms.csv)")
    raw = with_arms(raw, arms).assign(compile=raw["kernels_s"] - raw["ready_s"])
    return "; ".join(f"{arm}: {', '.join(f'{w:.1f}' for w in g['wall_s'])} s (Triton's kernels ready "
                     f"{', '.join(f'{k:.1f}' for k in g['compile'])} s after `ready`)"
                     for arm, g in raw.groupby("arm", sort=False))


def warm_arms(root: Path, gpu: str | None, run: str) -> str:
    """A run folder's warm 100-mask rows on ``gpu`` by arm (``with_arms``), per machine (``per_machine``):
    each arm's wall times and first-to-last-volume spans, and the machine's ``same_files.txt`` (the arms'
    files compared)."""
    return per_machine(root, gpu, run, _warm_machine,
                       "warm rows of each arm and their files compared (time_to_result.csv, arms.csv, same_files.txt)")


def _warm_machine(folder: Path) -> str | None:
    """One machine's part of ``warm_arms``; None where a file is missing."""
    if not all((folder / f).is_file() for f in ("time_to_result.csv", "arms.csv", "same_files.txt")):
        return None
    raw = with_arms(pd.read_csv(folder / "time_to_result.csv"), folder / "arms.csv")
    hundred = raw[(raw["volumes"] == 100) & (raw["cache"] == "warm")]
    said = [f"{arm}: {', '.join(f'{w:.1f}' for w in g['wall_s'])} s ("
            f"{', '.join(f'{v:.1f}' for v in g['last_volume_s'] - g['first_volume_s'])} s from the first volume to the last)"
            for arm, g in hundred.groupby("arm", sort=False)]
    return "; ".join(said + (folder / "same_files.txt").read_text().strip().splitlines())


def after_cut(root: Path, gpu: str | None, run: str = AFTER_CUT) -> str:
    """``run``'s rows on ``gpu`` (``scripts/probes/default_rows.sh``'s: ``AFTER_CUT``, ``DEFAULT_ROWS``): the
    v-prediction default's (``v_default``), every warm 1-mask run of it against its target, and `train`'s
    first 100 steps at 128³ (``first_steps``)."""
    raw = run_csv(Path(root), [gpu] if gpu else [], run, "time_to_result")
    if raw.empty:
        return missing(f"rows of the v-prediction default and of train's first steps ({run})")
    warm = raw[raw["command"].str.startswith("sample ") & (raw["volumes"] == 1) & (raw["cache"] == "warm")
               & ~raw["command"].str.contains("--sampler")]["wall_s"]
    target = CHAIN_TARGETS[(1, "warm")]
    spread = (f"; its {len(warm)} warm runs of 1 mask by default {warm.min():.1f} to {warm.max():.1f} s, median "
              f"{warm.median():.1f} s ({(warm <= target).sum()} within {target:g} s)" if len(warm) > 1 else "")
    again = tidy(raw)
    return (f"{v_default(again[again['what'] != 'train'])}{spread}; `train`'s first 100 steps at 128³: "
            f"{first_steps(root, gpu, run)}")


def limit_facts(root: Path, gpus: list[str]) -> dict[str, str]:
    """``tr_train_limit``: each ``limit_runs`` row's timing line, the GPUs it trained on (its env.json)
    and its share against ``LIMIT_TARGET``."""
    said = []
    for r in limit_runs(root, gpus).itertuples():
        env = run_device(root, r.gpu, r.run)
        on = f"{env.get('gpus', 1)} × {env['gpu']}" if "gpu" in env else gpu_name(r.gpu)
        said.append(f"`{r.run}` on {on}: {r.line} (target ≥ {100 * LIMIT_TARGET:g} %: "
                    f"{'met' if r.share >= LIMIT_TARGET else 'missed'})")
    return {"tr_train_limit": "; ".join(said) or missing("training runs' own output under --time-limit "
                                                        "(anatomy/train/NAME/train-stdout.txt)")}


def after_warmup(df: pd.DataFrame) -> str:
    """What `warmup` (every configuration `sample` may pick) buys the next 1-mask `sample` by default:
    its wall time against a warm run's and a cold one's on the same machine, and the warmup's own;
    one clause per machine where the rows name theirs (column ``host``)."""
    if len(df) and "host" in df and df["host"].nunique() > 1:
        return "; ".join(f"host {h}: {after_warmup(g.drop(columns='host'))}" for h, g in df.groupby("host"))
    w = df[(df["what"] == "warmup") & (df["rc"] == 0)] if len(df) else df
    one = lambda cache: newest(df, "default", 1, cache)  # noqa: E731
    after, warm, cold = one("warmup"), one("warm"), one("cold")
    if after is None or warm is None or w.empty:
        return missing(f"rows of `warmup` then `sample` ({WARMUP_ALL})")
    ratio = after["wall_s"] / warm["wall_s"] - 1
    verdict = "within" if ratio <= AFTER_WARMUP_TARGET else "outside"
    return (f"`warmup` {w['wall_s'].iloc[-1]:.1f} s; then 1 mask by default (`{after['ran']}`) {after['wall_s']:.1f} s, "
            f"against {warm['wall_s']:.1f} s warm ({100 * ratio:+.0f} %, {verdict} the {100 * AFTER_WARMUP_TARGET:.0f} % "
            f"target)" + (f" and {cold['wall_s']:.1f} s from an empty cache" if cold is not None else "")
            + f", {gpu_name(after['gpu_slug'])}")


def _against(row: pd.Series, n: int, cache: str) -> str:
    """A default row's wall seconds, with issue 64's target for ``n`` masks ``cache`` where it has one."""
    t, target = row["wall_s"], CHAIN_TARGETS.get((n, cache))
    return f"{t:.1f} s" + (f" ({'met' if t <= target else 'missed'}: {target:g} s)" if target else "")


def _one_mask(w: pd.Series, cold: pd.Series) -> str:
    """1 mask warm, where its seconds went on the command's own clock, and cold."""
    return (f"1 mask {_against(w, 1, 'warm')} warm (on the command's own clock ready at {w['ready_s']:.1f} s, the volume "
            f"at {w['first_volume_s']:.1f} s, the file at {w['written_s']:.1f} s; the rest is Python's start, imports and "
            f"exit) and {_against(cold, 1, 'cold')} cold")


def v_default(df: pd.DataFrame) -> str:
    """The default of a v-prediction checkpoint (the 12-call chain) from the command line: 1 and 100
    masks cold and warm against issue 64's targets, where the first volume came, and after `warmup`."""
    one = {(n, c): newest(df, "default", n, c) for n in (1, 100) for c in ("cold", "warm")}
    if any(r is None for r in one.values()):
        return missing(f"1- and 100-mask rows of a v-prediction checkpoint's default ({V_DEFAULT})")
    w = one[(1, "warm")]
    return (f"`{w['sampler']}` by default under `{w['ran']}`: {_one_mask(w, one[(1, 'cold')])}; 100 masks "
            f"{_against(one[(100, 'warm')], 100, 'warm')} warm and {_against(one[(100, 'cold')], 100, 'cold')} cold; "
            f"{after_warmup(df)}")


def remembered_key(df: pd.DataFrame) -> str:
    """The same default with Triton's key kept in the cache (``TRITON_KEY``): 1 mask warm and cold, and
    after `warmup`, on the GPU its rows name."""
    if "gpu" in df:  # the rows' own GPU: this folder's host was not its store's
        df = df.assign(gpu_slug=df["gpu"])
    w, cold = newest(df, "default", 1, "warm"), newest(df, "default", 1, "cold")
    if w is None or cold is None:
        return missing(f"1-mask rows with Triton's key kept ({TRITON_KEY})")
    return f"{gpu_name(w['gpu_slug'])}: {_one_mask(w, cold)}; {after_warmup(df)}"


def per_gpu(root: Path, gpus: list[str], run: str, quote: Callable[[Path, str | None], str], also: str = "") -> str:
    """``quote(root, gpu)`` for every GPU of the store holding the run folder ``run`` (and ``also``),
    each after its name; where none does, ``quote(root, None)``, which names what is missing."""
    have = [g for g in gpus if all((Path(root) / g / run_path(root, g, r)).is_dir() for r in (run, also) if r)]
    return "; ".join(f"{gpu_name(g)}: {quote(root, g)}" for g in have) or quote(root, None)


def facts(root: Path, gpus: list[str]) -> dict[str, str]:
    """Chapter 15's facts (``tr_``), from the first GPU of the store that holds the measurement."""
    have = [g for g in gpus if (Path(root) / g / FOLDER / "time_to_result.csv").exists()]
    df = rows(root, have[:1])
    f = {"tr_fast_from_calls": f"{FAST_FROM_CALLS:,}", "tr_fast_from_ddpm": str(fast_from(REFERENCE.steps)),
         "tr_fast_from_chain": str(fast_from(FEW_STEP.steps)), "tr_small": f"`{SMALL_JOB}`",
         "tr_default_sampler": f"`{REFERENCE.describe()}` on every checkpoint since the gate's 12-call chain, `{CANDIDATE.describe()}`, the v-prediction default these rows measured, was not confirmed on checkpoints that took no part in choosing it", "tr_gpu": gpu_name(have[0]) if have else missing("time_to_result.csv")}
    f.update(small_job_facts(root, have[:1]))
    before = run_csv(Path(root), have[:1], BEFORE_OWN_GPU, "time_to_result")
    f["tr_nproc_before"] = (sharded(pd.concat([df[df["nproc"] == 1], tidy(before)], ignore_index=True)) if len(before)
                            else missing(f"sharded rows before the ranks saw only their own GPU ({BEFORE_OWN_GPU})"))
    f.update(train_facts(root, have[:1], df))
    f.update(limit_facts(root, gpus))
    f["tr_first_steps"] = first_steps(root, have[0] if have else None)
    f["tr_eval_cut"] = per_gpu(root, gpus, EVAL_CUT, eval_cut, also=TRAIN_CLOCK)
    f["tr_eager_kernels"] = eager_kernels(root, have[0] if have else None)
    f["tr_after_cut"] = per_gpu(root, gpus, AFTER_CUT, after_cut)
    f["tr_default_rows_now"] = per_gpu(root, gpus, DEFAULT_ROWS, lambda r, g: after_cut(r, g, DEFAULT_ROWS))
    f["tr_fused_residual"] = per_gpu(root, gpus, FUSED_RESIDUAL, fused_residual)
    f["tr_pool_tried"] = per_gpu(root, gpus, POOL_TRIED, lambda r, g: cold_arms(r, g, POOL_TRIED))
    f["tr_triton_keys"] = per_gpu(root, gpus, TRITON_KEYS, lambda r, g: cold_arms(r, g, TRITON_KEYS))
    f["tr_overlap"] = per_gpu(root, gpus, OVERLAP, lambda r, g: warm_arms(r, g, OVERLAP))
    f["tr_afterwarmup"] = after_warmup(tidy(run_csv(Path(root), have[:1], WARMUP_ALL, "time_to_result")))
    f["tr_v_default"] = v_default(tidy(run_csv(Path(root), have[:1], V_DEFAULT, "time_to_result")))
    f["tr_triton_key"] = remembered_key(tidy(run_csv(Path(root), have[:1], TRITON_KEY, "time_to_result")))

    def quote(key: str, config: str, volumes: int, cache: str) -> float | None:
        row = newest(df, config, volumes, cache)  # the newest of any sampler, named beside its time
        f[key] = f"{row['wall_s']:.1f} s (`{row['sampler']}`, `{row['ran']}`)" if row is not None else \
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
    mine = df[(df["what"] == "sample") & (df["sampler"] == REFERENCE.sampler) & (df["rc"] == 0)] if len(df) else df
    f["tr_default_rows"] = ("; ".join(f"{r.volumes} mask{'s' if r.volumes > 1 else ''}, "
                                      f"{'no `--config`' if r.config == 'default' else f'`--config {r.config}`'}"
                                      f"{f', {r.nproc} ranks' if r.nproc > 1 else ''}, {r.cache}: "
                                      f"{r.wall_s:.1f} s" for r in mine.sort_values(["volumes", "config", "nproc", "cache"]).itertuples())
                            if len(mine) else missing(f"`sample` rows of {REFERENCE.sampler}"))
    f["tr_per_volume"] = (f"{(w100 - w8) / (100 - 8):.2f} s" if w8 is not None and w100 is not None
                          else missing("fast's 8- and 100-mask warm rows"))
    chain = _chain_s(root, have[0]) if have else None
    f["tr_chain"] = number(chain, ".3f", "bench-sample row of the 12-step chain (sample_bench.csv)") + \
        (" s" if chain is not None else "")
    w8 = wall(df, "fast", 8, "warm", sampler=FEW_STEP.sampler)  # fast's 8 masks of the chain, less 8 chains
    f["tr_fast_fixed"] = (f"{w8 - 8 * chain:.1f} s" if w8 is not None and chain is not None
                          else missing("fast's 8-mask warm row and the chain's bench-sample row"))
    f["tr_nproc"] = sharded(df)
    f["tr_phases"] = phases(df)
    f["tr_tried"] = tried(root, have[0] if have else None)
    c = cut_rows(root, have[0] if have else None)
    f["tr_cut_codes"] = cut_codes(c) if len(c) else missing(f"{FOLDER}/{CUT}/time_to_result.csv")
    f["tr_cut"] = cut(c)
    f["tr_cut_targets"] = cut_targets(c)
    dyn = Path(root) / have[0] / run_path(root, have[0], CUT) / "dynamo_import_s.txt" if have else None
    secs = [float(x) for x in dyn.read_text().split()] if dyn is not None and dyn.is_file() else []
    f["tr_cut_dynamo"] = (f"{sum(secs) / len(secs):.1f} s (mean of {len(secs)})" if secs
                          else missing(f"{CUT}/dynamo_import_s.txt"))
    b = c[c["short"] == "B"] if len(c) else c
    f["tr_cut_afterwarmup"] = after_warmup(tidy(b[b["call"] == b["call"].min()][[*COLUMNS, "gpu_slug"]])) if len(b) else \
        missing(f"B's rows of `warmup` then `sample` in {CUT}")
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
    volumes, ranks, limit = NPROC_TARGET
    for sampler in (df[(df["what"] == "sample") & (df["nproc"] == ranks)]["sampler"].unique() if len(df) else []):
        one, many = (newest(df, "default", volumes, "warm", n, sampler) for n in (1, ranks))
        if one is not None and many is not None:
            x = one["wall_s"] / many["wall_s"]
            met.append(f"{volumes} masks warm on {ranks} ranks, ≥ {limit:g}× one GPU: "
                       f"{'met' if x >= limit else 'missed'} ({x:.1f}×, {sampler}, {many['ran']})")
    f["tr_targets"] = "; ".join(met) if met else missing("rows of the targets")
    same = same_files(root, have[:1])
    f["tr_same"] = ("; ".join(f"{r['what']} (`{r['sampler']}`): {r['identical']} of {r['files']} files identical" for _, r in same.iterrows())
                    if len(same) else missing("same_files.csv"))
    return f


TYPED = {v: k for k, v in SAMPLING_ALIASES.items()}  # a sampling variant by the name a person types for it


def _bench_line(bench: pd.DataFrame, configs: list[str]) -> str:
    """Seconds a volume of ``configs`` (in that order) under DDPM 250 and the 12-step chain, from a
    ``bench-sample`` table (the newest row of each)."""
    parts = []
    for sampler, steps, name in ((REFERENCE.sampler, REFERENCE.steps, f"DDPM {REFERENCE.steps}"),
                                 (FEW_STEP.sampler, FEW_STEP.steps, f"the {FEW_STEP.steps}-step chain")):
        got = []
        for config in configs:
            hit = bench[(bench["config"] == config) & (bench["sampler"] == sampler) & (bench["steps"] == steps)
                        & (bench["batch"] == 1)] if len(bench) else bench
            if len(hit):
                got.append(f"`{TYPED.get(config, config)}` {hit['s_per_volume_median'].iloc[-1]:.3g} s")
        if got:
            parts.append(f"{name}: {', '.join(got)} a volume")
    return "; ".join(parts)


def small_job_facts(root: Path, gpus: list[str]) -> dict[str, str]:
    """What the small-job configuration (``SMALL_JOB``) costs against ``fast`` in the steady state
    (``time_to_result/sample_bench.csv``), and (``SMALL_RUNS``) what its start-up cost before its
    Triton kernels were compiled at once, and without them."""
    f: dict[str, str] = {}
    bench = results_csv(Path(root), gpus, f"{FOLDER}/sample_bench")
    line = _bench_line(bench, [SMALL_JOB, SAMPLING_ALIASES["fast"]])
    f["tr_small_bench"] = line or missing(f"bench-sample rows of {SMALL_JOB} and fast ({FOLDER}/sample_bench.csv)")
    earlier = run_csv(Path(root), gpus, SMALL_RUNS, "time_to_result")
    parts = []
    if len(earlier):
        one = earlier[(earlier["volumes"] == 1) & (earlier["rc"] == 0)]
        bench_nt = run_csv(Path(root), gpus, SMALL_RUNS, "sample_bench")
        for config, what in ((SMALL_JOB, "its kernels compiled one by one at their first launch"),
                             (f"{SMALL_JOB}-nt", f"without its Triton kernels (`{SMALL_JOB}-nt`)")):
            rows = one[one["ran"] == config].drop_duplicates("cache", keep="last").set_index("cache")["wall_s"]
            per = bench_nt[(bench_nt["config"] == config) & (bench_nt["sampler"] == REFERENCE.sampler)
                           & (bench_nt["batch"] == 1)] if len(bench_nt) else bench_nt
            if {"cold", "warm"} <= set(rows.index):
                parts.append(f"{what}: {rows['cold']:.1f} s cold, {rows['warm']:.1f} s warm"
                             + (f", {per['s_per_volume_median'].iloc[-1]:.3g} s a volume of DDPM {REFERENCE.steps}"
                                if len(per) else ""))
    f["tr_small_before"] = "; ".join(parts) if parts else missing(f"{FOLDER}/{SMALL_RUNS}/time_to_result.csv")
    prof = Path(root) / gpus[0] / run_path(root, gpus[0], SMALL_RUNS) / "profile-sample-1-cold.txt" if gpus else None
    split = profile_parts(prof) if prof is not None and prof.is_file() else {}
    asm = "Triton's assembler"
    f["tr_small_kernels"] = (f"{split[asm + ' calls']:.0f} kernels (the assembler alone {split[asm]:.1f} s)"
                             if asm in split else missing(f"cProfile of the cold 1-mask {SMALL_JOB} run ({SMALL_RUNS})"))
    return f


def train_facts(root: Path, gpus: list[str], df: pd.DataFrame) -> dict[str, str]:
    """`train --config fast`'s first 100 steps (the newest cold and warm rows of ``df``, ``rows``' table of
    ``gpus``), the warm run's own read-back intervals (``train-timing-warm.csv``: the steady state of
    those steps) and where a warm start goes under cProfile (``profile-train-warm.txt``, ``TRAIN_PARTS``)."""
    run = df[(df["what"] == "train") & (df["rc"] == 0)] if len(df) else df
    walls = run.drop_duplicates("cache", keep="last").set_index("cache")["wall_s"] if len(run) else pd.Series(dtype=float)
    folder = Path(root) / gpus[0] / FOLDER if gpus else None
    timing = folder / "train-timing-warm.csv" if folder is not None else None
    steady = ""
    if timing is not None and timing.is_file():
        t = pd.read_csv(timing)
        if len(t) > 1:
            last = t.iloc[-1]
            steady = (f"; its steps {last['step_from']:.0f}–{last['step_to']:.0f} took {last['ms_per_step']:.1f} ms each, "
                      f"{t['ms_per_step'].iloc[0]:.0f} ms each before, so 100 steady steps would take "
                      f"{100 * last['ms_per_step'] / 1000:.1f} s")
    f = {"tr_train": (f"{' and '.join(f'{walls[c]:.1f} s {c}' for c in ('cold', 'warm') if c in walls)}{steady}"
                      if len(walls) else missing("`train` rows (time_to_result.csv)"))}
    prof = folder / "profile-train-warm.txt" if folder is not None else None
    split = profile_parts(prof, TRAIN_PARTS) if prof is not None and prof.is_file() else {}
    log = folder / "train-cache-warm.txt" if folder is not None else None
    f["tr_train_cache"] = _cache_verdict(log.read_text()) if log is not None and log.is_file() else \
        missing("cache log of a warm `train` (train-cache-warm.txt, scripts/probes/train_cache_log.py)")
    f["tr_train_parts"] = ("; ".join(f"{part} {split[part]:.1f} s" for part in TRAIN_PARTS if part in split)
                           + (f" (of {split['total']:.1f} s under the profiler)" if "total" in split else "")
                           if split else missing("cProfile of a warm `train` (profile-train-warm.txt)"))
    f["tr_train_now"] = _train_now(folder / TRAIN_AFTER if folder is not None else None, split)
    return f


def _train_now(folder: Path | None, before: dict[str, float]) -> str:
    """A warm `train`'s cProfile and intervals after the AOT autograd cache change (``TRAIN_AFTER``),
    against ``before`` (``profile_parts`` of the earlier profile): what each part takes now, the parts
    no longer among the printed calls, and the run's own intervals."""
    prof = folder / "profile-train-warm.txt" if folder is not None else None
    if prof is None or not prof.is_file():
        return missing(f"cProfile of a warm `train` after the cache change ({TRAIN_AFTER}/profile-train-warm.txt)")
    now = profile_parts(prof, TRAIN_PARTS)
    said = [f"{now['total']:.1f} s under the profiler" + (f" (against {before['total']:.1f} s before)" if "total" in before else "")]
    said += [f"{part} {now[part]:.1f} s" for part in TRAIN_PARTS if part in now]
    gone = [part for part in TRAIN_PARTS if part in before and part not in now]
    if gone:
        said.append(f"no longer among its costliest calls: {', '.join(gone)}")
    timing = folder / "train-timing-warm.csv"
    if timing.is_file():
        t = pd.read_csv(timing)
        said.append("its own intervals (under the profiler): " + ", ".join(f"steps {r.step_from:.0f}–{r.step_to:.0f} {r.ms_per_step:.0f} ms a step"
                                                       for r in t.itertuples()))
    return "; ".join(said)


def _cache_verdict(text: str) -> str:
    """AOT autograd's and Inductor's cache outcomes in a ``scripts/probes/train_cache_log.py`` log:
    the counters' hits, misses and bypasses, and the reason given for a bypass."""
    parts = []
    for name, keys in (("AOT autograd's cache", ("autograd_cache_hit", "autograd_cache_miss", "autograd_cache_bypass")),
                       ("Inductor's graph cache", ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass"))):
        counter = "aot_autograd" if name.startswith("AOT") else "inductor"
        line = re.search(rf"^COUNTER {counter} (\{{.*\}})$", text, re.MULTILINE)
        counts = ast.literal_eval(line[1]) if line else {}
        got = [f"{counts[k]} {k.rsplit('_', 1)[1]}{('es' if k[-1] == 's' else 's') if counts[k] > 1 else ''}"
               for k in keys if counts.get(k)]
        why = re.search(r"Bypassing autograd cache due to: (.*?)\.?\s*$", text, re.MULTILINE) \
            if counter == "aot_autograd" else None
        if got:
            parts.append(f"{name} {', '.join(got)}" + (f" (“{why[1].strip()}”)" if why else ""))
    return "; ".join(parts) if parts else "no cache counters in the log"


CHAIN_WHEN = f"the {CANDIDATE.steps}-call chain, the default when measured"  # a v checkpoint's default until issue 75
STATE_ROWS = (  # chapter 15's first table: (what, volumes, cache, target in s or None, the sampler that ran)
    (f"`sample`, 1 mask, {REFERENCE.sampler.upper()} {REFERENCE.steps} (today's default), warm cache", 1, "warm", TARGETS[("default", 1, "warm")],
     REFERENCE.sampler),
    (f"`sample`, 1 mask, {REFERENCE.sampler.upper()} {REFERENCE.steps} (today's default), empty cache", 1, "cold",
     TARGETS[("default", 1, "cold")], REFERENCE.sampler),
    (f"`sample`, 1 mask, {CHAIN_WHEN}, warm cache (median)", 1, "warm", CHAIN_TARGETS[(1, "warm")], CANDIDATE.sampler),
    (f"`sample`, 1 mask, {CHAIN_WHEN}, empty cache", 1, "cold", CHAIN_TARGETS[(1, "cold")], CANDIDATE.sampler),
    (f"`sample`, 100 masks, {CHAIN_WHEN}, warm cache", 100, "warm", CHAIN_TARGETS[(100, "warm")], CANDIDATE.sampler),
)


def state(root: Path, gpus: list[str]) -> pd.DataFrame:
    """Where time to result stands: per GPU and row of ``STATE_ROWS``, the newest run of current rows (manifest kind
    ``sample-rows``, none superseding it, of the GPU's newest date) that has it, against its target; and `train`'s first 100 steps at 128³,
    process start to checkpoint, warm and cold, from the newest run that has them; with the run folder of each."""
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
                        & (raw["cache"] == cache)]["wall_s"]
                if len(s):
                    now = s.median()
                    rows.append({"GPU": gpu_name(g), "what": what, "today (s)": now, "target (s)": target,
                                 "met": "yes" if now <= target else "no", "run": run})
                    break
        for cache in ("warm", "cold"):
            for run, raw in found:
                t = raw[raw["command"].str.startswith("train ") & (raw["cache"] == cache)]["wall_s"]
                if len(t):
                    rows.append({"GPU": gpu_name(g), "what": f"`train --config fast`, first 100 steps at 128³, {cache} cache",
                                 "today (s)": t.iloc[-1], "target (s)": None, "met": "", "run": run})
                    break
    return pd.DataFrame(rows, columns=["GPU", "what", "today (s)", "target (s)", "met", "run"])


HISTORY = (  # chapter 15's history, oldest first: (the run's content name, or "" for the first rows in
    # time_to_result.csv; the change; what it measured, its facts in braces)
    ("", "the first rows: an ε checkpoint's DDPM 250 default, eager bf16 small jobs, by the rule of their day",
     "against the first targets: {tr_targets}; 1 mask {tr_one_cold} cold, {tr_one_warm} warm; 8 masks by default "
     "{tr_default8_cold} and {tr_default8_warm}, under fast {tr_fast8_cold} cold and {tr_fast8_warm} warm; 100 masks "
     "warm {tr_hundred_warm} ({tr_per_volume} a further volume; the chain alone {tr_chain}; fixed cost {tr_fast_fixed})"),
    ("", "the timing line splits a row's wall time into phases", "{tr_phases}"),
    ("", "cProfile of the 1-mask default, warm", "{tr_profile_total} under the profiler: {tr_profile_parts}; "
     "{tr_profile_ops} custom operators registered at start"),
    ("", "train --config fast --steps 100 at 128³, process start to checkpoint", "{tr_train}; under cProfile, warm: "
     "{tr_train_parts}"),
    ("small-job", "fast-eager: fast's sampler without torch.compile for small jobs, its Triton kernels compiled "
     "together in threads (kernels.precompile)", "steady state {tr_small_bench}; cold kernels {tr_small_kernels}; "
     "before, and without the Triton kernels: {tr_small_before}"),
    ("own-gpu-ranks", "each --nproc rank sees only its own GPU (torch's compile caches key a graph by its device "
     "index, pytorch/pytorch#108971)", "{tr_nproc}; before: {tr_nproc_before}"),
    ("small-job-precompile", "AOT autograd's cache told to keep fast's graph (model._DenseGradCat is an "
     "autograd.Function)", "the caches of a warm run since: {tr_train_cache}"),
    ("warmup-every-config", "warmup without --config compiles every configuration sample may pick",
     "{tr_afterwarmup}"),
    ("v-default-chain", "a v-prediction checkpoint's default of its day, the 12-call chain", "{tr_v_default}"),
    ("start-up-tried", "the Triton kernels' own functions, the first kernel compiled alone, a gloo group "
     "(not kept then)", "{tr_tried}; training warm since: {tr_train_now}"),
    ("triton-key-h200-host", "Triton's installation key kept in MEDDDPM_CACHE (run/cache.py)", "{tr_triton_key}"),
    ("start-up-cut", "a shape's first call runs eagerly; the Triton kernels skip the dispatcher in eager inference; "
     "the process ends once its files are written; precompile compiles each kind of launch once",
     "{tr_cut_codes}: {tr_cut}; importing torch._dynamo, which the dispatcher did: {tr_cut_dynamo}; against the "
     "targets: {tr_cut_targets}; warmup, then sample: {tr_cut_afterwarmup}"),
    ("eager-kernels", "every kernel of ten warm denoiser calls at 128³, fast-eager against fast", "{tr_eager_kernels}"),
    ("train-clock", "train --time-limit reports where its seconds went", "{tr_train_limit}; the first 100 steps at "
     "128³: {tr_first_steps}"),
    ("train-eval-cut", "the EMA's held-out loss alone by default, best.pt hard-linked to checkpoint.pt, one FP32 "
     "evaluator a run", "{tr_eval_cut}"),
    ("after-cut", "the rows again on fresh machines after the start-up cut", "{tr_after_cut}"),
    ("process-pool-tried", "worker processes compiling a cold cache's kernels (removed)", "{tr_pool_tried}"),
    ("triton-keys", "the dry run keys an integer as Triton does (kernels._int_key)", "{tr_triton_keys}"),
    ("fused-residual", "each ResBlock's output written by one Triton kernel (fused_residual)", "{tr_fused_residual}"),
    ("default-rows", "the rows again with the fused residual", "{tr_default_rows_now}; {tr_default_rows}"),
    ("sample-overlap", "each volume queued before the one before is read back; masks read as int8", "{tr_overlap}"),
    ("ddpm-v-default", "DDPM 250 the default on every checkpoint: the 12-call chain not confirmed",
     "{tr_default_sampler}: the first table"),
)


def history(root: Path, gpus: list[str], facts: dict[str, str]) -> pd.DataFrame:
    """Chapter 15's history table, from ``HISTORY`` and the chapter's ``facts``: per change, the newest date of its
    run on ``gpus``, what changed, what it measured, and its run folders (every GPU's)."""
    dated: dict[str, list[tuple[str, str]]] = {}
    for g, folder, m in manifests.every(root):
        if g in gpus:
            name = m.get("name") or manifests.DATED.match(folder.name)["name"]
            dated.setdefault(name, []).append((m["date"], str(folder.relative_to(Path(root) / g)) + f" ({gpu_name(g)})"))
    rows = []
    for name, change, measured in HISTORY:
        runs = sorted(dated.get(name, []))
        if name and not runs:
            continue  # this store holds no run of it
        rows.append({"date": runs[-1][0] if runs else "", "change": change, "measured": measured.format_map(facts),
                     "run": ", ".join(r for _, r in runs) or f"{FOLDER}/time_to_result.csv"})
    return pd.DataFrame(rows, columns=["date", "change", "measured", "run"])
