#!/usr/bin/env python3
"""The sampler equivalence gate's samples and measures (``medddpm.sample.equivalence``): one IXI
checkpoint samples the validation masks with every run over its seeds, spread over the GPUs, then
every sample is measured against its subject's scan and the training-mean template.

    equivalence.py --data IXI --checkpoint CKPT --out OUT --name NAME \\
                   --runs 'ddpm250:fast@0-31;dpm2m-sde4-logsnr:fast@16-31;…' [--gpus 4] [--deadline S]

A run is SPEC:CONFIG@SEEDS (SEEDS: 'A-B' or 'a,b,c'), sampled in the order given. Each GPU's worker
(one process, CUDA_VISIBLE_DEVICES) builds each configuration's ``Sampler`` once and samples its share
(run, seed) by (run, seed), batch masks at a time; from ``--deadline`` seconds after the start it
samples nothing new, so a call ends with what it finished, and a later call over the same ``--work``
samples only what is left (``--sample-only`` stops there). Then every finished sample is measured
(``anatomy.anatomy_tables``, SSIM between adjacent seeds) by ``--workers`` processes into
OUT/equivalence/{samples,diversity,runs}.csv: measures tagged with NAME, the checkpoint's step and
its recipe; runs.csv holds each (run, seed)'s seconds and whether it was finished.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from medddpm.core.errors import InputError

START = time.monotonic()


def parse_runs(text: str) -> list[tuple[str, str, list[int]]]:
    """'spec:config@0-3;spec:config@4,5' → [(spec, config, seeds)], checked."""
    from medddpm.sample.gate import GateRun

    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        try:
            run, seeds = part.split("@")
            spec, config = run.split(":")
        except ValueError:
            raise InputError(f"--runs: {part!r} is not SPEC:CONFIG@SEEDS") from None
        if "-" in seeds and "," not in seeds:
            a, b = seeds.split("-")
            ids = list(range(int(a), int(b) + 1))
        else:
            ids = [int(s) for s in seeds.split(",")]
        GateRun.parse(spec, config)
        out.append((spec, config, ids))
    if not out:
        raise InputError("--runs names no run")
    return out


def worker(a: argparse.Namespace) -> int:
    """Sample this worker's (spec, config, seed) list in order until the deadline (``gate.sample_runs``)."""
    import torch

    from medddpm.sample.gate import GateRun, sample_runs

    units = json.loads(Path(a.worker).read_text())
    runs = [GateRun.parse(spec, config, seed) for spec, config, seed in units]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    seconds: dict = {}
    folders = sample_runs(a.checkpoint, Path(a.data) / a.split / "masks", a.work, runs, device, a.batch,
                          a.deadline_at, seconds)
    rows = [{"spec": spec, "config": config, "seed": seed, "seconds": seconds.get(r, float("nan")),
             "finished": r in folders} for (spec, config, seed), r in zip(units, runs)]
    Path(a.worker).with_suffix(".out.json").write_text(json.dumps(rows))
    return 0


def ledger(work: Path, rows: list[dict]) -> "pd.DataFrame":
    """This call's (run, seed) rows, each sampled one with its seconds and GPU: a unit sampled by an
    earlier call over the same WORK (its folder kept, so skipped now) takes those recorded then in
    WORK/units.jsonl, to which this call's sampled units are appended."""
    import math

    import pandas as pd

    path = work / "units.jsonl"
    with path.open("a") as f:
        for r in rows:
            if r["finished"] and not math.isnan(r["seconds"]):
                f.write(json.dumps(r) + "\n")
    timed = {(r["spec"], r["config"], r["seed"]): r for r in map(json.loads, path.read_text().splitlines())}
    key = lambda r: (r["spec"], r["config"], r["seed"])  # noqa: E731
    return pd.DataFrame([timed.get(key(r), r) if r["finished"] else r for r in rows])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a medddpm prepare-ixi folder")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", required=True, help="results folder: tables go to OUT/equivalence/")
    p.add_argument("--name", required=True, help="the training run's name in the tables")
    p.add_argument("--runs", required=True, help="SPEC:CONFIG@SEEDS;… in the order to sample")
    p.add_argument("--split", default="val", choices=("val",), help="the validation subjects (never the test set)")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--deadline", type=float, default=1e9, help="seconds from start after which nothing new is sampled")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes measuring")
    p.add_argument("--work", default="equivalence-work", help="samples (not results); a later call over the same "
                   "WORK keeps the (run, seed)s already sampled")
    p.add_argument("--sample-only", action="store_true", help="sample until the deadline, measure nothing (a later "
                   "call finishes and measures)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--deadline-at", type=float, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    try:
        return worker(a) if a.worker else run(a)
    except InputError as exc:
        print(f"equivalence.py: error: {exc}", file=sys.stderr)
        return 2


def run(a: argparse.Namespace) -> int:
    import pandas as pd

    from medddpm.core.io import append_csv
    from medddpm.core.runtime import env_info, resolve_device
    from medddpm.sample.anatomy import anatomy_tables, run_tags, split_pairs, template
    from medddpm.sample.gate import GateRun
    from medddpm.train.checkpoint import configs_from_checkpoint, data_config, load_checkpoint

    runs = parse_runs(a.runs)
    data, work = Path(a.data), Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    units = [(spec, config, seed) for spec, config, seeds in runs for seed in seeds]
    cost = lambda u: GateRun.parse(u[0], u[1]).steps  # noqa: E731  (denoiser calls a volume)
    shares: list[list] = [[] for _ in range(a.gpus)]
    load = [0] * a.gpus
    for u in units:  # in the order given, each to the least loaded GPU
        g = load.index(min(load))
        shares[g].append(u)
        load[g] += cost(u)
    deadline_at = time.time() + a.deadline - (time.monotonic() - START)
    procs = []
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d] or [str(g) for g in range(a.gpus)]
    if len(visible) < a.gpus:
        raise InputError(f"--gpus {a.gpus}, but CUDA_VISIBLE_DEVICES names {len(visible)}")
    for g, share in enumerate(shares):
        f = work / f"worker-{g}.json"
        f.write_text(json.dumps(share))
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible[g]}  # the g-th GPU this process may use
        procs.append(subprocess.Popen([sys.executable, __file__, "--data", a.data, "--checkpoint", a.checkpoint,
                                       "--out", a.out, "--name", a.name, "--runs", a.runs, "--split", a.split,
                                       "--batch", str(a.batch), "--work", str(work), "--worker", str(f),
                                       "--deadline-at", str(deadline_at)], env=env))
    codes = [q.wait() for q in procs]
    print(f"workers ended {codes} (t+{time.monotonic() - START:.0f} s)", flush=True)
    done = []
    for g in range(a.gpus):
        out = work / f"worker-{g}.out.json"
        if out.exists():
            done += [{**r, "gpu": g} for r in json.loads(out.read_text())]
            out.unlink()
    table = ledger(work, done)
    finished = table[table["finished"]] if not table.empty else table
    left = int((~table["finished"]).sum()) if not table.empty else len(units)
    if a.sample_only:
        print(f"sampled {len(finished)} of {len(units)} (run, seed)s; {left} left (t+{time.monotonic() - START:.0f} s)",
              flush=True)
        return 0
    if finished.empty:
        raise InputError("no run finished: nothing to measure")
    ckpt = load_checkpoint(a.checkpoint)
    model_cfg = configs_from_checkpoint(ckpt)[0]
    dcfg = data_config(ckpt)
    held, train = split_pairs(data, a.split)
    keyed = {(f"{r.spec}:{r.config}", int(r.seed)): work / GateRun.parse(r.spec, r.config, int(r.seed)).name
             for r in finished.itertuples()}
    samples, diversity = anatomy_tables(keyed, held, dcfg, model_cfg.name, template(train, dcfg), a.workers,
                                        pairs="adjacent")
    print(f"measured {len(keyed)} runs x seeds (t+{time.monotonic() - START:.0f} s)", flush=True)
    tag = run_tags(ckpt, a.name, a.split)
    device = resolve_device(None)
    env = {**env_info(device), "checkpoint": str(a.checkpoint), "data_config": asdict(dcfg),
           "train_subjects": len(train), "held_subjects": [p.subject for p in held], "gpus": a.gpus}
    out = Path(a.out) / "equivalence"
    for name, df in (("samples", samples), ("diversity", diversity), ("runs", table)):
        append_csv(out / f"{name}.csv", df.assign(**tag), env)
    missing = table[~table["finished"]]
    if not missing.empty:
        print(f"not sampled before the deadline: {len(missing)} (run, seed)s, e.g. "
              f"{missing[['spec', 'config', 'seed']].head(3).to_dict('records')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
