#!/usr/bin/env python3
"""Quality parity of the run configurations (issue 10 §2), for one GPU. Tables go to OUT/quality/:

    quality.py agree   --out OUT --size 64 --configs baseline,opt1,...          # ε vs FP64 CPU → agreement.csv
    quality.py agree   --out OUT --data DEMO --checkpoint CKPT --configs ...  # trained ε vs baseline → agreement_trained.csv
    quality.py parity  --out OUT --data DEMO --size 64 --configs ... --seeds 0 --steps 1000 \\
                       [--keep baseline:0 --work W]   # → parity_train.csv, parity_heldout.csv (+ W/<cfg>-<seed>/)
    quality.py split   --work W --data DEMO                                   # W/train/, W/held_out_masks/
    quality.py sample  --work W --data DEMO --checkpoint CKPT --configs ...   # W/samples/<cfg>/*.nii.gz (GPU)
    quality.py compare --out OUT --data DEMO --samples W/samples              # → sample_agreement.csv,
                                                                              #   histograms.csv, slices.parquet
    quality.py samplers --out OUT --data DEMO --checkpoint CKPT --configs fast-w16-p8 [--seeds 0,1] \
                        [--runs ddpm250,ddim250-eta0,ddim250-eta1,ddim50-eta0,ddim50-eta1,ddpm250-noclip] --work W
                                                  # held-out masks sampled per run (W/samplers/<run>/,
                                                  # kept: a second call resumes) → samplers.csv,
                                                  #   sampler_slices.parquet; [--name N --reference baseline]
                                                  #   → N.csv, N_agreement.csv (voxels vs baseline's run)

    quality.py gate --out OUT --data DEMO --checkpoint CKPT --seeds 0,1,2,3 --configs fast \
                    --runs dpm2m-sde10-logsnr,ddim50,... [--work W] [--slices dpm2m-sde10-logsnr:fast]
                                                  # FP32 DDPM 250 (the band) and every run × config on the
                                                  # held-out masks (W/gate/<run>/, kept: resumable) →
                                                  # sampler_gate.csv, sampler_diversity.csv,
                                                  # sampler_verdicts.csv, sampler_gate_slices.parquet

DEMO is a folder with images/ and masks/ (``medddpm demo-data``); its last ``--held-out``
subjects are never trained on and are the ones sampled. All logic lives in ``medddpm.train.parity`` and
``medddpm.sample.quality``; rows append atomically, with the run's environment beside each table.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

from medddpm.core.config import model_preset, run_config, sampling_config
from medddpm.data.labels import MASK_LABELS
from medddpm.data.nifti import pair_files
from medddpm.core.errors import InputError
from medddpm.core.io import append_csv, atomic_path, write_text_atomic
from medddpm.train.parity import FP64, denoiser_agreement, split_held_out, training_parity
from medddpm.core.runtime import env_info, resolve_device


def _pairs(a: argparse.Namespace):
    return split_held_out(pair_files(Path(a.data) / "images", Path(a.data) / "masks"), a.held_out)


def agree(a: argparse.Namespace, out: Path) -> None:
    """ε of each configuration: seeded weights on phantoms against FP64 (agreement.csv), or with
    ``--checkpoint`` its ``--weights`` (EMA by default) on the held-out subjects against ``--reference`` on the GPU
    (agreement_trained.csv: trained weights carry the biases and scales jittered ones lack)."""
    device = resolve_device(a.device)
    if not a.checkpoint:
        df = denoiser_agreement(model_preset(a.model), a.configs, a.size, device, reference=FP64)
        append_csv(out / "agreement.csv", df, env_info())
    else:
        from medddpm.train.parity import eps_agreement, held_out_triples
        from medddpm.train.checkpoint import configs_from_checkpoint, load_checkpoint

        ckpt = load_checkpoint(a.checkpoint)
        model_cfg, diff_cfg, _, _ = configs_from_checkpoint(ckpt)
        size = tuple(ckpt["config"]["size"])
        keys, x_t, mask, t, _ = held_out_triples(_pairs(a)[1], model_cfg, size, diffusion_cfg=diff_cfg)
        df = eps_agreement(model_cfg, ckpt[a.weights], a.configs, (keys.assign(size=size[0]), x_t, mask, t), device,
                           a.reference, chunk=4)
        df = df.assign(checkpoint=str(a.checkpoint), step=ckpt["step"], weights=a.weights)
        append_csv(out / "agreement_trained.csv", df, env_info(device))
    print(df.groupby("config")[["rel_l2", "max_abs", "mean_err"]].agg(["max", "mean"]).to_string())


def parity(a: argparse.Namespace, out: Path) -> None:
    device, cfg = resolve_device(a.device), model_preset(a.model)
    pairs = pair_files(Path(a.data) / "images", Path(a.data) / "masks")
    train, _ = split_held_out(pairs, a.held_out)
    for seed in a.seeds:
        for name in a.configs:
            keep = f"{name}:{seed}" in a.keep
            work = str(Path(a.work) / f"{name}-{seed}") if keep else None
            tr, ho = training_parity(pairs, cfg, name, (a.size,) * 3, device, a.steps, seed, a.lr, a.held_out,
                                     a.eval_every, work)
            env = {**env_info(device), "train_subjects": [p.subject for p in train], "lr": a.lr}
            append_csv(out / "parity_train.csv", tr, env)
            append_csv(out / "parity_heldout.csv", ho, env)
            first, last = (ho[ho["step"] == s]["loss"].mean() for s in (0, a.steps))
            print(f"{name} seed {seed}: train {tr['loss'].iloc[-50:].mean():.4f}, held-out {first:.4f} → {last:.4f}",
                  flush=True)


def split(a: argparse.Namespace) -> Path:
    """WORK/train/{images,masks}: links to the training subjects (for ``medddpm train``), and
    WORK/held_out_masks: copies of the held-out masks (for ``medddpm sample``); returns the latter."""
    train, held = _pairs(a)
    work = Path(a.work)
    for p in train:
        for kind, src in (("images", p.image), ("masks", p.mask)):
            (work / "train" / kind).mkdir(parents=True, exist_ok=True)
            (work / "train" / kind / src.name).unlink(missing_ok=True)
            (work / "train" / kind / src.name).symlink_to(src.resolve())
    masks = work / "held_out_masks"
    masks.mkdir(parents=True, exist_ok=True)
    for p in held:
        shutil.copy(p.mask, masks / p.mask.name)
    return masks


def sample(a: argparse.Namespace) -> None:
    from medddpm.sample.sampler import sample_masks

    _, held = _pairs(a)
    masks = split(a)
    device = resolve_device(a.device)
    for name in a.configs:
        sample_masks(a.checkpoint, masks, Path(a.work) / "samples" / name, device, sampler="ddim", steps=a.steps,
                     seed=0, config=name, progress=False)
        print(f"sampled {len(held)} held-out masks under {name}", flush=True)
    write_text_atomic(Path(a.work) / "samples" / "env.json", json.dumps(env_info(device), indent=2, default=str))


def compare(a: argparse.Namespace, out: Path) -> None:
    from medddpm.sample.quality import brain_histograms, brain_labels, orthogonal_slices, sample_agreement, sample_volumes

    _, held = _pairs(a)
    root = Path(a.samples)
    folders = {d.name: d for d in sorted(root.iterdir()) if d.is_dir()}
    volumes = sample_volumes(folders, held)
    labels = brain_labels(held, MASK_LABELS[a.model])
    env = {"compared_on": env_info(), "sampled_on": json.loads((root / "env.json").read_text())}
    agreement = sample_agreement(volumes, labels, a.reference)
    append_csv(out / "sample_agreement.csv", agreement, env)
    append_csv(out / "histograms.csv", brain_histograms(volumes, labels), env)
    with atomic_path(out / "slices.parquet") as tmp:
        orthogonal_slices(volumes, labels).to_parquet(tmp, index=False)
    print(agreement.groupby("source")[["psnr_db", "ssim", "mae"]].mean().round(4).to_string())


DEFAULT_RUNS = "ddpm250,ddim250-eta0,ddim250-eta1,ddim50-eta0,ddim50-eta1"  # issue 20's comparison


def samplers(a: argparse.Namespace, out: Path) -> None:
    """Every sampler run × configuration on the held-out masks of one checkpoint, each sample
    against its subject's real image (``sample_quality.sampler_table``) → samplers.csv."""
    from medddpm.sample.sampler import sample_masks
    from medddpm.sample.quality import (REAL, RUN_KEYS, SamplerRun, brain_labels, orthogonal_slices, run_agreement,
                                        sample_volumes, sampler_table)

    runs = [SamplerRun.parse(f"{spec}{f'-s{seed}' if seed else ''}-{c}") for spec in a.runs.split(",")
            for seed in a.seeds for c in a.configs]  # checked first
    _, held = _pairs(a)
    masks = split(a)
    device = resolve_device(a.device)
    folders = {}
    for run in runs:
        folder = Path(a.work) / "samplers" / run.name
        folders[run.name] = folder
        if folder.is_dir() and len(list(folder.glob("*.nii.gz"))) == len(held):
            print(f"{run.name}: kept from an earlier call", flush=True)
            continue
        shutil.rmtree(folder, ignore_errors=True)  # a partial folder is sampled again
        sample_masks(a.checkpoint, masks, folder, device, sampler=run.sampler,
                     steps=None if run.sampler == "ddpm" else run.steps, eta=1.0 if run.sampler == "ddpm" else run.eta,
                     seed=run.seed, config=run.config, progress=False, clip=run.clip)
        print(f"{run.name}: sampled {len(held)} held-out masks", flush=True)
    volumes = sample_volumes(folders, held)
    labels = brain_labels(held, MASK_LABELS[a.model])
    table = sampler_table(volumes, labels)
    append_csv(out / f"{a.name}.csv", table.assign(checkpoint=str(a.checkpoint)), env_info(device))
    if a.reference in a.configs and len(a.configs) > 1:  # each run's voxels against the reference's same run
        agreement = run_agreement(volumes, labels, a.reference)
        append_csv(out / f"{a.name}_agreement.csv", agreement.assign(checkpoint=str(a.checkpoint)), env_info(device))
        print(agreement.groupby(["sampler", "steps", "config"])[["psnr_db", "ssim"]].mean().round(3).to_string())
    if a.name == "samplers":
        first = {k: v for k, v in volumes.items() if k == REAL or SamplerRun.parse(k).seed == a.seeds[0]}
        with atomic_path(out / "sampler_slices.parquet") as tmp:  # the chapter's Fig. 1: the first seed's samples
            orthogonal_slices(first, labels).to_parquet(tmp, index=False)
    print(table.groupby(RUN_KEYS, dropna=False)[["background_mean", "brain_corr", "psnr_db", "ssim"]]
          .mean().round(3).to_string())


def gate(a: argparse.Namespace, out: Path) -> None:
    """The samplers' quality gate (``medddpm.sample.gate``): FP32 DDPM 250 over ``--seeds`` gives
    each held-out subject's band; every run × configuration of ``--runs`` passes inside it or not."""
    import os

    from medddpm.data.nifti import read_image
    from medddpm.sample.quality import REAL, brain_labels, orthogonal_slices
    from medddpm.sample.gate import REFERENCE, GateRun, gate_tables, passing, sample_runs, verdicts

    ref = GateRun(*REFERENCE)
    runs = [GateRun.parse(ref.spec, ref.config, seed) for seed in a.seeds]
    runs += [GateRun.parse(spec, c, seed) for spec in a.runs.split(",") for c in a.configs for seed in a.seeds]
    runs = list(dict.fromkeys(runs))
    _, held = _pairs(a)
    masks = split(a)
    device = resolve_device(a.device)
    folders = sample_runs(a.checkpoint, masks, Path(a.work) / "gate", runs, device)
    labels = brain_labels(held, MASK_LABELS[a.model])
    real = {p.subject: read_image(p.image)[0] for p in held}
    samples, diversity = gate_tables(folders, held, labels, real, workers=min(8, os.cpu_count() or 1))
    table = verdicts(samples, diversity)
    env = env_info(device)
    for name, df in (("sampler_gate", samples), ("sampler_diversity", diversity), ("sampler_verdicts", table)):
        append_csv(out / f"{name}.csv", df.assign(checkpoint=str(a.checkpoint)), env)
    if a.slices:  # the chapter's figure: the reference and named runs, first seed, every held-out subject
        from medddpm.sample.quality import read_sample
        from medddpm.data.nifti import strip_nifti_suffix

        chosen = [ref] + [GateRun.parse(s.split(":")[0], sampling_config(s.split(":")[-1]).name, a.seeds[0])
                          for s in a.slices.split(",")]
        missing = [r.name for r in chosen if r not in folders]
        if missing:
            raise InputError(f"--slices names runs this call did not sample: {', '.join(missing)}")
        vols = {REAL: real, **{r.spec + ":" + r.config: {p.subject: read_sample(folders[r] / f"{strip_nifti_suffix(p.mask.name)}.nii.gz")
                                                         for p in held} for r in chosen}}
        with atomic_path(out / "sampler_gate_slices.parquet") as tmp:
            orthogonal_slices(vols, labels).to_parquet(tmp, index=False)
    print(passing(table).to_string())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["agree", "parity", "split", "sample", "compare", "samplers", "gate"], help="which step")
    p.add_argument("--slices", default="", help="gate: runs (spec:config, comma-separated) whose first seed's "
                   "slices go to sampler_gate_slices.parquet beside FP32 DDPM 250's")
    p.add_argument("--runs", default=DEFAULT_RUNS, help="samplers: comma-separated ddpm250 / ddim<N>-eta<η>, "
                   "each optionally followed by -noclip")
    p.add_argument("--out", help="results folder of this GPU (tables go to OUT/quality/)")
    p.add_argument("--data", help="demo-data folder with images/ and masks/")
    p.add_argument("--held-out", type=int, default=2, help="last subjects never trained on (default 2)")
    p.add_argument("--model", default="whole-head", help="model preset")
    p.add_argument("--size", type=int, default=64, help="side of the cubic volume (default 64)")
    p.add_argument("--configs", default="baseline", help="comma-separated configurations")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (parity: training; samplers: sampling)")
    p.add_argument("--steps", type=int, default=1000, help="optimizer steps (parity) or DDIM steps (sample)")
    p.add_argument("--eval-every", type=int, default=100, help="steps between held-out evaluations (parity)")
    p.add_argument("--lr", type=float, default=1e-4, help="Adam learning rate (parity)")
    p.add_argument("--keep", default="", help="config:seed runs whose checkpoint is kept under --work (parity)")
    p.add_argument("--work", default="quality-work", help="folder for checkpoints and samples (not results)")
    p.add_argument("--checkpoint", help="checkpoint to sample from (sample)")
    p.add_argument("--weights", choices=["ema", "model"], default="ema", help="checkpoint weights (agree)")
    p.add_argument("--samples", help="folder of per-configuration sample folders (compare)")
    p.add_argument("--reference", default="baseline", help="configuration the samples are compared with")
    p.add_argument("--device", default="cuda", help="cuda or cpu")
    p.add_argument("--name", default="samplers", help="samplers: the table's name (NAME.csv; with --reference among "
                   "--configs also NAME_agreement.csv, each run's voxels against the reference's same run)")
    a = p.parse_args(argv)
    resolve = sampling_config if a.what == "gate" else run_config  # the gate samples: `fast` is its sampling variant
    a.configs = [resolve(c).name for c in a.configs.split(",")]
    a.seeds = [int(s) for s in a.seeds.split(",")]
    a.keep = set(filter(None, a.keep.split(",")))
    if not re.fullmatch(r"[A-Za-z0-9_-]+", a.name):
        p.error(f"--name must be letters, digits, '-' or '_' (a table's file name), got {a.name!r}")
    needs = {"agree": ["out"], "parity": ["out", "data"], "split": ["data"], "sample": ["data", "checkpoint"],
             "compare": ["out", "data", "samples"], "samplers": ["out", "data", "checkpoint"],
             "gate": ["out", "data", "checkpoint"]}[a.what]
    missing = [f"--{n}" for n in needs if getattr(a, n) is None]
    if missing:
        p.error(f"{a.what} needs {', '.join(missing)}")
    out = Path(a.out) / "quality" if a.out else None
    try:
        if a.what in ("split", "sample"):
            {"split": split, "sample": sample}[a.what](a)
        else:
            {"agree": agree, "parity": parity, "compare": compare, "samplers": samplers, "gate": gate}[a.what](a, out)
    except InputError as exc:
        print(f"quality.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
