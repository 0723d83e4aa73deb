"""Training Med-DDPM (paper §3.2): Adam, gradient accumulation, EMA, atomic checkpoints, exact
resume, one process or several (torchrun + DDP). The step itself (and every speed knob) comes
from ``medddpm.run.engine``.

The loop never waits for the GPU inside a step: losses stay in a device buffer and are read back
every ``TrainConfig.log_every`` steps and before each checkpoint, when the NaN check runs.

Every micro-batch is a numbered *draw* (``distributed.World.draw``): the draw number picks the
subject (a seeded permutation per epoch) and seeds the generator of its diffusion time and noise.
So the run does not depend on how draws are split over processes: two ranks with
``grad_accum`` 1 train exactly what one process with ``grad_accum`` 2 trains. With several ranks
the model, optimizer and EMA are identical on every rank (DDP averages the gradients; every rank
updates its own EMA from the same weights); rank 0 alone writes files."""
from __future__ import annotations

import copy
import csv
import io
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..data import patches, pipeline
from ..core.config import (EVAL_WEIGHTS, PIPELINE_KNOBS, DataConfig, DiffusionConfig, Knobs, ModelConfig, TrainConfig,
                           from_dict)
from ..run.distributed import World, draw_seed
from ..run.engine import Engine
from ..run.optim import set_lr
from ..core.errors import DivergedError, InputError
from ..data.nifti import Pair
from ..core.io import atomic_path, write_text_atomic
from .checkpoint import BEST, CHECKPOINT, load_checkpoint
from . import posthoc
from .heldout import Evaluator, held_out_triples

HELDOUT = "heldout.csv"  # held-out loss per (step, weights, subject, t), beside log.csv
HELDOUT_COLUMNS = ["step", "weights", "subject", "t", "loss", "seconds"]  # seconds: the run's training clock at the
# evaluation (its fits' wall time less their held-out evaluations: what a time to a target counts)
RESUMABLE = ("log_every", "save_every", "eval_every", "eval_weights", "posthoc_every")  # TrainConfig fields --resume may change: cadences
# and what is judged, never what is trained (--steps, --time-limit and --quiet are no config)


@torch.no_grad()
def ema_update(ema: list[Tensor], params: list[Tensor], decay: float) -> None:
    """ema ← decay·ema + (1 − decay)·params, one fused multi-tensor op (no host loop)."""
    torch._foreach_lerp_(ema, params, 1 - decay)


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def sample_order(n: int, seed: int, micro_batch: int) -> int:
    """Dataset index of the ``micro_batch``-th draw: a fresh seeded permutation every epoch."""
    epoch, pos = divmod(micro_batch, n)
    return int(np.random.default_rng([seed, epoch]).permutation(n)[pos])


def _linked(source: Path, target: Path) -> bool:
    """``target`` replaced by a hard link to ``source``; False where the file system has none."""
    try:
        target.unlink(missing_ok=True)
        os.link(source, target)
        return True
    except OSError:
        return False


def _difference(key: str, stored: Any, mine: Any) -> str:
    """One line saying how a checkpoint's ``key`` config differs from this run's: another
    configuration by its name and the flag to resume it with, else the fields that differ."""
    if key == "knobs" and stored.get("name") != mine.get("name"):
        return (f"it was trained with --config {stored.get('name')}, not {mine.get('name')}; resume with "
                f"--config {stored.get('name')}, or start a new --out")
    if not isinstance(stored, dict):
        return f"its {key} {stored} differs from {mine}"
    fields = ", ".join(f"{k} {stored.get(k)!r} → {mine.get(k)!r}" for k in sorted({*stored, *mine})
                       if stored.get(k) != mine.get(k))
    return f"its {key} config differs ({fields})"


def _normalized(config: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's config with today's defaults for fields it predates, JSON-comparable; the
    input-pipeline knobs are left out (they never change what is trained)."""
    kinds = {"model": ModelConfig, "diffusion": DiffusionConfig, "train": TrainConfig, "knobs": Knobs,
             "data_config": DataConfig}
    out = {k: asdict(from_dict(cls, config.get(k, {}))) for k, cls in kinds.items()}
    out["knobs"] = {k: v for k, v in out["knobs"].items() if k not in PIPELINE_KNOBS}
    return json.loads(json.dumps({**out, "size": list(config["size"])}))  # world_size: checked apart


class Trainer:
    """Optimises a ``GaussianDiffusion`` on a dataset of (image, mask) pairs.

    One *step* is one optimizer step over ``grad_accum`` micro-batches of ``batch_size`` volumes
    (paper §3.2). Checkpoints hold ``{step, model, ema, optimizer, config, rng, losses, heldout}``.
    With ``held_out`` subjects (``TrainConfig.held_out`` of them, never in ``dataset``) the held-out
    loss of the model's and the EMA's weights is evaluated every ``eval_every`` steps (``evaluate``).
    ``knobs.data_cache`` picks the input pipeline (``medddpm.data.pipeline``; ``data`` is its resolved
    plan): decoded volumes on the GPU, in pinned host memory, or decoded ahead by loader workers, so
    no NIfTI decode and no synchronous copy sits on the critical path.
    """

    def __init__(self, dataset, model_cfg: ModelConfig, train_cfg: TrainConfig, knobs: Knobs,
                 device: torch.device, out: str | Path, size: tuple[int, int, int],
                 diffusion_cfg: DiffusionConfig = DiffusionConfig(), world: World = World(),
                 data: pipeline.Plan | None = None, held_out: tuple[Pair, ...] = ()) -> None:
        if len(held_out) != train_cfg.held_out:
            raise ValueError(f"train_cfg.held_out is {train_cfg.held_out} but {len(held_out)} held-out pairs were given")
        self.dataset, self.device, self.out, self.world = dataset, device, Path(out), world
        self.data_cfg = getattr(dataset, "data_config", DataConfig())  # how its files became tensors
        self.held_out, self._triples = tuple(held_out), None
        self._evaluator: Evaluator | None = None  # the FP32 judge of the held-out loss, built at the first evaluation
        self.heldout: list[dict[str, Any]] = []  # evaluate()'s rows, kept in the checkpoint
        self.stopped_early = False  # fit() stopped before its last step: its time limit, or a signal
        self.signal: str | None = None  # set by a signal handler (cli's train: SIGTERM, SIGINT): fit stops, judged and saved
        self._last_eval: int | None = None  # the step of the latest held-out evaluation (every rank)
        self._written: tuple[tuple[int, int, int], Path] | None = None  # the last checkpoint file and what it holds
        self.model_cfg, self.train_cfg, self.knobs, self.diffusion_cfg = model_cfg, train_cfg, knobs, diffusion_cfg
        self.size = tuple(size)
        model_cfg.check_size(self.size)
        if train_cfg.patch_size:
            p = train_cfg.patch_size
            if any(p > s for s in self.size):
                raise InputError(f"--patch-size {p} is larger than the training size {self.size}")
            try:
                model_cfg.check_size((p,) * 3)
            except ValueError as exc:
                raise InputError(f"--patch-size {p}: {exc}") from None
        torch.manual_seed(train_cfg.seed)
        np.random.seed(train_cfg.seed)
        random.seed(train_cfg.seed)
        self.engine = Engine(model_cfg, knobs, device, diffusion_cfg, lr=train_cfg.lr, world_size=world.size,
                             betas=train_cfg.adam_betas, optimizer=train_cfg.optimizer)
        self.model, self.diffusion, self.optimizer = self.engine.model, self.engine.diffusion, self.engine.optimizer
        if train_cfg.min_snr_gamma > 0:
            self.engine.train_step.loss_weights = self.diffusion.min_snr_weights(train_cfg.min_snr_gamma).to(device)
        self._agreed_stop = False  # several ranks: whether the last read-back agreed that a rank was signalled
        self._steps = 0  # the run's last step (fit's ``steps``): where the rate's decay ends
        self._fit_start: float | None = None  # perf_counter() at fit's start
        self._clock_before = 0.0  # training-clock seconds of the fits before this one (``resume``)
        self.ema = copy.deepcopy(self.model).requires_grad_(False)
        self._params = list(self.model.parameters())
        self._ema_params = list(self.ema.parameters())
        self.posthoc = (posthoc.PowerEMAs([(n, p) for (n, _), p in zip(self.ema.named_parameters(), self._params)],
                                          train_cfg.posthoc_ema) if train_cfg.posthoc_ema else None)  # names as the EMA's
        self.step = 0
        self.losses: list[float] = []  # read back from the device; ``_pending`` holds the rest
        self._pending: list[Tensor] = []
        self._clock: list[tuple[int, float]] = []  # (step, seconds) at each read-back: a synced clock
        self.phases: dict[str, float] = {}  # the last fit()'s seconds by phase, and each phase's count ('<phase> n')
        self.data = data if data is not None else self.data_plan(len(dataset), model_cfg, self.engine.knobs, device,
                                                                  self.size)
        self._volumes = pipeline.stack_cache(dataset, self.data, self.engine.to_device)
        self._feed: pipeline.Feed | None = None
        self._gen = torch.Generator(device)

    @staticmethod
    def data_plan(subjects: int, model_cfg: ModelConfig, knobs: Knobs, device: torch.device,
                  size: tuple[int, ...]) -> pipeline.Plan:
        """The input pipeline ``knobs.data_cache`` resolves to for ``subjects`` volumes of ``size``
        (``pipeline.plan``; image + mask channels are the model's input channels)."""
        return pipeline.plan(knobs.data_cache, subjects, model_cfg.in_channels, size, device)

    # ---- persistence --------------------------------------------------------------------------
    @property
    def global_batch(self) -> int:
        """Volumes per optimizer step over all ranks: world × micro-batch × grad-accum."""
        return self.world.size * self.train_cfg.batch_size * self.train_cfg.grad_accum

    def config_dict(self) -> dict[str, Any]:
        return {"model": asdict(self.model_cfg), "diffusion": asdict(self.diffusion_cfg),
                "train": asdict(self.train_cfg), "knobs": asdict(self.knobs), "size": list(self.size),
                "world_size": self.world.size, "global_batch": self.global_batch, "data": self.data.asdict(),
                "data_config": asdict(self.data_cfg),
                "source": getattr(self.dataset, "source", "")}

    def save(self) -> Path:
        """Write ``checkpoint.pt`` and ``log.csv`` atomically (temp file + rename), after the
        pending losses passed the NaN check; every rank calls this, rank 0 alone writes."""
        self.flush()
        path = self.out / CHECKPOINT
        if not self.world.main:
            return path
        self._write_checkpoint(path)
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["step", "loss", "global_batch", "data"])
        writer.writerows((i + 1, f"{loss:.8g}", self.global_batch, self.data.pipeline)
                         for i, loss in enumerate(self.losses))
        write_text_atomic(self.out / "log.csv", buf.getvalue())
        write_text_atomic(self.out / "timing.csv", self.timing().to_csv(index=False, lineterminator="\n"))
        if self.held_out:
            write_text_atomic(self.out / HELDOUT, pd.DataFrame(self.heldout, columns=HELDOUT_COLUMNS)
                              .to_csv(index=False, lineterminator="\n", float_format="%.8g"))
        return path

    def _write_checkpoint(self, path: Path) -> None:
        """This step's checkpoint to ``path``, atomically. Where ``best.pt`` and ``checkpoint.pt`` fall
        on one step (``eval_every`` and ``save_every`` alike by default), the second is a hard link to
        the first: one serialization of the weights, the EMA's and Adam's moments, not two."""
        mark = (self.step, len(self.losses), len(self.heldout))  # nothing a checkpoint holds changes otherwise
        weights = [*self._params, *self._ema_params]
        if not bool(torch.stack([torch.isfinite(w).all() for w in weights]).all()):  # a gradient's inf, before its loss shows it
            raise DivergedError(f"the weights became non-finite by step {self.step}; the last good checkpoint "
                                f"({self.out / CHECKPOINT}) is left as it was")
        with atomic_path(path) as tmp:
            same = self._written is not None and self._written[0] == mark and self._written[1].is_file()
            if not (same and _linked(self._written[1], tmp)):
                torch.save({"step": self.step, "model": self.model.state_dict(), "ema": self.ema.state_dict(),
                            "optimizer": self.optimizer.state_dict(), "config": self.config_dict(),
                            "rng": rng_state(), "losses": list(self.losses), "heldout": list(self.heldout),
                            **({"posthoc": self.posthoc.state_dict()} if self.posthoc else {})}, tmp)
        self._written = (mark, path)

    def timing(self) -> pd.DataFrame:
        """Wall-clock ms/step between consecutive loss read-backs of this process (each one waits
        for the GPU, so an interval times whole steps); the first interval holds compilation."""
        rows = [{"step_from": a, "step_to": b, "ms_per_step": (tb - ta) * 1e3 / (b - a)}
                for (a, ta), (b, tb) in zip(self._clock, self._clock[1:]) if b > a]
        return pd.DataFrame(rows, columns=["step_from", "step_to", "ms_per_step"])

    def resume(self) -> None:
        ckpt = load_checkpoint(self.out / CHECKPOINT)  # CPU: RNG states must stay CPU tensors
        ranks = int(ckpt["config"].get("world_size", 1))
        if ranks != self.world.size:
            raise InputError(f"cannot resume {self.out} with {self.world.size} process(es): it was trained with "
                             f"{ranks}; resume with the same number of ranks")
        stored, mine = _normalized(ckpt["config"]), _normalized(self.config_dict())
        changed = {k: (stored["train"].get(k), mine["train"][k]) for k in RESUMABLE
                   if stored["train"].get(k) != mine["train"][k]}
        for k in RESUMABLE:  # how often the run logs, saves and evaluates changes nothing it computes
            stored["train"][k] = mine["train"][k]
        for key in ("model", "diffusion", "train", "knobs", "data_config", "size"):
            if stored[key] != mine[key]:
                raise InputError(f"cannot resume {self.out}: {_difference(key, stored[key], mine[key])}")
        if changed and self.world.main:
            print("resuming with " + ", ".join(f"{k} {a!r} → {b!r}" for k, (a, b) in changed.items()), file=sys.stderr)
        self.model.load_state_dict(ckpt["model"])
        self.ema.load_state_dict(ckpt["ema"])
        if self.posthoc is not None:
            self.posthoc.load_state_dict(ckpt["posthoc"])
        rates = [g["lr"] for g in self.optimizer.param_groups]  # a captured step's device tensors: kept, not replaced
        self.optimizer.load_state_dict(ckpt["optimizer"])
        for group, rate in zip(self.optimizer.param_groups, rates):
            group["lr"] = rate
        set_rng_state(ckpt["rng"])
        self.step = int(ckpt["step"])
        self.losses = list(ckpt.get("losses", []))
        self.heldout = list(ckpt.get("heldout", []))
        self._last_eval = self.heldout[-1]["step"] if self.heldout else None
        self._clock_before = float(self.heldout[-1].get("seconds", 0.0)) if self.heldout else 0.0

    # ---- training -----------------------------------------------------------------------------
    def draws(self, step: int) -> list[int]:
        """The draw numbers of ``step``'s micro-batches on this rank."""
        return [self.world.draw(step, self.train_cfg.grad_accum, k) for k in range(self.train_cfg.grad_accum)]

    def subjects(self, step: int) -> list[list[int]]:
        """Dataset indices of each of ``step``'s micro-batches on this rank."""
        n, b, seed = len(self.dataset), self.train_cfg.batch_size, self.train_cfg.seed
        return [[sample_order(n, seed, d * b + j) for j in range(b)] for d in self.draws(step)]

    def feed(self, stop: int | None = None) -> pipeline.Feed:
        """The input pipeline from the current step (to ``stop``); replaces an open one."""
        self.close_feed()
        self._feed = pipeline.Feed(self.dataset, self.data, self._volumes, self.subjects, self.step, stop,
                                   self.device, self.engine.to_device, self.engine.knobs.loader_workers)
        return self._feed

    def close(self) -> None:
        """Stop the input pipeline and free the captured step (before the process group goes)."""
        self.close_feed()
        self.engine.train_step.release()

    def close_feed(self) -> None:
        if self._feed is not None:
            self._feed.close()
            self._feed = None

    def noise(self, draw: int, image: Tensor) -> tuple[Tensor, Tensor]:
        """Diffusion time t ~ U{0..T−1} and noise ε (``GaussianDiffusion.draw_noise``) of draw ``draw``, from a generator
        seeded by (seed, draw) on the device: no host synchronisation, no dependence on ranks."""
        self._gen.manual_seed(draw_seed(self.train_cfg.seed, draw))
        t = torch.randint(0, self.engine.diffusion.num_timesteps, (image.shape[0],), generator=self._gen,
                          device=self.device)
        eps = self.engine.diffusion.draw_noise(image, self._gen)  # with the offset noise, if any
        return t, self.engine.to_device(eps)  # in the images' layout

    def cut_patches(self, draw: int, image: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Draw ``draw``'s volumes and masks cut to its random patches (``data.patches``), in the model's layout."""
        p = self.train_cfg.patch_size
        low = patches.corners(self.train_cfg.seed, draw, image.shape[0], self.size, p)
        return self.engine.to_device(patches.crop(image, low, p)), self.engine.to_device(patches.crop(mask, low, p))

    def train_step(self) -> Tensor:
        """One optimizer step (``grad_accum`` micro-batches on each rank); returns this rank's
        mean loss on the device (no host synchronisation) and queues it for the next ``flush``."""
        if self._feed is None or self._feed.next_step != self.step:
            self.feed()
        assert self._feed is not None
        draws = self.draws(self.step)
        pairs = self._feed.take(self.step)
        if self.train_cfg.patched(self.step):
            pairs = [self.cut_patches(d, image, mask) for d, (image, mask) in zip(draws, pairs)]
        noises = [self.noise(d, image) for d, (image, _) in zip(draws, pairs)]
        set_lr(self.optimizer, self.train_cfg.lr_at(self.step, max(self._steps, self.step + 1)))
        loss, _ = self.engine.train_step([i for i, _ in pairs], [m for _, m in pairs], draws=noises)
        self._pending.append(loss.clone())  # the graph's loss buffer is reused by the next step
        self.step += 1
        cfg = self.train_cfg
        if self.step % cfg.ema_every == 0:
            if self.step < cfg.ema_start_step:
                with torch.no_grad():  # else the EMA's tensors hold the parameters' autograd nodes, on this stream
                    torch._foreach_copy_(self._ema_params, self._params)
            else:
                ema_update(self._ema_params, self._params, cfg.ema_decay)
            if self.posthoc is not None:
                self.posthoc.update(self._params)
        if self.posthoc is not None and self.step % cfg.posthoc_every == 0 and self.world.main:
            posthoc.save_snapshot(self.out, self.step, self.posthoc)
        return loss

    def flush(self) -> None:
        """Read the pending losses back (one synchronisation); raise DivergedError on NaN/inf."""
        if not self._pending:
            return
        values = self.world.mean(torch.stack(self._pending)).tolist()  # the global mean loss
        self._clock.append((self.step, time.perf_counter()))
        first = self.step - len(values) + 1
        self._pending = []
        for k, loss in enumerate(values):
            if not math.isfinite(loss):
                raise DivergedError(
                    f"loss became {loss} at step {first + k}; the last good checkpoint "
                    f"({self.out / CHECKPOINT}) is left as it was")
        self.losses.extend(values)

    def evaluate(self, weights: tuple[str, ...] | None = None, seconds: float | None = None) -> pd.DataFrame:
        """The held-out loss at this step of ``weights`` ("model", "ema": the EMA's is what ``sample``
        uses; default ``TrainConfig.eval_weights``), one row per (weights, subject, t): ``heldout.held_out_loss``,
        the same fixed noised inputs and FP32 evaluator at every step, so the curve measures the weights alone. Collective:
        each rank evaluates its share of the (subject, t) triples (``World.share``) and the losses
        are summed over the ranks (each triple's is on one rank, zero on the others: exact), so W
        ranks take 1/W of one's time; the rows are kept for the checkpoint and ``heldout.csv``."""
        if self._triples is None:
            self._triples = held_out_triples(self.held_out, self.model_cfg, self.size, diffusion_cfg=self.diffusion_cfg,
                                             data_cfg=self.data_cfg)
        keys, *tensors = self._triples
        mine = self.world.share(len(keys))
        part = (keys.iloc[mine], *(v[mine] for v in tensors))
        modules = {"model": self.model, "ema": self.ema}
        weights = [(w, modules[w]) for w in (weights or EVAL_WEIGHTS[self.train_cfg.eval_weights])]
        losses = torch.zeros(len(weights), len(keys), dtype=torch.float64)
        for i, (_, m) in enumerate(weights):
            if mine:
                if self._evaluator is None:  # built once, from the first weights it judges
                    self._evaluator = Evaluator(self.model_cfg, m.state_dict(), self.device, self.diffusion_cfg)
                losses[i, mine] = torch.tensor(self._evaluator.loss(m.state_dict(), part)["loss"].to_numpy())
        losses = self.world.sum(losses.to(self.device)).cpu()
        frames = [keys.assign(loss=losses[i].numpy(), weights=w) for i, (w, _) in enumerate(weights)]
        at = self.clock() if seconds is None else seconds
        df = pd.concat(frames, ignore_index=True).assign(step=self.step, seconds=round(at, 3))[HELDOUT_COLUMNS]
        self.heldout.extend(df.to_dict("records"))
        return df

    def _evaluate_if_due(self, steps: int, last: bool = False) -> bool:
        """Every ``eval_every`` steps, at step 0 and at the last step (once per step; every rank
        decides alike): read the losses back, then every rank evaluates its share of the held-out
        loss (``evaluate``) and, where the EMA's is the lowest yet, rank 0 writes the checkpoint
        also to ``best.pt``. Returns whether it evaluated."""
        due = self.step % self.train_cfg.eval_every == 0 or self.step == steps or last
        if not self.held_out or not due or self.step == self._last_eval:
            return False
        self._last_eval = self.step
        self.flush()
        at = self.clock()  # the training clock when the steps it judges are done, before its own time
        means = pd.DataFrame(self.heldout, columns=HELDOUT_COLUMNS).query("weights == 'ema'").groupby("step")["loss"].mean()
        now = self.evaluate(seconds=at).query("weights == 'ema'")["loss"].mean()
        if not self.world.main:
            return True
        if means.empty or now < means.min():
            self._write_checkpoint(self.out / BEST)
        return True

    def clock(self) -> float:
        """The run's training clock: the seconds of its fits so far (resumed ones included, as the checkpoint's last
        evaluation recorded them) less their held-out evaluations."""
        if self._fit_start is None:
            return self._clock_before
        return self._clock_before + time.perf_counter() - self._fit_start - self.phases.get("held-out", 0.0)

    def _out_of_time(self, deadline: float | None, steps: int) -> bool:
        """Whether ``deadline`` (``time.perf_counter()``) has passed on rank 0, agreed by all ranks. Before it, the
        rate's decay is set to end where rank 0's clock says the time runs out (``_steps``: the steps left at the pace
        since the first step, its evaluations and checkpoints included; an end that only comes nearer), so a
        ``--time-limit`` run decays to its end as a ``--steps`` run does; the same on every rank."""
        if deadline is None and not self.world.distributed:
            return False
        now = time.perf_counter()
        paced = [c for c in self._clock if c[0] > self.train_cfg.patch_steps]  # after a curriculum's first whole step
        if not self.train_cfg.patch_steps or len(paced) < 2:
            paced = self._clock[min(1, len(self._clock) - 1):]  # after the first step: steady
        (a, ta), (b, tb) = paced[0], paced[-1]
        end = self.step + (deadline - now) * (b - a) / (tb - ta) if deadline and b > a and tb > ta else steps
        mine = torch.tensor([float(deadline is not None and now > deadline), float(end)], dtype=torch.float64,
                            device=self.device) * float(self.world.main)
        late, end, signal = self.world.sum(torch.cat([mine, torch.tensor([float(self.signal is not None)],
                                                                         dtype=torch.float64, device=self.device)])).tolist()
        self._agreed_stop = bool(signal)
        if signal and self.signal is None:  # another rank was signalled: every rank stops at this step
            self.signal = "a signal to another rank"
        self._steps = int(min(self._steps, max(end, self.step + 1)))  # an end that only comes nearer: the rate never rises
        return late > 0

    def _timed(self, phase: str, fn, *args):
        """``fn(*args)``, its seconds added to ``phases[phase]`` and its count to ``phases[phase + ' n']``,
        unless it returned False (it had nothing to do: an evaluation that was not due)."""
        t0 = time.perf_counter()
        out = fn(*args)
        if out is not False:
            self.phases[phase] += time.perf_counter() - t0
            self.phases[f"{phase} n"] += 1
        return out

    def fit(self, steps: int, progress: bool = True, time_limit_s: float | None = None) -> list[float]:
        """Train until ``steps`` optimizer steps in total; checkpoint every ``save_every`` and at the
        end; losses are read back every ``log_every`` steps. With ``time_limit_s`` training stops at
        the first read-back after that many seconds (``stopped_early``); ``signal`` (set by a signal
        handler) stops it too, one process at once, several ranks at the next read-back. However it
        ends, its last weights are judged (held-out subjects) and checkpointed: ``resume`` continues
        exactly. ``phases`` gets
        where its seconds went (``timing.timing_line``): the first step (read back at once: compilation, capture, warm-up), the held-out evaluations, the
        checkpoints, and the steady steps (the rest)."""
        if steps < self.step:
            raise InputError(f"--steps {steps} is below the {self.step} steps already trained")
        if time_limit_s is not None and time_limit_s <= 0:
            raise InputError(f"--time-limit must be > 0 seconds, got {time_limit_s}")
        self._steps = steps
        self._clock = [(self.step, time.perf_counter())]
        start = self._fit_start = self._clock[0][1]
        deadline = None if time_limit_s is None else start + time_limit_s
        self.stopped_early = self._agreed_stop = False
        self.phases = {"first step": 0.0, "first step n": 0, "switch step": 0.0, "switch step n": 0, "held-out": 0.0,
                       "held-out n": 0, "checkpoints": 0.0, "checkpoints n": 0, "steady steps": 0.0, "steady steps n": 0}
        from tqdm.auto import tqdm

        cfg = self.train_cfg
        bar = tqdm(total=steps, initial=self.step, disable=not progress, desc="train", unit="step")
        self.feed(stop=steps)
        first = self.step
        try:
            self._timed("held-out", self._evaluate_if_due, steps)
            while self.step < steps:
                t0 = time.perf_counter()
                self.train_step()
                if self.step == first + 1:  # read back at once: the first step's compilation, capture and warm-up
                    self.flush()
                    self.phases["first step"], self.phases["first step n"] = time.perf_counter() - t0, 1
                elif self.step == cfg.patch_steps + 1:  # a curriculum's first whole volumes: their compilation and capture
                    self.flush()
                    self.phases["switch step"], self.phases["switch step n"] = time.perf_counter() - t0, 1
                if self.step % cfg.log_every == 0 or self.step % cfg.save_every == 0:
                    self.flush()
                    bar.update(self.step - bar.n)
                    bar.set_postfix(loss=f"{self.losses[-1]:.4f}", **self._held_postfix())
                    self.stopped_early = self.step < steps and self._out_of_time(deadline, steps)
                # a signal stops one process at once, several ranks at the read-back that agrees on it
                signalled = self._agreed_stop if self.world.distributed else self.signal is not None
                if self.step < steps and (self.stopped_early or signalled):
                    self.stopped_early = True
                    break  # the last weights judged and saved below
                if self._timed("held-out", self._evaluate_if_due, steps):
                    bar.set_postfix(loss=f"{self.losses[-1]:.4f}", **self._held_postfix())
                if self.step % cfg.save_every == 0:
                    self._timed("checkpoints", self.save)
            bar.update(self.step - bar.n)
        finally:
            bar.close()
            self.close_feed()
        self._timed("held-out", self._evaluate_if_due, steps, True)  # best.pt considers the last weights, however it ends
        self._timed("checkpoints", self.save)
        p = self.phases
        p["steady steps"] = max(time.perf_counter() - start - p["first step"] - p["switch step"] - p["held-out"]
                                - p["checkpoints"], 0.0)
        p["steady steps n"] = self.step - first - p["first step n"] - p["switch step n"]
        return self.losses

    def _held_postfix(self) -> dict[str, str]:
        """The progress bar's latest held-out loss of the EMA weights (mean over subjects and t)."""
        last = [r["loss"] for r in self.heldout if r["step"] == self.heldout[-1]["step"] and r["weights"] == "ema"]
        return {"held_out": f"{np.mean(last):.4f}"} if last else {}
