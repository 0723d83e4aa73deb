"""The ``medddpm`` command line. Bad input → one line on stderr, exit code 2, no partial output."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from .core.config import (DEFAULT_ETA, DEFAULT_RECIPE, EVAL_WEIGHTS, FAST_FROM_CALLS, INTENSITIES, LR_DECAYS,
                          OPTIMIZERS, PREDICTIONS, RECIPES, SMALL_JOB, USER_CONFIGS, DataConfig, fast_from,
                          recipe_summary)
from .core.errors import InputError, MedddpmError
from .diffusion.solvers import CANDIDATE, FEW_STEP, REFERENCE, SAMPLERS, SPACINGS, denoiser_calls, resolve


def _size(values: Sequence[int] | None, default: tuple[int, int, int]) -> tuple[int, int, int]:
    if not values:
        return default
    if len(values) == 1:
        return (values[0],) * 3
    if len(values) == 3:
        return tuple(values)  # type: ignore[return-value]
    raise InputError(f"--size takes 1 or 3 numbers, got {len(values)}")


DEVICE_HELP = "cpu, cuda or cuda:N (default: cuda when PyTorch sees a GPU, else cpu)"


MASK_LABELS_HELP = ("map a parcellation's integer labels onto the model's mask channels, e.g. brain=nonzero or "
                    "brain=1-207,lesion=250 (VALUES: 'nonzero' for every label no other name takes, or integers "
                    "and ranges joined by +; 'background' maps to 0)")


# Commands whose torchrun ranks each see only their own GPU (``distributed.own_gpu_only``): sampling
# ranks exchange nothing but their checks, and share one compile cache that way. Training ranks see every
# GPU, as its scaling rows were measured (NCCL's transports between them).
OWN_GPU_COMMANDS = ("sample",)


def default_device(a: argparse.Namespace) -> None:
    """A command with ``--device`` and none given runs on the GPU when there is one."""
    if getattr(a, "device", "") is None:
        from .core import runtime

        a.device = runtime.default_device()


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


def cmd_summary(a: argparse.Namespace) -> None:
    from .core.config import model_preset
    from .net.summary import summarize

    cfg = model_preset(a.model)
    s = summarize(cfg, _size(a.size, cfg.native_size))
    if a.json:
        _print_json(s)
        return
    print(f"{s['model']}: {s['parameters']:,} parameters, {s['forward_flops']:,} forward FLOPs "
          f"at input {s['input_shape']}")
    for b in s["blocks"]:
        print(f"  {b['block']:<18} {b['layers']:<32} {str(b['out_shape']):<24} "
              f"{b['params']:>12,} params {b['flops'] / 1e9:>10.1f} GFLOP")


def cmd_phantom(a: argparse.Namespace) -> None:
    from .data.nifti import write_phantoms

    names = write_phantoms(a.out, a.n, a.size, a.seed)
    print(f"wrote {len(names)} phantom pairs to {a.out}/images and {a.out}/masks")


def cmd_demo_data(a: argparse.Namespace) -> None:
    from .data.nifti import write_mni_demo

    if a.layout == "pairs":
        if a.labels is not None:
            raise InputError("--labels applies to --layout brats and brats-per-modality")
        names = write_mni_demo(a.out, a.n, a.size, a.seed)
        print(f"wrote {len(names)} MNI152 demo pairs to {a.out}/images and {a.out}/masks")
        return
    from .data.brats import write_brats_demo

    layout = "per-modality" if a.layout == "brats-per-modality" else "per-subject"
    names = write_brats_demo(a.out, a.n, a.size, a.seed, layout, a.labels or "brats2021")
    print(f"wrote {len(names)} BraTS-shaped subjects ({layout} layout, {a.labels or 'brats2021'} labels) to {a.out}")


IXI_STEPS = 6000  # the steps prepare-ixi's printed train command gives: readme-128's, train's defaults at 128³


def cmd_prepare_ixi(a: argparse.Namespace) -> None:
    from .data.ixi import MASK_LABELS, prepare

    counts = prepare(a.root, a.out, a.size, a.val)
    print(f"wrote {sum(counts.values())} IXI subjects at {a.size}³ to {a.out} ("
          + ", ".join(f"{k} {v}" for k, v in counts.items()) + f"); train with `medddpm train --images {a.out}/dev/images "
          f"--masks {a.out}/dev/masks --held-out {counts['val']} --mask-labels {MASK_LABELS} --size {a.size} "
          f"--steps {IXI_STEPS} --out RUN` (the val subjects are dev's last; {IXI_STEPS:,} steps: where train's default "
          f"levelled at 128³, book chapter 17); sample {a.out}/val/masks; {a.out}/test is the external test set")


class OneLineParser(argparse.ArgumentParser):
    """argparse with one line for a bad option (``medddpm train: error: …``) instead of the whole usage; exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


class Exit(Exception):
    """Leave ``main`` with this exit code, printing nothing more (the cause is already printed)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _train_inputs(a: argparse.Namespace):
    """Everything ``train`` can check without decoding volumes: config, size, steps, folders, the
    held-out split; returns (model config, knobs, size, train config, run folder, training pairs,
    held-out pairs, what the data is)."""
    from dataclasses import replace

    from .core.config import DEFAULT_RECIPE, TrainConfig, from_dict, model_preset, recipe_config, run_config
    from .train.parity import split_held_out
    from .train.checkpoint import CHECKPOINT

    cfg, knobs = model_preset(a.model), run_config(a.config, training=True)
    size = _size(a.size, cfg.native_size)
    cfg.check_size(size)
    if a.steps < 1:
        raise InputError(f"--steps must be >= 1, got {a.steps}")
    out = Path(a.out)
    if a.resume and not (out / CHECKPOINT).exists():
        several = int(os.environ.get("WORLD_SIZE", "1")) > int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # nodes
        raise InputError(f"--resume: {out / CHECKPOINT} does not exist"
                         + (" on this node: rank 0 writes the run folder, so every node resuming must read it "
                            "from a filesystem they share" if several else ""))
    stored = _stored_config(out / CHECKPOINT) if a.resume else None
    given = {"lr": a.lr, "lr_warmup": a.lr_warmup, "lr_decay": a.lr_decay, "lr_final": a.lr_final,
             "min_snr_gamma": a.min_snr_gamma, "ema_decay": a.ema_decay, "batch_size": a.batch, "grad_accum": a.grad_accum,
             "save_every": a.save_every, "log_every": a.log_every, "seed": a.seed, "ema_start_step": a.ema_start,
             "held_out": a.held_out, "eval_every": a.eval_every, "eval_weights": a.eval_weights,
             "patch_size": a.patch_size, "patch_steps": a.patch_steps,
             "adam_betas": tuple(a.adam_betas) if a.adam_betas else None, "optimizer": a.optimizer,
             "posthoc_ema": tuple(a.posthoc_ema) if a.posthoc_ema else None, "posthoc_every": a.posthoc_every}
    try:
        if stored is None:
            train_cfg = recipe_config(a.recipe or DEFAULT_RECIPE, **given)
        else:  # the checkpoint's recipe and cadences, with what was given on top (Trainer.resume judges it)
            train_cfg = from_dict(TrainConfig, stored["train"])
            if a.recipe is not None and a.recipe != train_cfg.recipe:
                raise InputError(f"cannot resume {out}: it was trained with --recipe {train_cfg.recipe}, not {a.recipe}")
            train_cfg = replace(train_cfg, **{k: v for k, v in given.items() if v is not None})
    except ValueError as exc:
        raise InputError(str(exc)) from None
    for flag, value in (("--eval-every", a.eval_every), ("--eval-weights", a.eval_weights)):
        if value is not None and not train_cfg.held_out:
            raise InputError(f"{flag} needs --held-out N (the subjects whose loss is evaluated)")
    if a.posthoc_every is not None and not train_cfg.posthoc_ema:
        raise InputError("--posthoc-every needs --posthoc-ema SIGMA_REL… (the EMAs it snapshots)")
    if a.time_limit is not None and a.time_limit <= 0:
        raise InputError(f"--time-limit must be > 0 seconds, got {a.time_limit}")
    if (out / CHECKPOINT).exists() and not a.resume:
        raise InputError(f"{out} already holds a checkpoint; pass --resume to continue it or choose another --out")
    data_cfg, diffusion_cfg = _quality_configs(a, cfg.name, _stored_prediction(stored) if stored else None)
    pairs, source = _training_data(a, cfg.name)
    train, held = split_held_out(pairs, train_cfg.held_out) if train_cfg.held_out else (pairs, [])
    return cfg, knobs, size, train_cfg, out, train, tuple(held), source, data_cfg, diffusion_cfg


def _stored_config(checkpoint: Path) -> dict:
    """The configuration a checkpoint was trained under (``Trainer.config_dict``), its file checked."""
    from .train.checkpoint import load_checkpoint

    return load_checkpoint(checkpoint)["config"]


def _stored_prediction(config: dict) -> str:
    """The prediction target a checkpoint's config was trained with (one older than the option: ε)."""
    from .core.config import DiffusionConfig

    return config["diffusion"].get("prediction", DiffusionConfig().prediction)


def _quality_configs(a: argparse.Namespace, model: str, resumed: str | None = None):
    """(DataConfig, DiffusionConfig) of ``train``'s data and diffusion options, checked; without
    ``--prediction``, ``TRAIN_PREDICTION`` for a new run and the checkpoint's own (``resumed``) for
    ``--resume``."""
    from .core.config import TRAIN_PREDICTION, DiffusionConfig
    from .data.labels import parse

    labels = parse(a.mask_labels, model).spec if a.mask_labels is not None else ""
    try:
        data = DataConfig(intensity=a.intensity, mask_labels=labels,
                          **({"percentiles": tuple(a.percentiles)} if a.percentiles else {}))
        diffusion = DiffusionConfig(prediction=a.prediction or resumed or TRAIN_PREDICTION, offset_noise=a.offset_noise)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if a.percentiles and a.intensity != "percentile":
        raise InputError("--percentiles applies to --intensity percentile")
    return data, diffusion


def _training_data(a: argparse.Namespace, model: str) -> tuple[list, str]:
    """``--data ROOT`` (a BraTS root, BraTS models only) or ``--images`` and ``--masks``: the
    subjects to train on and a sentence saying what they are."""
    from .data.brats import BRATS_MODELS, find_cases
    from .data.nifti import pair_files

    if a.data is not None:
        if a.images is not None or a.masks is not None:
            raise InputError("give --data ROOT or --images and --masks, not both")
        if model not in BRATS_MODELS:
            raise InputError(f"--data reads a BraTS root, for --model {' or '.join(sorted(BRATS_MODELS))}; "
                             f"for {model!r} give --images and --masks")
        return find_cases(a.data, a.labels or "auto")
    if a.images is None or a.masks is None:
        raise InputError("give --images and --masks (paired NIfTI folders), or --data ROOT (a BraTS root)")
    if a.labels is not None:
        raise InputError("--labels applies to --data ROOT (a BraTS root)")
    pairs = pair_files(a.images, a.masks, a.id_regex)
    return pairs, f"{len(pairs)} image/mask pairs from {a.images} and {a.masks}"


def _launching(a: argparse.Namespace) -> bool:
    """Whether this command starts torchrun (``--nproc``) instead of running here; the launch
    options checked together."""
    if a.nproc is None:
        if a.nnodes is not None or a.rdzv_endpoint is not None:
            raise InputError("--nnodes and --rdzv-endpoint launch ranks: give --nproc, the ranks per machine, with them")
        return False
    if a.nproc < 1:
        raise InputError(f"--nproc must be >= 1, got {a.nproc}")
    if a.nnodes is not None and a.nnodes < 1:
        raise InputError(f"--nnodes must be >= 1, got {a.nnodes}")
    if (a.nnodes is None) != (a.rdzv_endpoint is None):
        raise InputError("--nnodes and --rdzv-endpoint go together: the machines, and where they meet")
    return True


def _launch(a: argparse.Namespace, argv: Sequence[str]) -> None:
    """``--nproc N`` (checked by ``_launching``): check the inputs here, then run this command under
    torchrun with N ranks."""
    import logging
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from .run.distributed import World, torchrun_args

    World(0, a.nproc, 0).device(a.device)  # a fixed cuda:N is refused for several ranks, as in each rank
    if a.device == "cuda":
        import torch

        if torch.cuda.device_count() < a.nproc:
            raise InputError(f"--nproc {a.nproc} needs {a.nproc} GPUs; this machine has {torch.cuda.device_count()}")
    if a.command == "train":
        _train_inputs(a)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // a.nproc)))  # CPU threads per rank
    args = torchrun_args(a.nproc, list(argv), a.nnodes, a.rdzv_endpoint, a.rdzv_id)
    if not a.quiet:
        print("running: torchrun " + " ".join(args), file=sys.stderr, flush=True)
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")]:
        logging.getLogger(name).setLevel(logging.CRITICAL)  # ranks print their own errors; torchrun's own lines add nothing
    os.environ[LAUNCHED_AS] = json.dumps(list(argv))  # the ranks' lines name the command the user typed
    try:
        run(parse_args(args))
    except SignalException as exc:  # the launcher was signalled: torchrun passed it on to the ranks, which said their line
        raise Exit(130 if exc.sigval == signal.SIGINT else 143) from None
    except ChildFailedError as exc:
        # killed by a signal: a rank lost. torchrun ends the other ranks with SIGTERM once one has failed or been lost,
        # so those are not the cause
        lost = {r: f.exitcode for r, f in exc.failures.items() if f.exitcode < 0 and f.exitcode != -signal.SIGTERM}
        if lost:
            print(f"medddpm {a.command}: error: " + _lost_line(a, lost), file=sys.stderr)
            raise Exit(1) from None
        codes = [f.exitcode for f in exc.failures.values()]
        raise Exit(next((c for c in codes if c > 0), 1)) from None


LAUNCHED_AS = "MEDDDPM_LAUNCHED_AS"  # set by --nproc for its ranks: the command as the user typed it (JSON)


def resume_command(argv: Sequence[str]) -> str:
    """The command line that continues this ``train`` run from its checkpoint (``--resume`` added once): the one the
    user typed, also in a rank that ``--nproc`` started."""
    import shlex

    argv = json.loads(os.environ[LAUNCHED_AS]) if LAUNCHED_AS in os.environ else argv
    return "medddpm " + " ".join(shlex.quote(x) for x in argv if x != "--resume") + " --resume"


def _lost_line(a: argparse.Namespace, lost: dict[int, int]) -> str:
    """One line for ranks that died by a signal (a killed process, a lost node): which, the step of the last
    checkpoint, and the command that continues from it."""
    import signal

    def name(code: int) -> str:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    ranks = ", ".join(f"rank {r} ({name(c)})" for r, c in sorted(lost.items()))
    if a.command != "train":
        return f"lost {ranks}; nothing of theirs was written under a final name; run the command again"
    from .train.checkpoint import CHECKPOINT, load_checkpoint

    try:
        held = f"{Path(a.out) / CHECKPOINT} holds step {load_checkpoint(Path(a.out) / CHECKPOINT)['step']:,}"
    except MedddpmError:
        return f"lost {ranks} before the first checkpoint; run the command again"
    return f"lost {ranks}; {held}; continue with: {resume_command(a.argv)}"


@contextlib.contextmanager
def _ranks(a: argparse.Namespace):
    """This process's place under torchrun (a world of one without it) and its device; the
    process group lives as long as the block."""
    from .run.distributed import RankError, World, lost_contact
    from .core.runtime import resolve_device

    world = World.from_env()
    device = resolve_device(world.device(a.device))
    world.init(device)
    try:
        yield world, device
    except RuntimeError as exc:  # a collective inside a step (the gradients' all-reduce) met a lost rank: one line
        if world.distributed and lost_contact(exc) and not os.environ.get("MEDDDPM_DEBUG"):
            raise RankError(f"rank {world.rank}: lost contact with the other ranks") from None
        raise
    finally:
        world.close()


@contextlib.contextmanager
def _stop_on_signals(trainer):
    """SIGTERM (a scheduler's pre-emption, torchrun's stop) and SIGINT (Ctrl-C) while ``trainer`` fits: the first asks
    it to stop at the step under way, judged and checkpointed (``Trainer.signal``); a second one a second or more
    later interrupts at once."""
    import signal
    import time

    first: list[float] = []

    def stop(signum, _frame):
        if trainer.signal is not None:
            if time.monotonic() - first[0] > 1.0:  # not the same Ctrl-C, which torchrun passes on to its ranks again
                raise KeyboardInterrupt
            return
        trainer.signal = signal.Signals(signum).name
        first.append(time.monotonic())
    before = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def cmd_train(a: argparse.Namespace) -> None:
    from .data.volumes import VolumeDataset
    from .run.engine import effective_knobs
    import pandas as pd
    import time

    from .train.checkpoint import BEST, CHECKPOINT
    from .train.timing import steady_line, timing_line
    from .train.trainer import HELDOUT, Trainer

    if _launching(a):
        return _launch(a, a.argv)

    def inputs():  # every rank checks the same inputs; a failure on any rank stops them all
        cfg, knobs, size, train_cfg, out, pairs, held, source, data_cfg, diffusion_cfg = _train_inputs(a)
        plan = Trainer.data_plan(len(pairs), cfg, effective_knobs(knobs, device, world.size), device, size)
        dataset = VolumeDataset(pairs, cfg.name, cfg.out_channels, size, keep=plan.pipeline != "none", source=source,
                                data=data_cfg)
        dataset.validate()  # every file decoded once, before training: bad input stops here
        if held:
            VolumeDataset(list(held), cfg.name, cfg.out_channels, size, data=data_cfg).validate()
        return cfg, knobs, size, train_cfg, out, dataset, plan, held, diffusion_cfg

    with _ranks(a) as (world, device):
        cfg, knobs, size, train_cfg, out, dataset, plan, held, diffusion_cfg = world.checked(inputs)
        trainer = Trainer(dataset, cfg, train_cfg, knobs, device, out, size, diffusion_cfg, world=world, data=plan,
                          held_out=held)
        try:
            if a.resume:
                world.checked(trainer.resume)
            ready = time.perf_counter() - a.started
            with _stop_on_signals(trainer):
                losses = trainer.fit(a.steps, progress=not a.quiet and world.main, time_limit_s=a.time_limit)
        finally:
            trainer.close()
    if trainer.signal is not None:
        if world.main:
            print(f"medddpm train: stopped by {trainer.signal} at step {trainer.step:,}; {out / CHECKPOINT} holds it; "
                  f"continue with: {resume_command(a.argv)}", file=sys.stderr)
        raise Exit(130 if trainer.signal == "SIGINT" else 143)
    if not world.main:
        return
    ranks = f" on {world.size} ranks (global batch {trainer.global_batch})" if world.distributed else ""
    print(f"trained to step {trainer.step}{ranks} ({recipe_summary(trainer.train_cfg)}); last loss {losses[-1]:.5f}; "
          f"checkpoint {out / CHECKPOINT}; data: {dataset.source}; input pipeline: {plan.pipeline} ({plan.reason})")
    if trainer.heldout:
        rows = pd.DataFrame(trainer.heldout)
        last = rows.query("step == step.max()")
        ema = rows.query("weights == 'ema'").groupby("step")["loss"].mean()
        print(f"held-out loss at step {int(last['step'].iloc[0])}: "
              + ", ".join(f"{w} {g['loss'].mean():.5f}" for w, g in last.groupby("weights"))
              + f" (mean over {len(held)} subjects × {last['t'].nunique()} t; {out / HELDOUT}); lowest of the EMA "
              f"{ema.min():.5f} at step {int(ema.idxmin())} ({out / BEST})")
    if trainer.stopped_early:
        print(f"stopped at step {trainer.step} of {a.steps}: --time-limit {a.time_limit:g} s reached; "
              f"continue with --resume")
    if steady := steady_line(trainer.timing(), trainer.train_cfg, out / "timing.csv"):
        print(steady)
    print(timing_line(trainer.phases, ready, a.time_limit))


def cmd_posthoc_ema(a: argparse.Namespace) -> None:
    """An EMA rebuilt after training from a run's snapshots (``train.posthoc``): with ``--images``/``--masks`` each
    width's held-out loss (the run's own held-out subjects and judge) into RUN/posthoc.csv; with ``--out`` a checkpoint
    whose EMA is the rebuilt one of the given width, or of the width judged best, for ``sample``."""
    import pandas as pd
    import torch

    from .core.io import atomic_path, write_text_atomic
    from .core.runtime import resolve_device
    from .data.nifti import pair_files
    from .train import posthoc
    from .train.checkpoint import CHECKPOINT, configs_from_checkpoint, data_config, load_checkpoint
    from .train.heldout import held_out_loss, held_out_triples, split_held_out

    run = Path(a.run)
    out = Path(a.out) if a.out else None
    if out is not None and out.exists():
        raise InputError(f"{out} exists; choose another --out (nothing is overwritten)")
    if (a.images is None) != (a.masks is None):
        raise InputError("give --images and --masks together (the run's data, whose held-out subjects judge each width)")
    if out is not None and a.images is None and len(a.sigma_rel) != 1:
        raise InputError("--out writes one EMA: give one --sigma-rel, or --images and --masks to write the best judged")
    for s in a.sigma_rel:
        try:
            posthoc.gamma_of(s)
        except ValueError as exc:
            raise InputError(f"--sigma-rel: {exc}") from None
    ckpt = load_checkpoint(run / CHECKPOINT)
    model_cfg, diffusion_cfg, train_cfg, _ = configs_from_checkpoint(ckpt)
    try:
        loaded = posthoc.load(run, a.step)
    except FileNotFoundError as exc:
        raise InputError(str(exc)) from None
    rows, kept, triples = [], None, None  # kept: (held-out loss, σ_rel, state, step) of the EMA --out writes
    if a.images is not None:
        if not train_cfg.held_out:
            raise InputError(f"{run} was trained without --held-out: it has no held-out subjects to judge on")
        held = split_held_out(pair_files(a.images, a.masks, a.id_regex), train_cfg.held_out)[1]
        size = tuple(ckpt["config"]["size"])
        triples = held_out_triples(held, model_cfg, size, diffusion_cfg=diffusion_cfg, data_cfg=data_config(ckpt))
    device = resolve_device(a.device)
    for s in a.sigma_rel:
        params, how = posthoc.reconstruct(loaded, s)
        if set(params) - set(ckpt["ema"]):
            raise InputError(f"{run}'s snapshots hold weights its checkpoint's EMA does not: {sorted(set(params) - set(ckpt['ema']))[:3]}")
        state = {**ckpt["ema"], **params}
        loss = float("nan")
        if triples is not None:
            loss = float(held_out_loss(model_cfg, state, triples, device, diffusion_cfg=diffusion_cfg)["loss"].mean())
        if out is not None and (kept is None or loss < kept[0]):
            kept = (loss, s, state, how["step"])
        rows.append({"sigma_rel": s, "step": how["step"], "snapshots": how["snapshots"], "heldout_loss": loss})
        print(f"σ_rel {s:g} at step {how['step']:,} from {how['snapshots']} snapshots"
              + (f": held-out loss {loss:.5f}" if triples is not None else ""))
    if triples is not None:  # beside the widths judged before, a width judged again at the same step replaced
        table = pd.DataFrame(rows)
        if (run / "posthoc.csv").exists():
            before = pd.read_csv(run / "posthoc.csv")
            table = pd.concat([before, table]).drop_duplicates(["sigma_rel", "step"], keep="last")
        write_text_atomic(run / "posthoc.csv", table.sort_values(["step", "sigma_rel"]).to_csv(
            index=False, lineterminator="\n", float_format="%.8g"))
    if kept is not None:
        _, best, state, step = kept
        with atomic_path(out) as tmp:
            torch.save({**ckpt, "ema": state, "posthoc_ema": {"sigma_rel": best, "step": step}}, tmp)
        print(f"wrote {out}: the EMA of σ_rel {best:g} at step {step:,}")


def warmup_configs(config: str | None, device, calls: int = REFERENCE.steps) -> list[str]:
    """The configurations ``warmup`` compiles: ``config`` where given, else every one that ``sample``
    without ``--config`` may pick on ``device`` for volumes of ``calls`` denoiser calls
    (``sampler.default_config`` of one volume and of many): on a GPU ``SMALL_JOB`` and ``fast``."""
    from .sample.sampler import default_config

    if config is not None:
        return [config]
    return list(dict.fromkeys(default_config(device, n, calls)[0] for n in (1, None)))


def cmd_warmup(a: argparse.Namespace) -> None:
    import time

    from .core.runtime import resolve_device
    from .run import cache
    from .sample.sampler import Sampler, check_options
    from .train.checkpoint import configs_from_checkpoint, load_checkpoint

    if a.batch < 1:
        raise InputError(f"--batch must be >= 1, got {a.batch}")
    device = resolve_device(a.device)
    check_options(a.sampler, a.steps, a.spacing, a.config or "fast", "ema", a.batch, None)  # the rest once the checkpoint says
    ckpt = load_checkpoint(a.checkpoint)
    diff_cfg = configs_from_checkpoint(ckpt)[1]
    _, a.sampler, a.steps, a.spacing, eta = resolve(a.sampler, a.steps, a.spacing, None, diff_cfg.prediction)
    check_options(a.sampler, a.steps, a.spacing, a.config or "fast", "ema", a.batch, eta, diff_cfg.timesteps)
    configs = warmup_configs(a.config, device, denoiser_calls(a.sampler, a.steps, diff_cfg.timesteps))
    for config in configs:
        t0 = time.perf_counter()
        sampler = Sampler(ckpt, device, config)
        size = "×".join(map(str, sampler.size))
        print(f"warmup: compiling {config} for {size}, batch {a.batch}, {a.sampler}"
              f"{'' if a.steps is None else f' {a.steps} steps'}{'' if eta == DEFAULT_ETA else f' η {eta:g}'}, "
              f"into {cache.root()} (a first compile of fast takes "
              "about a minute on an H100/H200, fast-eager's Triton kernels seconds)", file=sys.stderr, flush=True)
        path = sampler.warmup(a.batch, a.sampler, a.steps, a.spacing, eta)
        took = time.perf_counter() - t0
        if path is None or not path.exists():
            print(f"warmup: {config}: nothing to cache ({config} on {device.type} does not compile); {took:.1f} s")
        else:
            print(f"warmup: {config}: cached in {took:.1f} s: {path}")
        del sampler
    print(f"warmup: `medddpm sample --checkpoint {a.checkpoint}` of any number of masks at batch {a.batch} "
          f"({a.sampler}) now starts from these caches" if a.config is None else
          f"warmup: `medddpm sample --checkpoint {a.checkpoint} --config {a.config}` now starts from it")


def cmd_sample(a: argparse.Namespace) -> None:
    from .sample.sampler import sample_masks

    if _launching(a):
        return _launch(a, a.argv)
    with _ranks(a) as (world, device):
        written = world.checked(lambda: sample_masks(
            a.checkpoint, a.masks, a.out, device, a.sampler, a.steps, a.eta, a.seed, a.weights,
            progress=not a.quiet and world.main, config=a.config, batch=a.batch, world=world, clip=not a.no_clip,
            spacing=a.spacing, labels=a.labels or "auto", one_file=a.one_file, mask_labels=a.mask_labels,
            say=(lambda line: print(line, file=sys.stderr, flush=True)) if world.main else None, started=a.started,
            imported=a.imported))
    ranks = f" (rank {world.rank} of {world.size})" if world.distributed else ""
    print(f"wrote {len(written)} samples to {a.out}{ranks}")


def _bench_inputs(a: argparse.Namespace, training: bool):
    """Model, configurations, device and size of ``bench`` / ``bench-sample``, checked."""
    from .core.config import model_preset, run_config, sampling_config
    from .core.runtime import resolve_device

    cfg = model_preset(a.model)
    configs = [run_config(c, training) if training else sampling_config(c) for c in a.config.split(",")]
    device = resolve_device(a.device)
    size = _size(a.size, cfg.native_size)
    cfg.check_size(size)
    return cfg, configs, device, size


def _benches(a: argparse.Namespace, run_one, describe, json_row, columns: list[str] | None = None,
             what: str = "bench") -> None:
    """Run ``run_one(cfg, knobs, size, device)`` per configuration of ``--config``: append each
    row to ``--out``, print ``describe(row)``, or all rows as JSON (``json_row(result)``)."""
    from .profiling.bench import COLUMNS
    from .core.io import append_rows

    cfg, configs, device, size = _bench_inputs(a, training=what == "bench")
    results = []
    for knobs in configs:
        r = run_one(cfg, knobs, size, device)
        results.append(r)
        if a.out:
            append_rows(a.out, [r["row"]], columns or COLUMNS, what)
        if not a.json:
            print(describe(r["row"]))
    if a.json:
        _print_json([json_row(r) for r in results])


def cmd_bench(a: argparse.Namespace) -> None:
    from .profiling.bench import bench

    def forward(ms: float) -> str:  # a CUDA-graph step has no separate forward time
        return "forward —" if ms != ms else f"forward {ms:.1f} ms"

    _benches(a, lambda cfg, knobs, size, device: bench(cfg, knobs, size, device, a.steps, a.warmup, a.batch,
                                                       a.grad_accum),
             lambda row: (f"{row['gpu']} {row['config']:<16} {row['size']}: step {row['step_ms_median']:.1f} ms "
                          f"(min {row['step_ms_min']:.1f}, max {row['step_ms_max']:.1f}; {row['grad_accum']} "
                          f"micro-batch(es)), {forward(row['fwd_ms_median'])}, peak {row['peak_mem_gib']:.2f} GiB"),
             lambda r: {**r["row"], "step_ms": r["raw"]["step_ms"], "settings": r["settings"]})


def cmd_bench_sample(a: argparse.Namespace) -> None:
    from .profiling import sample_bench

    _benches(a, lambda cfg, knobs, size, device: sample_bench.bench_sample(
                 cfg, knobs, size, device, a.sampler, a.steps, a.batch, a.repeats, a.seed, eta=a.eta, spacing=a.spacing),
             lambda row: (f"{row['gpu']} {row['config']:<16} {row['size']} {row['sampler']} {row['steps']} steps"
                          f"{' (' + row['spacing'] + ')' if row['spacing'] else ''}, "
                          f"batch {row['batch']}: {row['s_per_volume_median']:.3f} s/volume (min "
                          f"{row['s_per_volume_min']:.3f}, max {row['s_per_volume_max']:.3f}), peak "
                          f"{row['peak_mem_gib']:.2f} GiB"),
             lambda r: {**r["row"], "s_per_volume": r["raw"]["s_per_volume"]},
             sample_bench.COLUMNS, "sample_bench")


def cmd_configs(a: argparse.Namespace) -> None:
    import pandas as pd

    from .core.config import CONFIGS, USER_CONFIGS, describe

    names = list(dict.fromkeys([*USER_CONFIGS, *CONFIGS])) if a.all else list(USER_CONFIGS)
    rows = pd.DataFrame([describe(n) for n in names])
    if a.json:
        _print_json(rows.to_dict("records"))
        return
    cols = list(rows.columns)
    width = {c: max(len(c), int(rows[c].str.len().max())) for c in cols[:-1]}
    for line in [dict(zip(cols, cols)), *rows.to_dict("records")]:
        print("  ".join(str(line[c]).ljust(width[c]) for c in cols[:-1]) + "  " + line[cols[-1]])
    if not a.all:
        print(f"\n{len(CONFIGS) - len(USER_CONFIGS) + 1} more (the book's ablation rungs and levers): medddpm configs --all")


def cmd_info(a: argparse.Namespace) -> None:
    from .core.runtime import env_info

    info = env_info()
    if a.json:
        _print_json(info)
    else:
        for k, v in info.items():
            print(f"{k}: {v}")


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="medddpm", description="Med-DDPM: train, sample, time and profile.")
    sub = p.add_subparsers(dest="command", required=True)
    from .core.config import describe

    more = " (a table: medddpm configs; the book's ablation rungs: medddpm configs --all)"
    configs = "; ".join(f"{n} = {d}" for n, d in USER_CONFIGS.items()) + more
    train_configs = "; ".join(f"{n} = {d}" for n, d in USER_CONFIGS.items() if describe(n)["use"] != "sample") + more
    model_help = "model preset: whole-head (the paper's), brats, or tiny and brats-tiny (tests, demos)"
    recipes_help = "; ".join(f"{n} = " + ", ".join(f"{k} {v}" for k, v in r.items()) for n, r in RECIPES.items())

    s = sub.add_parser("summary", help="parameters, forward FLOPs and shapes of a model preset")
    s.add_argument("--model", default="whole-head", help=model_help)
    s.add_argument("--size", type=int, nargs="+", metavar="N", help="1 or 3 sides (default: the preset's)")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.set_defaults(func=cmd_summary)

    from .data.brats import LABELS

    labels_help = ("a BraTS segmentation's labels: brats2021 (1 NCR, 2 ED, 4 ET), brats2023 (3 ET) or reference "
                   "(3 ET, 4 healthy brain)")
    s = sub.add_parser("prepare-ixi", help="IXI T1 scans with their DLMUSE parcellations (NiChart's "
                       "test_data/processed/IXI) as image/mask pairs at SIZE³, split train/val/test by IXI ID")
    s.add_argument("--root", required=True, help="the IXI folder holding Nifti/T1 and DLMUSE")
    s.add_argument("--out", required=True, help="folder to create: OUT/{train,val,test}/{images,masks}, OUT/split.csv")
    s.add_argument("--size", type=int, default=64, help="side of the cubic volumes (default 64)")
    s.add_argument("--val", type=int, default=16, help="validation subjects: the last IDs below 500 (default 16); "
                   "IDs from 500 on are the external test set")
    s.set_defaults(func=cmd_prepare_ixi)

    for name, func, what in (("phantom", cmd_phantom, "seeded head phantoms as NIfTI image/mask pairs"),
                             ("demo-data", cmd_demo_data, "MNI152 demo subjects with lesions (image/mask pairs) "
                              "or, with --layout brats, BraTS-shaped subjects with tumours")):
        s = sub.add_parser(name, help=f"write {what}")
        s.add_argument("--out", required=True, help="folder to create; gets images/ and masks/ (or a BraTS root)")
        s.add_argument("--n", type=int, default=4, help="number of subjects")
        s.add_argument("--size", type=int, default=32, help="side of the cubic volumes, in voxels (BraTS layouts: "
                       "the 240 × 240 × 155 grid scaled to this first side)")
        s.add_argument("--seed", type=int, default=0, help="random seed")
        if name == "demo-data":
            s.add_argument("--layout", default="pairs", choices=("pairs", "brats", "brats-per-modality"),
                           help="images/ + masks/ pairs, a BraTS root as downloaded (ROOT/<subject>/<subject>_<role>"
                           ".nii.gz) or the reference repository's (ROOT/<role>/<subject>_<role>.nii.gz)")
            s.add_argument("--labels", choices=tuple(LABELS), help=f"{labels_help} (default brats2021; brats2023 "
                           "also names files as BraTS 2023: -t1n, -t1c, -t2w, -t2f)")
        s.set_defaults(func=func)

    def launch_options(s: argparse.ArgumentParser) -> None:
        """Several machines: the same command on every node, torchrun's c10d rendezvous."""
        s.add_argument("--nnodes", type=int, help="with --nproc: the number of machines; run the same command on "
                       "each (torchrun --nnodes N --nproc-per-node NPROC --rdzv-backend c10d …)")
        s.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="with --nnodes: the rendezvous address, a "
                       "host every node reaches (the first node's; it hosts the store)")
        s.add_argument("--rdzv-id", default="medddpm", help="with --nnodes: the job's rendezvous ID (default medddpm)")

    s = sub.add_parser("train", help="train on NIfTI image/mask folders or a BraTS root")
    s.add_argument("--images", help="folder of image NIfTI files")
    s.add_argument("--masks", help="folder of mask NIfTI files, paired by subject ID")
    s.add_argument("--data", metavar="ROOT", help="a BraTS root as downloaded or as the reference repository keeps "
                   "it (--model brats; instead of --images and --masks): four modalities and a segmentation "
                   "per subject, cropped or padded to the preset's window")
    s.add_argument("--labels", choices=("auto", *LABELS), help=f"{labels_help}; auto (default) detects them and "
                   "says which rule it used")
    s.add_argument("--model", default="whole-head", help=model_help)
    s.add_argument("--config", default="baseline", help=f"run configuration, one of: {train_configs}")
    s.add_argument("--steps", type=int, required=True, help="total optimizer steps to reach")
    s.add_argument("--out", required=True, help="run folder (checkpoint.pt, log.csv, timing.csv)")
    s.add_argument("--size", type=int, nargs="+", metavar="N", help="1 or 3 sides to resize to (default: the preset's)")
    s.add_argument("--device", help=DEVICE_HELP)
    s.add_argument("--resume", action="store_true", help="continue the checkpoint in --out")
    s.add_argument("--recipe", choices=list(RECIPES), help=f"the optimisation recipe (default {DEFAULT_RECIPE}; "
                   f"paper is Med-DDPM's): {recipes_help}; the flags below override its values; --resume keeps the "
                   "checkpoint's")
    s.add_argument("--lr", type=float, help="the (peak) learning rate, Adam's and Muon's alike (default: the recipe's)")
    s.add_argument("--lr-warmup", type=int, metavar="STEPS", help="linear warm-up steps (default: the recipe's)")
    s.add_argument("--lr-decay", choices=list(LR_DECAYS), help="after the warm-up: constant, or a cosine to "
                   "--lr-final × lr at the last step (--steps, or where --time-limit ends) (default: the recipe's)")
    s.add_argument("--lr-final", type=float, metavar="FRACTION", help="with --lr-decay cosine: the last step's rate "
                   "as a fraction of --lr (default: the recipe's)")
    s.add_argument("--min-snr-gamma", type=float, metavar="GAMMA", help="Min-SNR-γ loss weighting (Hang et al. 2023; "
                   "0 = unweighted) (default: the recipe's)")
    s.add_argument("--ema-decay", type=float, help="decay of the weights' EMA (default: the recipe's)")
    s.add_argument("--adam-betas", type=float, nargs=2, metavar=("B1", "B2"), help="Adam's β1 and β2 "
                   "(default: the recipe's: 0.9 0.999)")
    s.add_argument("--optimizer", choices=list(OPTIMIZERS), help="adam, or muon: the U-Net's hidden weight matrices "
                   "by Muon (orthogonalized momentum at Adam's update size, so the same --lr), the rest by Adam "
                   f"(default: the recipe's: {RECIPES[DEFAULT_RECIPE]['optimizer']} for {DEFAULT_RECIPE})")
    s.add_argument("--patch-size", type=int, metavar="N", help="a curriculum (Patch Diffusion, Wang et al. 2023): the "
                   "first --patch-steps steps train on random N³ cubes of each volume and its mask, whole volumes after "
                   "(the held-out loss is always judged on whole volumes) (default: the recipe's: none)")
    s.add_argument("--patch-steps", type=int, metavar="STEPS", help="with --patch-size: the steps on patches "
                   "(default: the recipe's)")
    s.add_argument("--posthoc-ema", type=float, nargs="+", metavar="SIGMA_REL", help="keep power-function EMAs of "
                   "these relative widths (Karras et al. 2024: 0.05 0.10) and snapshot them every --posthoc-every steps "
                   "into OUT/posthoc/, for `medddpm posthoc-ema` to rebuild an EMA of any width (default: none)")
    s.add_argument("--posthoc-every", type=int, metavar="STEPS", help="with --posthoc-ema: steps between snapshots "
                   "(default 1000)")
    s.add_argument("--batch", type=int, help="volumes per micro-batch on each GPU (default 1, the paper's); the global "
                   "batch is GPUs × --batch × --grad-accum")
    s.add_argument("--grad-accum", type=int, help="micro-batches per optimizer step (default 2)")
    s.add_argument("--save-every", type=int, help="checkpoint period in steps (default 1000)")
    s.add_argument("--log-every", type=int, help="steps between loss read-backs and NaN checks (default 50)")
    s.add_argument("--ema-start", type=int, help="step from which the EMA averages (default: the recipe's)")
    s.add_argument("--seed", type=int, help="random seed (default 0)")
    s.add_argument("--held-out", type=int, help="last N subjects (in subject order) never trained on: "
                   "their denoising loss is evaluated every --eval-every steps into heldout.csv (default 0)")
    s.add_argument("--eval-every", type=int, help="steps between held-out loss evaluations (default 1000)")
    s.add_argument("--eval-weights", choices=list(EVAL_WEIGHTS), help="whose held-out loss: the EMA's (default: "
                   "the weights sampled and best.pt's choice) or both, the raw model's too (twice the evaluation time)")
    s.add_argument("--time-limit", type=float, metavar="SECONDS", help="stop (checkpointed) at the first loss "
                   "read-back after this many seconds, leaving a held-out evaluation due there to the resumed run; "
                   "--resume continues exactly")
    s.add_argument("--id-regex", help="regex whose first group is the subject ID in file names")
    s.add_argument("--mask-labels", metavar="NAME=VALUES,…", help=MASK_LABELS_HELP + "; kept in the checkpoint, "
                   "which sample reuses")
    s.add_argument("--intensity", default="minmax", choices=INTENSITIES, help="each image to [-1, 1]: minmax (the "
                   "reference) or percentile (the --percentiles mapped to ±1 and clipped: one bright voxel no longer "
                   "sets the scale)")
    s.add_argument("--percentiles", type=float, nargs=2, metavar=("LOW", "HIGH"), help="with --intensity "
                   f"percentile (default {DataConfig().percentiles[0]:g} {DataConfig().percentiles[1]:g})")
    s.add_argument("--prediction", choices=PREDICTIONS, help="the network predicts v = sqrt(abar) eps - sqrt(1 - abar) "
                   "x0 (Salimans & Ho 2022; the default: right on real brains, book chapter 14) or the noise: eps, the "
                   "paper's reference recipe; --resume keeps the checkpoint's")
    s.add_argument("--offset-noise", type=float, default=0.0, metavar="S", help="training noise plus S times one "
                   "N(0,1) number per volume (offset noise, Guttenberg 2023; default 0, the reference)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--nproc", type=int, help="launch N ranks with torchrun on this machine "
                   "(the same as `torchrun --standalone --nproc-per-node N -m medddpm train …`)")
    launch_options(s)
    s.set_defaults(func=cmd_train)

    s = sub.add_parser("posthoc-ema", help="rebuild a run's EMA of another width from its --posthoc-ema snapshots "
                       "(Karras et al. 2024), judge each on the run's held-out subjects, write one as a checkpoint")
    s.add_argument("--run", required=True, help="a train --out folder whose run kept --posthoc-ema snapshots")
    s.add_argument("--sigma-rel", type=float, nargs="+", required=True, metavar="S", help="relative widths to rebuild "
                   "(in (0, 0.289); train's EMA, 0.99 every 10 steps, is about 0.10 at step 10,000 and 0.18 at 5,000)")
    s.add_argument("--step", type=int, help="rebuild at the newest snapshot at or before this step (default: the newest)")
    s.add_argument("--images", help="the run's image folder: with --masks, each width is judged on its held-out subjects")
    s.add_argument("--masks", help="the run's mask folder")
    s.add_argument("--id-regex", help="regex whose first group is the subject ID in file names (as train's)")
    s.add_argument("--out", help="write a checkpoint whose EMA is the given width's (or the best judged one's)")
    s.add_argument("--device", help=DEVICE_HELP)
    s.set_defaults(func=cmd_posthoc_ema)

    s = sub.add_parser("sample", help="generate one image per mask with a checkpoint")
    s.add_argument("--checkpoint", required=True, help="a checkpoint.pt written by train")
    s.add_argument("--masks", required=True, help="folder of mask NIfTI files, or for a BraTS model a BraTS root "
                   "(its segmentations; its modalities, where there, give the healthy brain)")
    s.add_argument("--out", required=True, help="folder for the generated NIfTI files (must not hold them yet); from a "
                   "BraTS root: OUT/<subject>/<subject>_{t1,t1ce,t2,flair}.nii.gz in the segmentation's space")
    s.add_argument("--labels", choices=("auto", *LABELS), help=f"{labels_help}; auto (default) detects them")
    s.add_argument("--one-file", action="store_true", help="from a BraTS root: one 4-D OUT/<subject>.nii.gz per "
                   "subject instead of a folder of four")
    s.add_argument("--mask-labels", metavar="NAME=VALUES,…", help=MASK_LABELS_HELP + " (default: the map the "
                   "checkpoint was trained with)")
    s.add_argument("--sampler", choices=SAMPLERS,
                   help=f"ancestral DDPM, DDIM or a few-step solver (default, and the command says so: {REFERENCE.describe()}, "
                   f"{REFERENCE.why}; the {CANDIDATE.steps}-call chain {CANDIDATE.describe()} is --sampler "
                   f"{CANDIDATE.sampler} --steps {CANDIDATE.steps} --spacing {CANDIDATE.spacing} --eta {CANDIDATE.eta:g}, "
                   f"{CANDIDATE.why})")
    s.add_argument("--steps", type=int, help="denoising steps (default: the default sampler's; all timesteps for ddpm "
                   f"and ddim, {FEW_STEP.steps} for a few-step solver)")
    s.add_argument("--spacing", choices=SPACINGS, help="a few-step solver's timesteps: uniform in time, in log-SNR "
                   f"or quadratic in time (default {FEW_STEP.spacing})")
    s.add_argument("--eta", type=float, help=f"noise scale of ddim and of the -sde solvers (0 = deterministic, 1 = "
                   f"DDPM's noise; default "
                   f"{DEFAULT_ETA:g}: at 0 the trained model's samples lose in-brain agreement); the other samplers take none")
    s.add_argument("--seed", type=int, default=0, help="random seed")
    s.add_argument("--weights", default="ema", choices=["ema", "model"], help="EMA or raw weights")
    s.add_argument("--no-clip", action="store_true", help="do not clip the predicted x̂₀ to [-1, 1] at each step "
                   "(DDPM Alg. 2 as published; the default clips, as the reference implementation does)")
    s.add_argument("--device", help=DEVICE_HELP)
    s.add_argument("--config", help=f"run configuration of the denoiser (default: on a CPU baseline; on a GPU fast from "
                   f"{FAST_FROM_CALLS} denoiser calls on (masks × calls a mask: {fast_from(REFERENCE.steps)} masks of "
                   f"DDPM {REFERENCE.steps}, {fast_from(CANDIDATE.steps)} of the {CANDIDATE.steps}-call chain), where its "
                   f"compilation pays off even with a cold cache, else {SMALL_JOB} (fast's sampler, not compiled), which is "
                   "done first; the rule reads only the command, so a command always writes the same files); "
                   f"one of: {configs}")
    s.add_argument("--batch", type=int, default=1, help="masks sampled together in one batch")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--nproc", type=int, help="launch N ranks with torchrun, each sampling its share of the masks")
    launch_options(s)
    s.set_defaults(func=cmd_sample)

    s = sub.add_parser("warmup", help="compile a checkpoint's sampler once into the compile cache (MEDDDPM_CACHE, "
                       "default ~/.cache/medddpm), so later `sample` commands start from it")
    s.add_argument("--checkpoint", required=True, help="a checkpoint.pt written by train")
    s.add_argument("--config", help=f"the one run configuration to compile (default: every one that sample may pick: "
                   f"on a GPU {SMALL_JOB} for small jobs and fast for large ones)")
    s.add_argument("--batch", type=int, default=1, help="masks per batch the later commands will use (default 1)")
    s.add_argument("--sampler", choices=SAMPLERS,
                   help="the sampler the later commands will use (default: sample's for this checkpoint)")
    s.add_argument("--steps", type=int, help="its steps, as sample takes them")
    s.add_argument("--spacing", choices=SPACINGS, help="a few-step solver's spacing, as sample takes it")
    s.add_argument("--device", help=DEVICE_HELP)
    s.set_defaults(func=cmd_warmup)

    def bench_parser(name: str, what: str, default: str, csv: str, per_run: str):
        """The options ``bench`` and ``bench-sample`` share (their --model/--config/--size/--device/--json/--out)."""
        s = sub.add_parser(name, help=what)
        s.add_argument("--model", default="whole-head", help=model_help)
        s.add_argument("--config", default=default, help=f"one or more, comma-separated, of: {configs}")
        s.add_argument("--size", type=int, nargs="+", metavar="N", help="1 or 3 sides (default: the preset's)")
        s.add_argument("--device", help=DEVICE_HELP)
        s.add_argument("--json", action="store_true", help=f"print JSON rows with every {per_run}")
        s.add_argument("--out", help=f"CSV to append rows to, e.g. data/results/<gpu>/{csv}")
        return s

    s = bench_parser("bench", "time training steps per configuration", "baseline", "bench.csv", "step time")
    s.add_argument("--batch", type=int, default=1, help="volumes per micro-batch")
    s.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step (the training loop's --grad-accum)")
    s.add_argument("--steps", type=int, default=10, help="timed steps")
    s.add_argument("--warmup", type=int, default=5, help="untimed steps first (compile, autotune, graph capture)")
    s.set_defaults(func=cmd_bench)

    s = bench_parser("bench-sample", "time the sampling of whole volumes per configuration (fast, fast-fp8 or any)", "fast",
                     "sample_bench.csv", "repeat's time")
    s.add_argument("--sampler", default="ddim", choices=SAMPLERS, help="ancestral DDPM (all T steps), DDIM or a "
                   "few-step solver")
    s.add_argument("--steps", type=int, help="denoising steps (default: all timesteps)")
    s.add_argument("--spacing", choices=SPACINGS, help="a few-step solver's timesteps (default logsnr)")
    s.add_argument("--batch", type=int, default=1, help="volumes sampled together; times are per volume")
    s.add_argument("--repeats", type=int, default=3, help="timed runs after one untimed warm-up run")
    s.add_argument("--eta", type=float, default=DEFAULT_ETA, help=f"noise scale of ddim and the -sde solvers (default {DEFAULT_ETA:g}, as `sample`)")
    s.add_argument("--seed", type=int, default=0, help="seed of the weights, masks and noise")
    s.set_defaults(func=cmd_bench_sample)

    s = sub.add_parser("configs", help="the run configurations: what each does, train or sample, on a CPU")
    s.add_argument("--all", action="store_true", help="also the book's ablation rungs and levers")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_configs)

    s = sub.add_parser("info", help="torch/CUDA/cuDNN versions, GPU properties, TF32 settings")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_info)

    from .profiling.cli import add_profiling_commands

    add_profiling_commands(sub)
    return p



def _terminate(_signum, _frame):  # SIGTERM (e.g. `timeout`) → clean-up paths run as for Ctrl-C
    raise KeyboardInterrupt


def _pipe_closed() -> int:
    """stdout pointed at /dev/null (so no later write or flush fails again), and 141: a shell's code for SIGPIPE."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141


def main(argv: Sequence[str] | None = None) -> int:
    import signal
    import time

    from .core.runtime import process_start

    clock = time.perf_counter()  # the command line is read from here on
    origin = process_start()  # `sample`'s timing line counts from the process's start (else from here)

    signal.signal(signal.SIGTERM, _terminate)
    p = parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:  # argparse already printed one usage line; keep its exit code 2
        return int(exc.code or 0)
    args.argv, args.started = argv, clock if origin is None else origin
    args.imported = None if origin is None else clock  # the interpreter started and the imports done
    if args.command in OWN_GPU_COMMANDS and (getattr(args, "device", None) or "cuda").startswith("cuda"):
        from .run.distributed import own_gpu_only

        own_gpu_only()  # before anything starts CUDA
    default_device(args)
    try:
        args.func(args)
    except Exit as exc:
        return exc.code
    except BrokenPipeError:  # a reader that closed the pipe early (`medddpm … | head -1`): quietly, as a shell would
        return _pipe_closed()
    except (MedddpmError, ValueError, OSError) as exc:  # OSError: a full disk, a read-only or missing folder
        if os.environ.get("MEDDDPM_DEBUG"):
            raise
        if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for every rank
            print(f"medddpm {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"medddpm {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


def run() -> None:
    """The ``medddpm`` command (``python -m medddpm`` and the console script): ``main``, then, where
    it succeeded and nothing was compiled by Inductor (whose worker processes Python's exit shuts down), the process
    ends at once with main's exit code, its output flushed (``os._exit``): every file is written and
    closed by then, and Python's and CUDA's tear-down would add about 0.7 s to a one-volume
    ``sample`` (H100, ``time_to_result/``), time a user waits for nothing."""
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left before the last lines: quietly, as in main
        code = code or _pipe_closed()
    sys.stderr.flush()
    if "torch._inductor" in sys.modules or code != 0:  # a failure or an interrupt: writer threads finish or clean up
        sys.exit(code)
    os._exit(code)


if __name__ == "__main__":
    run()
