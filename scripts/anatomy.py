#!/usr/bin/env python3
"""Quality on real anatomy (issue 47): one IXI checkpoint's samples of held-out masks, measured
against the real scans and the training-mean template (``medddpm.sample.anatomy``).

    anatomy.py --data IXI --checkpoint CKPT --out OUT --name NAME [--split val] \\
               [--runs dpm2m-sde12-logsnr:fast,ddpm250:baseline] [--seeds 0,1,2] [--work W]

IXI is a ``medddpm prepare-ixi`` folder: the template averages dev/'s training subjects (dev less
val), the masks sampled are SPLIT/'s (val; test only for the one final evaluation). Rows append to
OUT/anatomy/{anatomy_samples,anatomy_diversity,anatomy_summary}.csv, each with NAME, the checkpoint's
step and the knobs it was trained with; the first seed's orthogonal slices of 3 subjects go to
OUT/anatomy/slices-NAME.parquet. With --utility-steps, the segmentation utility of the training
masks' synthetic scans (``medddpm.sample.utility``) goes to OUT/anatomy/anatomy_utility.csv.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, replace
from pathlib import Path

from medddpm.core.errors import InputError
from medddpm.core.io import append_csv, atomic_path
from medddpm.core.runtime import env_info, resolve_device


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a medddpm prepare-ixi folder")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", required=True, help="results folder of this GPU")
    p.add_argument("--name", required=True, help="the training run's name in the tables")
    p.add_argument("--split", default="val", choices=("val", "test"))
    p.add_argument("--runs", default="dpm2m-sde12-logsnr:fast,ddpm250:baseline", help="sampler runs, spec:config")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--work", default="anatomy-work")
    p.add_argument("--device", default=None)
    p.add_argument("--workers", type=int, default=4, help="processes measuring the subjects")
    p.add_argument("--batch", type=int, default=4, help="masks sampled together")
    p.add_argument("--utility-steps", type=int, default=0, help="segmentation utility: train a small segmenter "
                   "this many steps on synthetic scans of the training masks (the first run's sampler, seed 0) and "
                   "on the real ones, test both on SPLIT's real scans (0 = skip)")
    p.add_argument("--utility-seeds", default="0", help="seeds of the segmenters")
    a = p.parse_args(argv)
    try:
        run(a)
    except InputError as exc:
        print(f"anatomy.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


def run(a: argparse.Namespace) -> None:
    import pandas as pd

    from medddpm.data.nifti import strip_nifti_suffix
    from medddpm.sample.anatomy import anatomy_tables, region_labels, run_tags, split_pairs, summary, template
    from medddpm.sample.gate import GateRun, sample_runs
    from medddpm.sample.quality import orthogonal_slices, read_sample
    from medddpm.train.checkpoint import configs_from_checkpoint, data_config, load_checkpoint

    data = Path(a.data)
    seeds = [int(s) for s in a.seeds.split(",")]
    if any(r.count(":") != 1 for r in a.runs.split(",")):
        raise InputError(f"--runs {a.runs!r}: each run is SPEC:CONFIG, e.g. dpm2m-sde12-logsnr:fast")
    runs = [GateRun.parse(spec, config, seed) for spec, config in (r.split(":") for r in a.runs.split(","))
            for seed in seeds]
    ckpt = load_checkpoint(a.checkpoint)
    model_cfg = configs_from_checkpoint(ckpt)[0]
    dcfg = data_config(ckpt)
    held, train = split_pairs(data, a.split)
    device = resolve_device(a.device)
    folders = sample_runs(a.checkpoint, data / a.split / "masks", Path(a.work) / a.name / a.split, runs, device,
                          a.batch)
    keyed = {(f"{r.spec}:{r.config}", r.seed): f for r, f in folders.items()}
    mean = template(train, dcfg)
    samples, diversity = anatomy_tables(keyed, held, dcfg, model_cfg.name, mean, a.workers)
    tag = run_tags(ckpt, a.name, a.split)
    env = {**env_info(device), "checkpoint": str(a.checkpoint), "data_config": asdict(dcfg),
           "train_subjects": len(train), "held_subjects": [p.subject for p in held]}
    out = Path(a.out) / "anatomy"
    table = summary(samples, diversity)
    for name, df in (("anatomy_samples", samples), ("anatomy_diversity", diversity), ("anatomy_summary", table)):
        append_csv(out / f"{name}.csv", df.assign(**tag), env)
    # the first seed's slices of every run: the samples alone, because the scans, their mean and the
    # masks are the data set's (IXI's, NiChart's), never written into a results store that may be committed
    shown = held[:3]
    vols = {run: {p.subject: read_sample(folder / f"{strip_nifti_suffix(p.mask.name)}.nii.gz") for p in shown}
            for (run, seed), folder in keyed.items() if seed == seeds[0]}
    labels = {p.subject: (region_labels(p.mask) > 0).astype("int64") for p in shown}  # where the slices cut
    sl = orthogonal_slices(vols, labels)
    with atomic_path(out / f"slices-{a.name}-{a.split}.parquet") as tmp:
        sl[sl["source"] != "mask"].to_parquet(tmp, index=False)
    pd.set_option("display.width", 200)
    print(table.round(3).to_string())
    if a.utility_steps > 0:
        util = segmentation_utility(a, ckpt, train, held, runs[0], device, out.parent / "anatomy_utility_work")
        append_csv(out / "anatomy_utility.csv", util.assign(**tag), env)
        print(util.groupby("source")["dice"].agg(["mean", "min", "count"]).round(3).to_string())


def segmentation_utility(a: argparse.Namespace, ckpt: dict, train: list, held: list, run, device, scratch: Path):
    """Sample every training mask with ``run``'s sampler (seed 0), then ``utility.utility``: Dice on
    the held-out real scans of a segmenter trained on those synthetic scans, and of one trained on
    the real training scans, each against the brain the masks give."""
    import os

    from medddpm.data.nifti import read_image, strip_nifti_suffix
    from medddpm.sample.anatomy import brain_mask
    from medddpm.sample.gate import sample_runs
    from medddpm.sample.quality import read_sample
    from medddpm.sample.utility import stack, utility
    from medddpm.train.checkpoint import data_config

    dcfg = data_config(ckpt)
    masks = scratch / "train_masks"  # the training masks alone (dev/ also holds val's)
    masks.mkdir(parents=True, exist_ok=True)
    for p in train:
        if not (masks / p.mask.name).exists():
            os.symlink(p.mask.resolve(), masks / p.mask.name)
    first = replace(run, seed=0)  # the run itself (its η too), at seed 0
    folder = sample_runs(a.checkpoint, masks, Path(a.work) / a.name / "train", [first], device, a.batch)[first]
    model = ckpt["config"]["model"]["name"]
    brain = lambda p: brain_mask(p, dcfg, model)  # noqa: E731
    real = stack([read_image(p.image, 1, dcfg)[0] for p in train])
    synthetic = stack([read_sample(folder / f"{strip_nifti_suffix(p.mask.name)}.nii.gz") for p in train])
    labels = stack([brain(p) for p in train]).bool()
    test, test_labels = stack([read_image(p.image, 1, dcfg)[0] for p in held]), stack([brain(p) for p in held]).bool()
    seeds = [int(s) for s in a.utility_seeds.split(",")]
    return utility(real, synthetic, labels, test, test_labels, [p.subject for p in held], a.utility_steps, device,
                   seeds).assign(sampler=f"{first.spec}:{first.config}")


if __name__ == "__main__":
    sys.exit(main())
