"""What a user waits for (issue 48): a ``medddpm`` command's wall time from process start to its
files written (``time_to_result.csv``), and whether two runs wrote the same files
(``same_files.csv``). ``scripts/time_to_result.sh`` runs the commands of the issue on a GPU.

    python -m medddpm.profiling.waiting run --out CSV --cache cold --volumes 8 -- sample --checkpoint …
    python -m medddpm.profiling.waiting compare A B --out CSV --what "fast twice"

A ``run`` row's ``config`` is the command's ``--config`` (``default`` without one: ``sample`` then
picks by its masks and denoiser calls, ``core.config.FAST_FROM_CALLS``), ``ran`` the configuration it ran
(the one it picked, as it said), its ``sampler`` a `sample` command's
``--sampler``, else the one its ``sampler …`` line names (the checkpoint's default; empty for other commands).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from ..core.errors import InputError
from ..core.io import append_csv
from ..sample.timing import TIMING

# a `sample` row's columns of its timing line (``sample.timing.TIMING``: seconds since the command started, rank 0's)
PHASES = {phase: phase.replace(" ", "_") + "_s" for phase in TIMING}
# a `train` row's, of train's timing line (``train.timing.timing_line``): its ``ready`` since the command started (the
# column of sample's), then how long its first step (compilation, autotuning, the CUDA graph's capture) and its steady
# steps took
TRAIN_PHASES = {"ready": "ready_s", "first step": "first_step_s", "steady steps": "steady_steps_s"}
COLUMNS = ["gpu", "command", "config", "ran", "sampler", "volumes", "cache", "wall_s", "rc", "torch", "cuda", "date",
           *PHASES.values(), *(c for c in TRAIN_PHASES.values() if c not in PHASES.values())]
CACHE_STATES = ("cold", "warm", "warmup")  # a row's compile cache before it: empty, filled by the same command, by `warmup`
SAME_COLUMNS = ["gpu", "what", "sampler", "files", "identical", "max_abs_diff", "mean_abs_diff", "date"]


def timed(argv: Sequence[str]) -> tuple[float, int, str, str]:
    """(wall seconds, exit code, stderr, stdout) of ``python -m medddpm ARGV`` in a new process."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "medddpm", *argv], capture_output=True, text=True)
    return time.perf_counter() - t0, p.returncode, p.stderr, p.stdout


def ran(argv: Sequence[str], stderr: str) -> str:
    """The configuration a `sample` command ran: its ``--config``, else the one its ``config …`` line
    names (``sample`` says which one it picked on a GPU); "" where neither tells (a CPU, ``train``)."""
    if argv[:1] != ["sample"]:
        return ""
    said = re.search(r"^config ([\w.-]+)", stderr, re.MULTILINE)
    return option(argv, "--config", said[1] if said else "")


def sampler_ran(argv: Sequence[str], stderr: str) -> str:
    """The sampler a `sample` command ran: its ``--sampler``, else the one its ``sampler …`` line
    names (``sample`` says which default it ran); "" where neither tells (other commands)."""
    if argv[:1] != ["sample"]:
        return ""
    said = re.search(r"^sampler ([\w.-]+)", stderr, re.MULTILINE)
    return option(argv, "--sampler", said[1] if said else "")


def phases(text: str, argv: Sequence[str] = ("sample",)) -> dict[str, float]:
    """The seconds the ``timing:`` line in ``text`` gives: `sample`'s (``PHASES``' columns), or `train`'s where
    ``argv`` is a train command (``TRAIN_PHASES``'); none without one."""
    line = re.search(r"^timing: (.*)$", text, re.MULTILINE)
    said = dict(re.findall(r"([a-z][a-z -]*?) ([0-9.]+) s(?=, | \(|$)", line[1])) if line else {}
    names = TRAIN_PHASES if next(iter(argv), "") == "train" else PHASES
    return {column: float(said[name]) for name, column in names.items() if name in said}


def option(argv: Sequence[str], name: str, default: str) -> str:
    """The value of ``name`` in ``argv`` (``--config fast``), else ``default``."""
    argv = list(argv)
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else default


def same_files(a: str | Path, b: str | Path) -> dict[str, float]:
    """How two folders of NIfTI files of the same names agree: files, bit-identical ones, and the
    largest and mean absolute difference over all voxels."""
    import nibabel as nib

    a, b = Path(a), Path(b)
    names = sorted(p.name for p in a.glob("*.nii*"))
    if not names or names != sorted(p.name for p in b.glob("*.nii*")):
        raise InputError(f"{a} and {b} do not hold the same NIfTI files")
    same, worst, total, count = 0, 0.0, 0.0, 0
    for n in names:
        x, y = (np.asarray(nib.load(str(d / n)).dataobj) for d in (a, b))
        diff = np.abs(x.astype(np.float64) - y.astype(np.float64))
        same += int(x.shape == y.shape and np.array_equal(x, y))
        worst, total, count = max(worst, float(diff.max())), total + float(diff.sum()), count + diff.size
    return {"files": len(names), "identical": same, "max_abs_diff": worst, "mean_abs_diff": total / max(count, 1)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m medddpm.profiling.waiting", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="step", required=True)
    r = sub.add_parser("run", help="time one medddpm command (the arguments after --)")
    r.add_argument("--out", required=True, help="time_to_result.csv to append to")
    r.add_argument("--cache", required=True, choices=CACHE_STATES, help="the compile cache's state before it: cold "
                   "(empty), warm (an earlier run of the same command filled it), warmup (only `medddpm warmup` did)")
    r.add_argument("--volumes", type=int, required=True, help="volumes the command writes (train: steps)")
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- then the medddpm arguments")
    c = sub.add_parser("compare", help="whether two folders hold the same files")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--out", required=True, help="same_files.csv to append to")
    c.add_argument("--what", required=True, help="what the two runs were")
    c.add_argument("--sampler", default="default", help="the sampler both runs ran (default: 'default', sample's for the checkpoint)")
    a = p.parse_args(argv)
    from ..core.runtime import env_info  # PyTorch: measuring, not reading rows

    env = env_info()
    gpu = env.get("gpu") or "cpu"
    try:
        if a.step == "run":
            cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
            if not cmd:
                raise InputError("give the medddpm command after --")
            wall, rc, err, out = timed(cmd)
            tail = "\n".join(err.strip().splitlines()[-3:])
            row = {"gpu": gpu, "command": " ".join(cmd), "config": option(cmd, "--config", "default"), "ran": ran(cmd, err),
                   "sampler": sampler_ran(cmd, err),
                   "volumes": a.volumes, "cache": a.cache, "wall_s": round(wall, 3), "rc": rc,
                   "torch": env.get("torch"), "cuda": env.get("cuda"), "date": date.today().isoformat(),
                   **phases(f"{err}\n{out}", cmd)}  # sample says its timing on stderr, train on stdout
            append_csv(a.out, pd.DataFrame([row], columns=COLUMNS), env)
            print(f"{wall:.1f} s, rc {rc}: medddpm {' '.join(cmd)}" + (f"\n{tail}" if rc else ""))
            return 0 if rc == 0 else 1
        row = {"gpu": gpu, "what": a.what, "sampler": a.sampler, **same_files(a.a, a.b), "date": date.today().isoformat()}
        append_csv(a.out, pd.DataFrame([row], columns=SAME_COLUMNS), env)
        print(f"{a.what}: {row['identical']} of {row['files']} files identical, max |Δ| {row['max_abs_diff']:.3g}")
        return 0
    except InputError as exc:
        print(f"waiting: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
