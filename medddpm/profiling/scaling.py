"""Multi-GPU scaling of the training loop (torchrun + DDP): how much of the gradient all-reduce
the backward pass hides, and the scaling table (``data/results/<gpu>-x<N>/scaling.csv``).

``python -m medddpm.profiling.scaling profile …`` runs under torchrun: the real ``Trainer`` on NIfTI data,
``warmup`` steps, ``steps`` timed steps, then ``steps`` steps under torch.profiler; rank 0 writes the
NCCL kernel time per step and the part of it during which no other kernel ran (exposed
communication), with every rank's own numbers (wall ms per step, kernel time with and without
the NCCL kernels) beside them.
``python -m medddpm.profiling.scaling table RUN…`` turns timed ``train`` runs into ``scaling.csv`` rows.
"""
from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import torch
import torch.distributed as dist

COLUMNS = ["gpu", "world_size", "config", "size", "micro_batch", "grad_accum", "step_ms_median", "volumes_per_s",
           "scaling_efficiency", "allreduce_ms", "torch", "cuda", "nccl"]


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def exposed_comm(kernels: pd.DataFrame, is_comm=lambda name: "nccl" in name.lower()) -> dict[str, float]:
    """From a kernel table (name, start_us, duration_us): total communication kernel time, and the
    part of it not overlapped by any other kernel (µs)."""
    flag = kernels["name"].map(is_comm).astype(bool)
    comm, other = kernels[flag], kernels[~flag]
    busy = _union([(s, s + d) for s, d in zip(other["start_us"], other["duration_us"])])
    total = exposed = 0.0
    for a, b in _union([(s, s + d) for s, d in zip(comm["start_us"], comm["duration_us"])]):
        total += b - a
        covered = sum(max(0.0, min(b, y) - max(a, x)) for x, y in busy if y > a and x < b)
        exposed += (b - a) - covered
    return {"comm_us": total, "exposed_us": exposed}


def busy_us(kernels: pd.DataFrame) -> float:
    """µs during which at least one kernel of the table runs (overlapping kernels counted once): a
    step's wall time less this is the GPU's idle time."""
    return sum(b - a for a, b in _union([(s, s + d) for s, d in zip(kernels["start_us"], kernels["duration_us"])]))


def kernel_sums(kernels: pd.DataFrame, steps: int) -> pd.DataFrame:
    """Per kernel name: launches and µs per step, the longest total first (the table two ranks'
    or two runs' kernels are compared by)."""
    g = kernels.groupby("name", sort=False)["duration_us"].agg(["count", "sum"])
    return (pd.DataFrame({"name": g.index, "launches_per_step": g["count"].to_numpy() / steps,
                          "us_per_step": g["sum"].to_numpy() / steps})
            .sort_values(["us_per_step", "name"], ascending=[False, True], ignore_index=True))


PROFILE_FIELDS = ["config", "world_size", "allreduce_ms_per_step", "exposed_ms_per_step", "kernel_ms_per_step",
                  "hidden_share"]


def load_profiles(paths: Sequence[str | Path]) -> pd.DataFrame:
    """The summaries ``profile`` wrote (JSON), one row each with a ``machine`` column (their folder)."""
    rows = [{"machine": Path(p).parent.name, **{k: d[k] for k in PROFILE_FIELDS}}
            for p in paths for d in [json.loads(Path(p).read_text())]]
    return pd.DataFrame(rows, columns=["machine", *PROFILE_FIELDS])


def profile(images: str, masks: str, config: str, size: int, steps: int, warmup: int, out: str,
            grad_accum: int = 1, model: str = "whole-head", kernels_out: str | None = None) -> dict[str, Any] | None:
    """Under torchrun: time ``steps`` profiled training steps; rank 0 writes and returns the summary.
    With ``kernels_out``, every rank also writes its kernels summed by name (``kernel_sums``) to
    ``<kernels_out>-rank<r>.csv``."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    from ..core.config import TrainConfig, model_preset, run_config
    from ..data.nifti import pair_files
    from ..data.volumes import VolumeDataset
    from ..run.distributed import World
    from .torchprof import _kernels
    from ..core.runtime import default_device, env_info, resolve_device
    from ..train.trainer import Trainer

    world = World.from_env()
    device = resolve_device(world.device(default_device()))
    world.init(device)
    cfg, knobs = model_preset(model), run_config(config, training=True)
    shape = (size,) * 3
    dataset = VolumeDataset(pair_files(images, masks), cfg.name, cfg.out_channels, shape, keep=True)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(dataset, cfg, TrainConfig(grad_accum=grad_accum, log_every=10**9, save_every=10**9),
                          knobs, device, tmp, shape, world=world)
        for _ in range(warmup):
            trainer.train_step()
        trainer.flush()
        cuda = device.type == "cuda"
        t0 = time.perf_counter()  # the same steps unprofiled first: this rank's wall time per step
        for _ in range(steps):
            trainer.train_step()
        trainer.flush()
        step_ms = (time.perf_counter() - t0) * 1e3 / steps
        with torch_profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
            t0 = time.perf_counter()
            for _ in range(steps):
                trainer.train_step()
            trainer.flush()
            if cuda:
                torch.cuda.synchronize(device)
            profiled_ms = (time.perf_counter() - t0) * 1e3 / steps
        kernels = _kernels(prof)
        effective = trainer.engine.settings()
        trainer.close()
    c = exposed_comm(kernels)
    mine = {"rank": world.rank, "step_ms": step_ms, "allreduce_ms_per_step": c["comm_us"] / steps / 1e3,
            "exposed_ms_per_step": c["exposed_us"] / steps / 1e3,
            "kernel_ms_per_step": float(kernels["duration_us"].sum()) / steps / 1e3}
    mine["compute_ms_per_step"] = mine["kernel_ms_per_step"] - mine["allreduce_ms_per_step"]
    # the profiled steps' wall time and how much of it some kernel ran: the rest is the GPU waiting for the host
    mine["profiled_step_ms"], mine["busy_ms_per_step"] = profiled_ms, busy_us(kernels) / steps / 1e3
    if kernels_out:
        kernel_sums(kernels, steps).assign(rank=world.rank, world_size=world.size, config=config).to_csv(
            f"{kernels_out}-rank{world.rank}.csv", index=False, lineterminator="\n")
    ranks: list[Any] = [mine]
    if world.distributed:  # every rank's numbers: the spread between ranks is what the NCCL kernels wait for
        ranks = [None] * world.size
        dist.all_gather_object(ranks, mine)
    world.close()
    if not world.main:
        return None
    summary = {"config": config, "world_size": world.size, "size": size, "grad_accum": grad_accum, "steps": steps,
               **{k: mine[k] for k in ("allreduce_ms_per_step", "exposed_ms_per_step", "kernel_ms_per_step")},
               "hidden_share": 1 - c["exposed_us"] / c["comm_us"] if c["comm_us"] else float("nan"),
               "ranks": ranks, "effective_knobs": effective, "env": env_info(device)}
    Path(out).write_text(json.dumps(summary, indent=2, default=str))
    return summary


def table(runs: Sequence[str | Path], gpu: str, profiles: Sequence[str | Path] = ()) -> pd.DataFrame:
    """Scaling rows from timed ``train`` runs (their checkpoint config and ``timing.csv``): step time
    = median of the read-back intervals after the first; efficiency = T(1 GPU) / T(N GPUs) of the
    same configuration at the same micro-batch (weak scaling: every GPU keeps its batch)."""
    from ..train.loop import run_summary
    from ..core.runtime import env_info

    missing = [str(p) for p in profiles if not Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"no profile summary at {', '.join(missing)}")
    prof = load_profiles(profiles)
    prof = dict(zip(zip(prof["config"], prof["world_size"]), prof["allreduce_ms_per_step"]))
    env = env_info()
    rows = []
    for run in runs:
        r = run_summary(run)
        world, b, accum, ms = r["world_size"], r["micro_batch"], r["grad_accum"], r["step_ms"]
        rows.append({"gpu": gpu, "world_size": world, "config": r["config"], "size": r["size"],
                     "micro_batch": b, "grad_accum": accum, "step_ms_median": round(ms, 2),
                     "volumes_per_s": round(world * b * accum / (ms / 1e3), 3),
                     "allreduce_ms": round(prof.get((r["config"], world), float("nan")), 3),
                     "torch": env["torch"], "cuda": env["cuda"],
                     "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else ""})
    return _with_efficiency(rows)


RANK_KNOBS = ("grad_sync", "grad_buckets", "grad_reduce")  # how several ranks reduce: nothing one process runs


def one_gpu_twin(config: str) -> str:
    """The configuration whose run on one GPU is ``config``'s: the first in ``CONFIGS`` that differs
    from it only in ``RANK_KNOBS`` (``fast-rbf16`` → ``fast``); an unknown name is its own."""
    from dataclasses import asdict

    from ..core.config import CONFIGS

    if config not in CONFIGS:
        return config
    alone = lambda k: {f: v for f, v in asdict(k).items() if f not in ("name", *RANK_KNOBS)}  # noqa: E731
    return next(name for name, k in CONFIGS.items() if alone(k) == alone(CONFIGS[config]))


def _with_efficiency(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The scaling table of ``rows`` (every column but the efficiency): efficiency = T(1 GPU) / T(N GPUs)
    of the same configuration (or its ``one_gpu_twin``), size, micro-batch and grad-accum (weak scaling)."""
    df = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "scaling_efficiency"])
    twins = df["config"].map(one_gpu_twin)
    ones = df.assign(config=twins)[df["world_size"] == 1]
    one = ones.groupby(["config", "size", "micro_batch", "grad_accum"])["step_ms_median"].first()
    key = list(zip(twins, df["size"], df["micro_batch"], df["grad_accum"]))
    df["scaling_efficiency"] = [round(one.get(k, float("nan")) / ms, 4) for k, ms in zip(key, df["step_ms_median"])]
    return df[COLUMNS].sort_values(["config", "world_size"]).reset_index(drop=True)


_STEADY = re.compile(r"^steady state: ([0-9.]+) ms/step")
_TRAIN = re.compile(r"\[rc=0, \d+ s\] .*-m medddpm train .*")


def table_from_log(log: str | Path, gpu: str, versions: dict[str, str]) -> pd.DataFrame:
    """Scaling rows from a measurement script's log (``scripts/_run.sh``: each command's last lines,
    then ``[rc=0, N s] COMMAND``) where the run folders themselves are gone: every successful
    ``medddpm train`` command with its printed steady state (the same median ``table`` takes),
    its --config, --size, --grad-accum and --nproc. ``versions``: torch, cuda, nccl of the machine."""
    rows, steady = [], None
    for line in Path(log).read_text().splitlines():
        if m := _STEADY.match(line.strip()):
            steady = float(m.group(1))
        elif _TRAIN.search(line) and steady is not None:
            words = line.split()
            arg = dict(zip(words, words[1:]))
            world, accum, size = int(arg.get("--nproc", 1)), int(arg.get("--grad-accum", 1)), int(arg["--size"])
            rows.append({"gpu": gpu, "world_size": world, "config": arg["--config"], "size": f"{size}x{size}x{size}",
                         "micro_batch": 1, "grad_accum": accum, "step_ms_median": steady,
                         "volumes_per_s": round(world * accum / (steady / 1e3), 3), "allreduce_ms": float("nan"),
                         **{k: versions.get(k, "") for k in ("torch", "cuda", "nccl")}})
            steady = None
    return _with_efficiency(rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m medddpm.profiling.scaling")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("profile", help="under torchrun: profile DDP training steps (rank 0 writes JSON)")
    s.add_argument("--images", required=True, help="image folder")
    s.add_argument("--masks", required=True, help="mask folder")
    s.add_argument("--config", required=True, help="run configuration")
    s.add_argument("--size", type=int, default=128, help="cubic volume side")
    s.add_argument("--steps", type=int, default=5, help="profiled steps")
    s.add_argument("--warmup", type=int, default=10, help="steps before profiling (compile, buckets)")
    s.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step on each rank")
    s.add_argument("--model", default="whole-head", help="model preset")
    s.add_argument("--out", required=True, help="summary JSON (rank 0)")
    s.add_argument("--kernels", help="also every rank's kernels summed by name, to <KERNELS>-rank<r>.csv")
    s = sub.add_parser("table", help="scaling.csv from timed train runs")
    s.add_argument("runs", nargs="+", help="train run folders")
    s.add_argument("--gpu", required=True, help="GPU label of the rows, e.g. h200-x2")
    s.add_argument("--profiles", nargs="*", default=[], help="profile JSONs (allreduce ms per step)")
    s.add_argument("--out", required=True, help="CSV to write")
    s = sub.add_parser("table-log", help="scaling.csv from a measurement log whose run folders are gone")
    s.add_argument("log", help="the log (scripts/_run.sh's log.txt, or a call's whole output)")
    s.add_argument("--gpu", required=True, help="GPU label of the rows, e.g. h100-80gb-hbm3-x4")
    s.add_argument("--info", required=True, help="`medddpm info --json` of that machine (torch and CUDA versions)")
    s.add_argument("--nccl", default="", help="NCCL version, where the log does not say")
    s.add_argument("--out", required=True, help="CSV to write")
    a = p.parse_args(argv)
    if a.cmd == "table-log":
        info = json.loads(Path(a.info).read_text())
        table_from_log(a.log, a.gpu, {"torch": info["torch"], "cuda": info["cuda"], "nccl": a.nccl}).to_csv(
            a.out, index=False, lineterminator="\n")
        return 0
    if a.cmd == "profile":
        profile(a.images, a.masks, a.config, a.size, a.steps, a.warmup, a.out, a.grad_accum, a.model, a.kernels)
    else:
        table(a.runs, a.gpu, a.profiles).to_csv(a.out, index=False, lineterminator="\n")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
