"""Frozen configuration dataclasses: model presets, diffusion, training and run knobs.

Every dataclass here is serialized into checkpoints and results (``asdict``) and can be rebuilt
from that dict (``from_dict``), so a number on disk always says which configuration made it.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal, TypeVar

T = TypeVar("T")


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Rebuild a config dataclass from ``asdict`` output (lists back to tuples, unknown keys refused)."""
    names = {f.name for f in fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    return cls(**values)


@dataclass(frozen=True)
class ModelConfig:
    """The Med-DDPM 3D U-Net (paper §2.1, Fig. 3; guided-diffusion style with dims=3)."""

    name: str = "whole-head"  # preset name, recorded with every result
    in_channels: int = 3  # 1 noisy image channel + 2 mask channels (brain, lesion)
    out_channels: int = 1  # predicted noise, one channel per image modality
    mask_channels: int = 2  # one-hot mask channels the data loader produces
    model_channels: int = 64  # base width ("num_channels" in paper §3.2)
    channel_mult: tuple[int, ...] = (1, 1, 2, 3, 4)  # reference multipliers for 128-voxel inputs
    num_res_blocks: int = 1  # ResBlocks per level (paper §3.2)
    attention_ds: tuple[int, ...] = (8,)  # downsample factors with attention: 128 // 16 in the reference
    num_heads: int = 1  # attention heads, legacy head-first qkv split
    num_groups: int = 32  # GroupNorm groups
    dropout: float = 0.0  # reference default
    image_size: int = 128  # I = J of the preset's native input ("input_size")
    depth_size: int = 128  # K, the axial axis, of the preset's native input ("depth_size")
    norm_fp32: bool = True  # GroupNorm computed in fp32 then cast back (reference GroupNorm32)

    def __post_init__(self) -> None:
        if self.in_channels != self.out_channels + self.mask_channels:
            raise ValueError(
                f"in_channels ({self.in_channels}) must equal out_channels ({self.out_channels})"
                f" + mask_channels ({self.mask_channels})"
            )
        if not self.channel_mult or any(m <= 0 for m in self.channel_mult):
            raise ValueError(f"channel_mult must be positive integers, got {self.channel_mult}")
        if self.num_res_blocks < 1 or self.model_channels < 1 or self.num_heads < 1:
            raise ValueError("num_res_blocks, model_channels and num_heads must be >= 1")
        widths = {self.model_channels * m for m in self.channel_mult}
        bad = sorted(w for w in widths if w % self.num_groups or w % self.num_heads)
        if bad:
            raise ValueError(
                f"widths {bad} are not divisible by num_groups={self.num_groups} / num_heads={self.num_heads}"
            )

    @property
    def levels(self) -> int:
        return len(self.channel_mult)

    @property
    def native_size(self) -> tuple[int, int, int]:
        """(I, J, K) the preset was built for, in the data's canonical RAS voxel order: BraTS's
        axial slices run along K, so ``brats`` is 192 × 192 × 144 (the reference's 144 × 192 × 192
        depth-first tensor, transposed; the same parameters and FLOPs)."""
        return (self.image_size, self.image_size, self.depth_size)

    def check_size(self, size: tuple[int, int, int]) -> None:
        """Each spatial side must halve cleanly at every downsampling level."""
        factor = 2 ** (self.levels - 1)
        if len(size) != 3 or any(s <= 0 or s % factor for s in size):
            raise ValueError(f"volume size {tuple(size)} must be 3 positive sides divisible by {factor}")


MODEL_PRESETS: dict[str, ModelConfig] = {
    # Paper §3.2: input_size 128, depth_size 128, num_channels 64, 1 res block.
    "whole-head": ModelConfig(),
    # Med-DDPM BraTS model: T1, T1ce, T2, FLAIR; attention "16" → ds 12, which never occurs.
    "brats": ModelConfig(
        name="brats", in_channels=8, out_channels=4, mask_channels=4, num_res_blocks=2,
        attention_ds=(12,), image_size=192, depth_size=144,
    ),
    # The brats preset's inputs and outputs on a small net and window, for CPU tests and demos.
    "brats-tiny": ModelConfig(
        name="brats-tiny", in_channels=8, out_channels=4, mask_channels=4, model_channels=16,
        channel_mult=(1, 2), attention_ds=(2,), num_groups=8, image_size=32, depth_size=24,
    ),
    # Small enough for CPU tests and demos (seconds, not minutes).
    "tiny": ModelConfig(
        name="tiny", model_channels=16, channel_mult=(1, 2), attention_ds=(2,), num_groups=8,
        image_size=16, depth_size=16,
    ),
}


def model_preset(name: str) -> ModelConfig:
    if name not in MODEL_PRESETS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODEL_PRESETS)}")
    return MODEL_PRESETS[name]


INTENSITIES = ("minmax", "percentile")  # DataConfig.intensity
PREDICTIONS = ("eps", "v")  # DiffusionConfig.prediction
TRAIN_PREDICTION = "v"  # `train`'s default for a user's data: v-prediction, right on real brains (book chapter 14), where the
# paper's ε-prediction (DiffusionConfig's default, `--prediction eps`) leaves the background too bright and seed-dependent


@dataclass(frozen=True)
class DiffusionConfig:
    """Gaussian diffusion as in Med-DDPM (paper §2.1)."""

    timesteps: int = 250  # reference number of diffusion steps
    cosine_s: float = 0.008  # offset s of the cosine schedule (Nichol & Dhariwal)
    max_beta: float = 0.999  # betas clipped here
    loss: Literal["l1", "l2"] = "l1"  # the reference trains with L1 on the noise
    prediction: Literal["eps", "v"] = "eps"  # what the network predicts: the noise ε (reference, DDPM eq. 14) or v = √ᾱ ε − √(1−ᾱ) x₀ (Salimans & Ho 2022, §4); samplers convert v to ε, so every sampler runs either
    offset_noise: float = 0.0  # training noise ε + s·ε', ε' one N(0, 1) number per volume and channel (Guttenberg 2023, "offset noise"): lets the model move a volume's mean, which i.i.d. noise barely perturbs; 0 = the reference

    def __post_init__(self) -> None:
        if self.timesteps < 1:
            raise ValueError(f"timesteps must be >= 1, got {self.timesteps}")
        if self.loss not in ("l1", "l2"):
            raise ValueError(f"loss must be 'l1' or 'l2', got {self.loss!r}")
        if self.prediction not in PREDICTIONS:
            raise ValueError(f"prediction must be one of {PREDICTIONS}, got {self.prediction!r}")
        if not 0 <= self.offset_noise <= 1:
            raise ValueError(f"offset_noise must be in [0, 1], got {self.offset_noise}")
        if not 0 < self.max_beta < 1:
            raise ValueError(f"max_beta must be in (0, 1), got {self.max_beta}")


@dataclass(frozen=True)
class DataConfig:
    """How NIfTI files become the model's inputs; kept in the checkpoint, so ``sample`` and the
    quality measures read masks and real scans the way training did."""

    intensity: str = "minmax"  # each image to [-1, 1]: "minmax" (the reference: min → −1, max → 1) or "percentile" (the percentiles below → ±1, clipped), which one bright voxel cannot move
    percentiles: tuple[float, float] = (0.5, 99.5)  # with intensity "percentile": the low and high percentiles of the volume's voxels mapped to −1 and 1
    mask_labels: str = ""  # label map of the mask files onto the preset's channels (``medddpm.data.labels``, e.g. "brain=nonzero"); "" = the files carry the preset's own labels

    def __post_init__(self) -> None:
        if self.intensity not in INTENSITIES:
            raise ValueError(f"intensity must be one of {INTENSITIES}, got {self.intensity!r}")
        lo, hi = self.percentiles
        if not 0 <= lo < hi <= 100:
            raise ValueError(f"percentiles must satisfy 0 <= low < high <= 100, got {self.percentiles}")


EVAL_WEIGHTS = {"ema": ("ema",), "both": ("model", "ema")}  # TrainConfig.eval_weights: the weights each names
LR_DECAYS = ("constant", "cosine")  # TrainConfig.lr_decay
OPTIMIZERS = ("adam", "muon")  # TrainConfig.optimizer (medddpm/run/optim.py)
POSTHOC_SIGMA_MAX = (1 / 12) ** 0.5  # σ_rel of a uniform average (γ = 0): the widest power-function EMA profile


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation hyper-parameters (paper §3.2 / Med-DDPM defaults)."""

    lr: float = 1e-5  # Adam learning rate
    batch_size: int = 1  # volumes per micro-batch
    grad_accum: int = 2  # micro-batches per optimizer step
    ema_decay: float = 0.995  # EMA of the weights
    ema_start_step: int = 2000  # before this, the EMA is reset to the model
    ema_every: int = 10  # EMA updated every this many optimizer steps
    save_every: int = 1000  # checkpoint period in optimizer steps
    seed: int = 0  # seeds torch, numpy and python's RNGs
    log_every: int = 50  # steps between loss read-backs (NaN check, progress): the loop's only syncs
    held_out: int = 0  # last subjects (in subject order) never trained on; their loss is evaluated
    eval_every: int = 1000  # steps between held-out loss evaluations (with held_out > 0)
    eval_weights: str = "ema"  # whose held-out loss: "ema" (the weights sampled, best.pt's choice) or "both" (the
    # raw model's too, for its curve: twice the FP32 evaluation time)
    # The recipe beyond Med-DDPM's (``RECIPES``): each default below is the paper's, so a checkpoint written before these
    # fields existed resumes as it was trained.
    lr_warmup: int = 0  # steps of linear warm-up from lr/lr_warmup to lr (0 = none, the reference)
    lr_decay: str = "constant"  # after the warm-up: "constant" (the reference) or "cosine" to lr·lr_final at the run's --steps (LR_DECAYS)
    lr_final: float = 0.0  # with lr_decay "cosine": the rate at the last step, as a fraction of lr
    min_snr_gamma: float = 0.0  # Min-SNR-γ loss weighting (Hang et al. 2023, eq. 6): each volume's loss × min(SNR(t), γ)/(SNR(t) + 1) for v-prediction (/SNR(t) for ε), normalised to mean 1 over t; 0 = unweighted (the reference)
    adam_betas: tuple[float, float] = (0.9, 0.999)  # Adam's (β1, β2): PyTorch's defaults, which Med-DDPM trains with
    optimizer: str = "adam"  # "adam" (the reference) or "muon": the U-Net's hidden weight matrices by Muon (Jordan et al. 2024; orthogonalized Nesterov momentum at Adam's update RMS, so at the same rate and schedule), the stem, head, norms and biases by Adam (OPTIMIZERS)
    patch_size: int = 0  # a curriculum (Patch Diffusion, Wang et al. 2023): the first patch_steps steps train on random cubes of this edge cut from each volume with its mask (medddpm/data/patches.py); 0 = whole volumes throughout (the reference)
    patch_steps: int = 0  # with patch_size: how many optimizer steps, from the first, train on patches; whole volumes after
    posthoc_ema: tuple[float, ...] = ()  # σ_rel of power-function EMAs kept for a post-hoc EMA (Karras et al. 2024, EDM2 §3; they track 0.05 and 0.10), snapshotted into <out>/posthoc/ and combined by `medddpm posthoc-ema` (medddpm/train/posthoc.py); () = none (the reference)
    posthoc_every: int = 1000  # with posthoc_ema: optimizer steps between their snapshots
    recipe: str = "paper"  # the name of the recipe these values came from (RECIPES), recorded with the run

    def __post_init__(self) -> None:
        for name in ("batch_size", "grad_accum", "ema_every", "save_every", "log_every", "eval_every", "posthoc_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.held_out < 0:
            raise ValueError(f"held_out must be >= 0, got {self.held_out}")
        if self.eval_weights not in EVAL_WEIGHTS:
            raise ValueError(f"eval_weights must be one of {', '.join(EVAL_WEIGHTS)}, got {self.eval_weights!r}")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.lr_warmup < 0:
            raise ValueError(f"lr_warmup must be >= 0 steps, got {self.lr_warmup}")
        if self.lr_decay not in LR_DECAYS:
            raise ValueError(f"lr_decay must be one of {', '.join(LR_DECAYS)}, got {self.lr_decay!r}")
        if not 0 <= self.lr_final <= 1:
            raise ValueError(f"lr_final must be in [0, 1] (a fraction of lr), got {self.lr_final}")
        if self.min_snr_gamma < 0:
            raise ValueError(f"min_snr_gamma must be >= 0 (0 = unweighted), got {self.min_snr_gamma}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas):
            raise ValueError(f"adam_betas must be two numbers in [0, 1), got {self.adam_betas}")
        if not all(0 < s < POSTHOC_SIGMA_MAX for s in self.posthoc_ema) or len(set(self.posthoc_ema)) != len(self.posthoc_ema):
            raise ValueError(f"posthoc_ema must be distinct σ_rel values in (0, {POSTHOC_SIGMA_MAX:.3f}) "
                             f"({POSTHOC_SIGMA_MAX:.3f}: a uniform average), got {list(self.posthoc_ema)}")
        if self.posthoc_ema and self.posthoc_every % self.ema_every:
            raise ValueError(f"posthoc_every ({self.posthoc_every}) must be a multiple of ema_every ({self.ema_every}): "
                             "the EMAs change only then")
        if self.patch_size < 0 or self.patch_steps < 0 or (self.patch_size > 0) != (self.patch_steps > 0):
            raise ValueError(f"patch_size and patch_steps go together, both > 0 (a curriculum) or both 0; got "
                             f"{self.patch_size} and {self.patch_steps}")

    def patched(self, step: int) -> bool:
        """Whether optimizer step ``step`` (0-based) trains on patches (``patch_size``) rather than whole volumes."""
        return step < self.patch_steps

    def lr_at(self, step: int, steps: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based) of a run of ``steps``: linear warm-up over
        ``lr_warmup`` steps, then constant or a half cosine down to ``lr · lr_final`` at the last step."""
        if step < self.lr_warmup:
            return self.lr * (step + 1) / self.lr_warmup
        if self.lr_decay == "constant":
            return self.lr
        span = max(steps - 1 - self.lr_warmup, 1)
        done = min(max(step - self.lr_warmup, 0) / span, 1.0)
        return self.lr * (self.lr_final + (1 - self.lr_final) * 0.5 * (1 + math.cos(math.pi * done)))


RECIPE_FIELDS = ("lr", "lr_warmup", "lr_decay", "lr_final", "min_snr_gamma", "ema_decay", "ema_start_step", "ema_every",
                 "adam_betas", "optimizer", "patch_size", "patch_steps")
RECIPES: dict[str, dict[str, Any]] = {  # `train --recipe NAME`: TrainConfig values of RECIPE_FIELDS; flags given override them
    # Med-DDPM's (paper §3.2): Adam at a constant 1e-5, no warm-up, EMA 0.995 from step 2000, the unweighted loss
    "paper": {"lr": 1e-5, "lr_warmup": 0, "lr_decay": "constant", "lr_final": 0.0, "min_snr_gamma": 0.0,
              "ema_decay": 0.995, "ema_start_step": 2000, "ema_every": 10, "optimizer": "adam"},
    # issue 75's A/B at 64³ on IXI (one arm per H200: data/results/h200/recipe/, kind recipe-ab): a 500-step warm-up
    # to 2e-4, a cosine to 0 at the run's last step, an EMA of 10 times shorter memory (0.99 every 10 steps); at 10,000 steps a held-out
    # loss of 0.1063 and 0.1086 (seeds 0, 1) against 0.1124 for Adam at a constant 1e-4 (the book's IXI rate).
    # Min-SNR-γ 5 (0.156) and peaks of 4e-4 and up (0.46) lost
    "cosine": {"lr": 2e-4, "lr_warmup": 500, "lr_decay": "cosine", "lr_final": 0.0, "min_snr_gamma": 0.0,
               "ema_decay": 0.99, "ema_start_step": 2000, "ema_every": 10, "optimizer": "adam"},
    # the cosine recipe with the hidden weight matrices by Muon (same rate and schedule). At 64³ it reached the target
    # in about half of Adam's steps (muon-64, muon2-64, muon3-64: in-brain r 0.825 and 0.821 against Adam's 0.773); at
    # 128³ on one H200, seed 15, 4,000 steps: held-out loss 0.0812 against Adam's 0.0982, in-brain r 0.813 against 0.680
    # (judge-128, its rule declared before it ran)
    "muon": {"lr": 2e-4, "lr_warmup": 500, "lr_decay": "cosine", "lr_final": 0.0, "min_snr_gamma": 0.0,
             "ema_decay": 0.99, "ema_start_step": 2000, "ema_every": 10, "optimizer": "muon"},
}
DEFAULT_RECIPE = "muon"  # what `train` runs without --recipe


def recipe_summary(c: TrainConfig) -> str:
    """The recipe a run trains, as its summary line names it: the recipe, and each value given on top of it."""
    named = RECIPES.get(c.recipe, {})
    changed = [f"{f} {getattr(c, f)!r}" for f in RECIPE_FIELDS if f in named and getattr(c, f) != named[f]]
    return f"recipe {c.recipe}" + (f" with {', '.join(changed)}" if changed else "")


def recipe_config(name: str, **given: Any) -> TrainConfig:
    """The TrainConfig of recipe ``name`` with ``given`` fields (flags the user passed; None = not given) on top."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {', '.join(RECIPES)}")
    return TrainConfig(**{**RECIPES[name], **{k: v for k, v in given.items() if v is not None}, "recipe": name})


DEFAULT_ETA = 1.0  # DDIM's η unless one is given: η = 0 (deterministic) samples of the trained model lose
# in-brain agreement with the real image at 50 and at 250 steps, η = 1 keeps DDPM's (quality/samplers.csv)

SMALL_JOB = "fast-eager"  # what `sample` without --config runs on a GPU below FAST_FROM_CALLS: fast's sampler with
# nothing for torch.compile to do (formerly eager bf16, NCDHW: 20 s a volume of DDPM 250 on an H100)
FAST_FROM_CALLS = 7000  # `sample` without --config on a GPU runs `fast` from this many denoiser calls on (masks × calls a
# mask: 28 masks of DDPM 250, 584 of the 12-step chain), where its compilation pays off even with cold caches. On an
# H100 (issue 48, 128³, h100-80gb-hbm3/time_to_result/): fast-eager costs 17 s cold (11.1 s warm, 1 mask) before its
# first volume, fast 44 s cold; fast saves 3.9 ms a denoiser call (DDPM 250: 4.68 against 5.66 s a volume; the chain:
# 0.224 against 0.271 s), so its 27 s more of start-up pay off from about 6,900 calls

def fast_from(calls: int) -> int:
    """The volumes of ``calls`` denoiser calls each from which ``sample`` without ``--config`` runs
    ``fast`` on a GPU: those that hold ``FAST_FROM_CALLS`` calls."""
    return -(-FAST_FROM_CALLS // calls)


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
DATA_CACHES = ("auto", "device", "host", "none")  # input pipelines, fastest first (medddpm/data/pipeline.py)
GRAD_SYNCS = ("ddp", "flat")
GRAD_REDUCES = ("fp32", "bf16")  # Knobs.grad_reduce: the dtype the flat gradients cross the GPUs in
FP8_CONV_SETS = ("none", "skip", "all")  # Knobs.fp8_convs: which convolutions run in FP8 (UNet3D.use_fp8_convs)


@dataclass(frozen=True)
class Knobs:
    """Run knobs of the paper's interventions (§5) and beyond; recorded in every result.

    ``medddpm.run.engine`` is the one place that applies them. Knobs that need a GPU (CUDA graphs,
    the fused Adam, cuDNN's autotuner, a device-side data cache) fall back to the PyTorch
    reference path on a machine without one, so every configuration runs everywhere.
    """

    name: str = "baseline"  # configuration name
    tf32: bool | None = False  # TF32 for matmul AND cuDNN conv; None = leave PyTorch's default
    channels_last: bool = False  # model and inputs in torch.channels_last_3d (paper Alg. 2)
    precision: Literal["fp32", "bf16"] = "fp32"  # bf16 = autocast around forward + loss
    cudnn_benchmark: bool | None = False  # cuDNN autotuner; None = leave PyTorch's default
    cudnn_benchmark_limit: int | None = None  # algorithms the autotuner times per convolution; 0 = all; None = PyTorch's (10)
    compile: bool = False  # torch.compile the model
    compile_mode: str = "default"  # torch.compile mode, one of COMPILE_MODES (used when compile)
    checkpoint_attention: bool = True  # recompute attention in backward (reference behaviour)
    fused_ops: bool = False  # layout-preserving GroupNorm+SiLU and x2 upsampling (medddpm/net/ndhwc.py)
    sdpa: bool = False  # attention through F.scaled_dot_product_attention (same maths)
    triton_norm: bool = False  # GroupNorm(+SiLU, + a ResBlock's time-embedding add) through medddpm/net/kernels.py's Triton kernels at minimal bytes (forward 2 reads + 1 write, backward 4 reads + 1 write); needs fused_ops; the PyTorch reference runs where Triton cannot
    fused_adam: bool = False  # torch.optim.Adam(fused=True) on CUDA
    cuda_graphs: bool = False  # capture the whole training step as one CUDA graph, replay it
    data_cache: str = "auto"  # decoded volumes kept on the device, in pinned host memory, or none (decoded per draw by loader workers); auto = the fastest that fits (pipeline.plan)
    loader_workers: int = 4  # worker processes decoding NIfTI files ahead of the step when data_cache is none
    bf16_weights: bool = False  # sampling only: conv and linear weights and biases cast to bf16 once, the numbers bf16 autocast casts them to at every call, so Inductor lays the denoiser's activations out NDHWC (a weight cast inside the graph leaves them NCDHW and cuDNN transposes around each convolution)
    pad_channels: int = 0  # the stem (3 channels in) and output (1 out) convolutions zero-padded to multiples of this many channels, the same sums (0 = off): cuDNN otherwise runs small-channel kernels (a 4 TFLOP/s weight gradient for the output) and transposes around the 1-channel output; training pads its own weights at every call, sampling once
    triton_conv: bool = False  # the stem and output convolutions (3 channels in, 1 out) through medddpm/net/kernels.py's Triton thin convolutions: each pass one matrix product per tile of voxels, at the bytes of its 64-channel side (cuDNN's small-channel kernels take 5 ms of fast's step); an input that arrives NCDHW stays with cuDNN; needs channels_last, excludes pad_channels
    dense_skip_grads: bool = False  # the decoder's skip concatenations hand each input its gradient dense and NDHWC (model._DenseGradCat), written by Inductor's kernels, instead of a strided channel slice that cuDNN's backward copies with PyTorch's generic kernel (0.3 ms each at 128³); needs channels_last
    fold_conv_bias: bool = False  # each ResBlock's first convolution runs without its bias, which joins the timestep embedding's per-channel add inside the second norm's Triton kernels (model.ResBlock): Inductor otherwise adds it in a kernel of its own that reads and writes the convolution's output (0.12 ms at 128³) and reduces its gradient in another; needs triton_norm
    triton_upsample: bool = False  # the decoder's trilinear ×2 upsampling as one Triton kernel (medddpm/net/kernels.py) that writes its output once, instead of Inductor's kernels of the axis-by-axis reference, which write intermediates of the output's size; its backward one Triton kernel too (each input voxel gathers the 4×4×4 outputs that read it; issue 40), where aten's has no NDHWC kernel; needs fused_ops
    timestep_table: bool = False  # sampling only: every ResBlock's time addend (the embedding MLP, its projection, a folded bias) computed once for all T timesteps into one table the denoiser indexes by t (UNet3D.freeze_timestep_table): one gather instead of the MLP and 2 kernels per ResBlock (45 launches) at every step
    fp8_convs: str = "none"  # sampling only: which 3³ convolutions of ≤ 64 output channels run with E4M3 (FP8) operands through cuDNN's graph API (medddpm/net/fp8.py), their input written in E4M3 by the norm or upsampling before them: "none", "skip" (the decoder ResBlocks' first, whose input is a skip concatenation) or "all" (every ResBlock's and upsampling's); one of FP8_CONV_SETS
    fp8_train_convs: bool = False  # training: every ResBlock's and upsampling's 3³ convolution of ≤ 64 output channels (fp8.MAX_OUT_CHANNELS) runs its forward with E4M3 operands through cuDNN's graph API (the weight quantized per output channel at every step, the input unscaled) and its data and weight gradients in bf16 (medddpm/net/fp8.py, Fp8ForwardConv3d; issue 40 lever 1); needs precision 'bf16' and channels_last; excludes fp8_convs
    fused_residual: bool = False  # sampling only: each ResBlock's second convolution and 1×1 skip convolution run without their biases, which one Triton kernel (medddpm/net/residual.py) adds with the skip term in fp32 as it rewrites the convolution's output: one pass instead of PyTorch's bias add (its strided broadcast kernel) and residual add (2.9 + 1.0 ms of a 22.6 ms fast-eager denoiser call at 128³ on an H100; 0.6 + 0.04 ms and 0.95 ms of the kernel with it: time_to_result's fused-residual run); needs channels_last; where the kernel cannot run, its PyTorch reference
    compiled_update: bool = False  # sampling only: DDPM's step x_t → x_{t−1} from the predicted noise (posterior mean, clip, variance, noise) as one torch.compile'd kernel instead of ~30 eager ones a step (GaussianDiffusion.ddpm_update); where compile is off (a CPU) the eager update runs
    chain_graph: bool = False  # sampling only: a few-step solver's whole chain (every denoiser call and update, medddpm/diffusion/solvers.py) captured as one CUDA graph per (plan, shape) and replayed with its noise drawn first (engine.GraphedChain): no launch gaps or host work between steps; DDPM and DDIM keep the per-step graphs; needs cuda_graphs
    capture_after: int = 1  # sampling, cuda_graphs: calls of one input shape run eagerly before the shape is captured as a CUDA graph and replayed (engine.GraphedDenoiser): a shape called once (a one-volume job's chain, a notebook's single call) is never captured, which costs its capture and a second eager run (warm-up) for nothing; 0 = captured at its first call, as before this knob; the eager call is the first of the warm-up calls, so a job of many volumes runs as many eager calls as before
    graph_owned_grads: bool = False  # cuda_graphs on one process: .grad is None at the capture, so the captured backward leaves each gradient where autograd writes it (the graph's memory pool, as PyTorch's whole-network capture example does) instead of adding it into a zeroed static .grad: no add kernel per parameter (249 for whole-head) and no zeroing; later micro-batches of a grad_accum step still add; needs cuda_graphs
    fused_skip_grads: bool = False  # training: each decoder ResBlock concatenates its skip input inside the Triton norm's autograd (kernels.group_norm_silu_cat), whose backward dx kernel adds the 1×1 skip convolution's input gradient and writes the two concatenated inputs' gradients apart, dense NDHWC, instead of Inductor's kernels summing the two gradients of the concatenation and slicing them (issue 40 lever 3); needs triton_norm and channels_last
    grad_sync: str = "flat"  # several ranks: "flat" = the gradients autograd writes gathered by one multi-tensor copy into one flat buffer (engine.FlatGrads: no zeroing, no add per parameter) and averaged by all-reduces of it, captured in the step's CUDA graph; "ddp" = DistributedDataParallel's 25 MB buckets overlapped with the backward
    grad_buckets: int = 1  # several ranks, grad_sync "flat": the network runs (and compiles) as this many segments (UNet3D.segment_bounds: the decoder, then the encoder cut after its downsamplings) and the flat buffer as as many buckets, each all-reduced on NCCL's stream as soon as backward has accumulated its segment's gradients, overlapping the rest of the backward inside the step's CUDA graph; 1 = the whole network compiled as one graph and one all-reduce after the backward; one process runs 1
    grad_reduce: str = "fp32"  # several ranks, grad_sync "flat": the dtype the gradients are all-reduced in; "fp32" = as autograd writes them; "bf16" = gathered (rounded) into a bf16 buffer and summed by NCCL in bf16 (half the bytes over NVLink, and half as long that NCCL's kernels share the SMs and memory with the backward), then copied into the fp32 gradients the optimizer reads, whose moments and weights stay fp32; one of GRAD_REDUCES; one process has nothing to reduce

    def __post_init__(self) -> None:
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be 'fp32' or 'bf16', got {self.precision!r}")
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode must be one of {COMPILE_MODES}, got {self.compile_mode!r}")
        if self.cudnn_benchmark_limit is not None and (isinstance(self.cudnn_benchmark_limit, bool)
                                                       or not isinstance(self.cudnn_benchmark_limit, int)
                                                       or self.cudnn_benchmark_limit < 0):
            raise ValueError(f"cudnn_benchmark_limit must be an integer ≥ 0 (0 = every algorithm) or None, "
                             f"got {self.cudnn_benchmark_limit!r}")
        if self.data_cache not in DATA_CACHES:
            raise ValueError(f"data_cache must be one of {DATA_CACHES}, got {self.data_cache!r}")
        if isinstance(self.loader_workers, bool) or not isinstance(self.loader_workers, int) or self.loader_workers < 0:
            raise ValueError(f"loader_workers must be an integer >= 0, got {self.loader_workers!r}")
        if self.fp8_convs not in FP8_CONV_SETS:
            raise ValueError(f"fp8_convs must be one of {FP8_CONV_SETS}, got {self.fp8_convs!r}")
        if self.fp8_convs != "none" and self.precision != "bf16":
            raise ValueError("fp8_convs writes bf16 outputs into the bf16 denoiser: it needs precision 'bf16'")
        if self.fp8_train_convs and (self.precision != "bf16" or not self.channels_last or self.fp8_convs != "none"):
            raise ValueError("fp8_train_convs needs precision 'bf16' and channels_last, and excludes fp8_convs "
                             "(the sampler's frozen FP8 weights)")
        if self.grad_sync not in GRAD_SYNCS:
            raise ValueError(f"grad_sync must be one of {GRAD_SYNCS}, got {self.grad_sync!r}")
        if isinstance(self.grad_buckets, bool) or not isinstance(self.grad_buckets, int) or self.grad_buckets < 1:
            raise ValueError(f"grad_buckets must be an integer >= 1, got {self.grad_buckets!r}")
        if self.grad_reduce not in GRAD_REDUCES:
            raise ValueError(f"grad_reduce must be one of {GRAD_REDUCES}, got {self.grad_reduce!r}")
        if self.grad_reduce != "fp32" and self.grad_sync != "flat":
            raise ValueError("grad_reduce sets the flat gradient buffer's dtype: it needs grad_sync 'flat' "
                             "(DistributedDataParallel reduces in the gradients' dtype)")
        if self.grad_buckets > 1 and self.grad_sync != "flat":
            raise ValueError("grad_buckets splits the flat gradient buffer: it needs grad_sync 'flat' "
                             "(DistributedDataParallel has buckets of its own)")
        if self.cuda_graphs and self.compile and self.compile_mode in ("reduce-overhead", "max-autotune"):
            raise ValueError(f"cuda_graphs captures the whole step itself; compile_mode {self.compile_mode!r} "
                             "captures graphs too: use 'default' or 'max-autotune-no-cudagraphs'")
        if isinstance(self.pad_channels, bool) or not isinstance(self.pad_channels, int) or self.pad_channels < 0:
            raise ValueError(f"pad_channels must be an integer >= 0 (0 = off), got {self.pad_channels!r}")
        if self.bf16_weights and self.precision != "bf16":
            raise ValueError("bf16_weights casts the weights autocast would cast: it needs precision 'bf16'")
        if self.triton_norm and not self.fused_ops:
            raise ValueError("triton_norm replaces the fused NDHWC GroupNorm: it needs fused_ops=True")
        if self.triton_conv and not self.channels_last:
            raise ValueError("triton_conv's kernels read and write NDHWC activations: it needs channels_last=True")
        if self.fused_residual and not self.channels_last:
            raise ValueError("fused_residual's kernel reads and writes NDHWC activations: it needs channels_last=True")
        if self.triton_upsample and not self.fused_ops:
            raise ValueError("triton_upsample replaces the fused NDHWC upsampling: it needs fused_ops=True")
        if isinstance(self.capture_after, bool) or not isinstance(self.capture_after, int) or self.capture_after < 0:
            raise ValueError(f"capture_after must be an integer ≥ 0, got {self.capture_after!r}")
        if self.chain_graph and not self.cuda_graphs:
            raise ValueError("chain_graph captures a sampler's chain as a CUDA graph: it needs cuda_graphs=True")
        if self.graph_owned_grads and not self.cuda_graphs:
            raise ValueError("graph_owned_grads changes how the step's CUDA graph holds gradients: it needs cuda_graphs=True")
        if self.fold_conv_bias and not self.triton_norm:
            raise ValueError("fold_conv_bias adds the bias inside the Triton norm kernels: it needs triton_norm=True")
        if self.fused_skip_grads and not (self.triton_norm and self.channels_last):
            raise ValueError("fused_skip_grads writes the skip gradients in the Triton norm's NDHWC backward: "
                             "it needs triton_norm=True and channels_last=True")
        if self.dense_skip_grads and not self.channels_last:
            raise ValueError("dense_skip_grads lays the skip gradients out NDHWC: it needs channels_last=True")
        if self.triton_conv and self.pad_channels:
            raise ValueError("triton_conv runs the thin convolutions at their own channel counts: "
                             "pad_channels must be 0 with it")
        if self.cuda_graphs and self.checkpoint_attention:
            raise ValueError("cuda_graphs needs checkpoint_attention=False (recomputation reads the RNG state)")


# The paper's five configurations, in the paper's order (the reproduction's figures use these).
PAPER_CONFIGS: dict[str, Knobs] = {
    # True FP32: TF32 off in matmul and cuDNN conv, explicitly (paper "Baseline").
    "baseline": Knobs(name="baseline"),
    # Paper OPT1 (Alg. 1): TF32 tensor cores.
    "opt1": Knobs(name="opt1", tf32=True),
    # Paper OPT2 (Alg. 2): 3D channels-last layout, FP32.
    "opt2": Knobs(name="opt2", channels_last=True),
    # Paper OPT12: both.
    "opt12": Knobs(name="opt12", tf32=True, channels_last=True),
    # Whatever the installed PyTorch does by default (recorded at run time).
    "pytorch-default": Knobs(name="pytorch-default", tf32=None, cudnn_benchmark=None),
}


def _rung(previous: Knobs, name: str, **changes: Any) -> Knobs:
    return replace(previous, name=name, **changes)


# Beyond the paper: the ladder from opt1 to ``fast``; each rung adds one thing to the one before, up to
# ``bf16-graphs``; ``fast`` adds the kernel levers of issue 21 (KERNEL_VARIANTS, each measured on its own).
_BF16 = _rung(PAPER_CONFIGS["opt1"], "bf16", precision="bf16")  # bf16 autocast, TF32 for the rest
_COMPILED = _rung(_BF16, "bf16-compile", compile=True)  # + torch.compile (Inductor fuses norm/SiLU)
_TUNED = _rung(_COMPILED, "bf16-compile-tuned", cudnn_benchmark=True)  # + cuDNN autotuner
_NDHWC = _rung(_TUNED, "bf16-ndhwc", channels_last=True, fused_ops=True)  # NDHWC end to end
_LEAN = _rung(_NDHWC, "bf16-ndhwc-sdpa", sdpa=True, checkpoint_attention=False, fused_adam=True)
_GRAPHS = _rung(_LEAN, "bf16-graphs", cuda_graphs=True)  # + one CUDA graph per step (on several ranks too: grad_sync "flat"); formerly called `fast`

# Knobs that change how the data reach the step or how gradients travel, never the maths: a run
# resumes under other values of these (tested bit-exact on CPU).
PIPELINE_KNOBS: tuple[str, ...] = ("data_cache", "loader_workers", "grad_buckets")

# Off the ladder: Inductor's max-autotune (Triton templates and kernel choices benchmarked at
# compile time) on the best NCDHW rung and on `bf16-graphs` (without its own CUDA graphs: it captures
# the whole step itself); and `bf16-graphs` with cuDNN's autotuner timing every algorithm it offers for a
# convolution instead of PyTorch's first 10 (the step's roofline puts most of its time above the
# bound in the convolutions).
AUTOTUNED: tuple[Knobs, ...] = (
    _rung(_TUNED, "bf16-compile-max-autotune", compile_mode="max-autotune"),
    _rung(_GRAPHS, "bf16-graphs-max-autotune", compile_mode="max-autotune-no-cudagraphs"),
    _rung(_GRAPHS, "bf16-graphs-cudnn-all", cudnn_benchmark_limit=0),
)

# Several GPUs the way PyTorch's DistributedDataParallel does it (25 MB buckets all-reduced during the
# backward pass, no CUDA graph of the step on several ranks), against the default flat all-reduce.
DDP_VARIANTS: tuple[Knobs, ...] = (
    _rung(PAPER_CONFIGS["opt1"], "opt1-ddp", grad_sync="ddp"),
    _rung(_GRAPHS, "bf16-graphs-ddp", grad_sync="ddp"),
)

# Issue 21's kernel levers, each a knob added to `bf16-graphs` (the fast-* names below), alone or on
# the rung before; `fast` has every training lever. GroupNorm(+SiLU, + the time-embedding add) in the
# Triton kernels of medddpm/net/kernels.py, at the operation's minimal bytes, instead of Inductor's kernels:
_TNORM = _rung(_GRAPHS, "fast-tnorm", triton_norm=True)
_PAD = _rung(_GRAPHS, "fast-p8", pad_channels=8)  # the 3- and 1-channel convolutions padded to 8 channels
# And the thin convolutions (3 channels in, 1 out) as Triton kernels instead of cuDNN's small-channel ones.
_TCONV = _rung(_GRAPHS, "fast-tconv", triton_conv=True)
_TRITON = _rung(_TNORM, "fast-tnorm-tconv", triton_conv=True)  # both Triton levers
# And the skip concatenations' gradients dense for cuDNN's backward (no strided copy before it).
_DENSE = _rung(_GRAPHS, "fast-dense", dense_skip_grads=True)
_TRITON_DENSE = _rung(_TRITON, "fast-tnorm-tconv-dense", dense_skip_grads=True)
# And each ResBlock's first convolution bias added inside the Triton norm kernels.
_FOLD = _rung(_TRITON_DENSE, "fast-tnorm-tconv-dense-fold", fold_conv_bias=True)
# And the captured backward owning the gradients (no per-parameter add): every lever above together,
# the ladder's last rung (formerly `fast-all`; the best rung that passes quality parity). On several
# ranks it runs the network whole and all-reduces one flat bf16 buffer after the backward (issue 49;
# chapter 06 compares it with the three fp32 buckets it all-reduced before, fast-b3).
_FAST = _rung(_FOLD, "fast", graph_owned_grads=True, grad_reduce="bf16")
# Issue 40, lever 1: `fast` with the forward of every ≤ 64-channel 3³ convolution in FP8 (gradients bf16).
_FP8_FWD = _rung(_FAST, "fast-fp8fwd", fp8_train_convs=True)
# Issue 40, lever 3: `fast` with the decoder's skip-gradient sums written by the norm's backward kernel
# (alone, and with lever 1).
_SKIPGRAD = _rung(_FAST, "fast-skipgrad", fused_skip_grads=True)
_FP8_SKIPGRAD = _rung(_FP8_FWD, "fast-fp8fwd-skipgrad", fused_skip_grads=True)
# And the ×2 upsampling's forward and backward as Triton kernels (issue 40, "anything else the
# per-layer table names": Inductor's upsampling backward kernels), on each of the two above.
_SKIPGRAD_UP = _rung(_SKIPGRAD, "fast-skipgrad-up", triton_upsample=True)
_FP8_SKIPGRAD_UP = _rung(_FP8_SKIPGRAD, "fast-fp8fwd-skipgrad-up", triton_upsample=True)
# Issue 49: how `fast`'s ranks reduce, against one bf16 all-reduce after the backward (fast's since issue 49): three
# fp32 buckets, each all-reduced beside the rest of the backward (fast's before), one fp32 all-reduce after the
# backward (fast's before that), two fp32 buckets, and three bf16 buckets. Chapter 06 says from a per-rank profile
# (the sync-flat-bf16 run of 4 × H100) why the three segments lose to one late all-reduce.
SYNC_VARIANTS: tuple[Knobs, ...] = (_rung(_FAST, "fast-b3", grad_buckets=3, grad_reduce="fp32"),
                                    _rung(_FAST, "fast-flat", grad_reduce="fp32"),
                                    _rung(_FAST, "fast-b2", grad_buckets=2, grad_reduce="fp32"),
                                    _rung(_FAST, "fast-rbf16", grad_buckets=3))
LADDER: tuple[str, ...] = ("baseline", "opt1", *(k.name for k in (_BF16, _COMPILED, _TUNED, _NDHWC, _LEAN, _GRAPHS, _FAST)))
KERNEL_VARIANTS: tuple[Knobs, ...] = (_TNORM, _PAD, _rung(_TNORM, "fast-tnorm-p8", pad_channels=8), _TCONV, _TRITON,
                                      _DENSE, _TRITON_DENSE, _FOLD, _FAST, _FP8_FWD, _SKIPGRAD, _FP8_SKIPGRAD,
                                      _SKIPGRAD_UP, _FP8_SKIPGRAD_UP)

# Sampling only (``engine.inference``; training refuses them): each adds one lever to ``bf16-graphs``'s
# denoiser, to a kernel variant's or to the sampling variant before it.
_W16 = _rung(_GRAPHS, "fast-w16", bf16_weights=True)  # weights in bf16 once: the denoiser stays NDHWC
_P8 = _rung(_W16, "fast-w16-p8", pad_channels=8)  # + the 3- and 1-channel convolutions padded to 8
_P8_TNORM = _rung(_P8, "fast-w16-p8-tnorm", triton_norm=True)  # + the Triton GroupNorm kernels
_W16_TRITON = _rung(_TRITON, "fast-w16-tnorm-tconv", bf16_weights=True)  # fast-tnorm-tconv's denoiser, weights in bf16 once
_W16_FOLD = _rung(_W16_TRITON, "fast-w16-tnorm-tconv-fold", fold_conv_bias=True)  # + the ResBlocks' first conv bias in the norm
_W16_UP = _rung(_W16_FOLD, "fast-w16-tnorm-tconv-fold-up", triton_upsample=True)  # + the ×2 upsampling in one Triton kernel
_W16_UPDATE = _rung(_W16_UP, "fast-w16-tnorm-tconv-fold-up-update", compiled_update=True)  # + DDPM's update compiled
_W16_TABLE = _rung(_W16_UP, "fast-w16-tnorm-tconv-fold-up-table", timestep_table=True)  # fold-up + the time addends from a table
_FP8_SKIP = _rung(_W16_UPDATE, "fast-w16-tnorm-tconv-fold-up-update-fp8skip", fp8_convs="skip")  # + the 2C→C decoder convolutions in FP8
_FP8_ALL = _rung(_W16_UPDATE, "fast-w16-tnorm-tconv-fold-up-update-fp8", fp8_convs="all")  # + every ≤ 64-channel 3³ convolution in FP8
_CHAIN = _rung(_W16_UPDATE, "fast-w16-tnorm-tconv-fold-up-update-chain", chain_graph=True)  # + a few-step chain as one CUDA graph
_CHAIN_FP8 = _rung(_FP8_SKIP, "fast-w16-tnorm-tconv-fold-up-update-fp8skip-chain", chain_graph=True)  # the same with fp8skip's convolutions
# Issue 48: fast's sampler with cuDNN's heuristics instead of its autotuner, which times the algorithms
# anew in every process and may pick others (other sums): the candidate for the same files run after run
_PINNED = _rung(_CHAIN, "fast-w16-tnorm-tconv-fold-up-update-chain-pinned", cudnn_benchmark=False)
# Issue 48: the pinned sampler with nothing for torch.compile to do (its DDPM update eager too): NDHWC, bf16 weights,
# the Triton kernels (compiled once by Triton itself, in seconds, and cached) and the CUDA graphs: what `sample` runs
# for a small job, which would finish before `fast` had compiled
_EAGER_UNFUSED = _rung(_PINNED, "fast-eager-unfused", compile=False, compiled_update=False)  # fast-eager before fused_residual
# and since: each ResBlock's output written by one Triton kernel that adds both biases and the skip term (issue 64)
_EAGER = _rung(_EAGER_UNFUSED, "fast-eager", fused_residual=True)
# and the same without the Triton kernels (nothing to compile at all: PyTorch's NDHWC norm and upsampling)
_EAGER_NT = _rung(_EAGER, "fast-eager-nt", triton_norm=False, fold_conv_bias=False, triton_conv=False, triton_upsample=False,
                  fused_residual=False)
SAMPLING_VARIANTS: tuple[Knobs, ...] = (_W16, _P8, _P8_TNORM, _W16_TRITON, _W16_FOLD, _W16_UP, _W16_UPDATE, _W16_TABLE,
                                        _FP8_SKIP, _FP8_ALL, _CHAIN, _CHAIN_FP8, _PINNED, _EAGER_UNFUSED, _EAGER, _EAGER_NT)
SAMPLING_ONLY_KNOBS = ("bf16_weights", "timestep_table", "compiled_update", "fp8_convs", "chain_graph",
                       "fused_residual")  # knobs training refuses (run_config(training=True))

CONFIGS: dict[str, Knobs] = {**PAPER_CONFIGS, **{k.name: k for k in (_BF16, _COMPILED, _TUNED, _NDHWC, _LEAN, _GRAPHS, _FAST)},
                             **{k.name: k for k in (*AUTOTUNED, *DDP_VARIANTS, *SYNC_VARIANTS, *KERNEL_VARIANTS, *SAMPLING_VARIANTS)}}


ALL_CONFIGS = ",".join(PAPER_CONFIGS)  # the default --configs of the reproduction: the paper's five, in its order


def ungraphed(knobs: Knobs) -> Knobs:
    """``knobs`` with the step run eagerly: no CUDA graph, so no graph-owned gradients or chain graph either."""
    return replace(knobs, cuda_graphs=False, graph_owned_grads=False, chain_graph=False)


# Names a person types for sampling: `fast` samples with the recommended sampling variant of `fast`'s
# denoiser (its rows record that variant's own name), `fast-fp8` with the same plus fp8skip's FP8 convolutions.
SAMPLING_ALIASES: dict[str, str] = {"fast": _CHAIN.name, "fast-fp8": _CHAIN_FP8.name}


# The names a person types, each with one line (``medddpm configs``; every other configuration is an
# ablation rung or lever of the book, listed by ``medddpm configs --all`` and runnable by its name).
USER_CONFIGS: dict[str, str] = {
    "baseline": "the paper's baseline: true FP32 (TF32 off for matmul and cuDNN convolutions)",
    "opt1": "the paper's OPT1: TF32 tensor cores",
    "opt2": "the paper's OPT2: 3D channels-last (NDHWC), FP32",
    "opt12": "the paper's OPT1 + OPT2",
    "pytorch-default": "whatever the installed PyTorch does by default (recorded)",
    "fast": "training: bf16, compiled NDHWC kernels, Triton norms and thin convolutions, one CUDA graph a step; "
            "sampling: its sampling variant, a few-step chain as one CUDA graph",
    "fast-fp8": "sampling only: fast with FP8 (E4M3) convolutions in the decoder (needs nvidia-cudnn-frontend)",
    "fast-eager": "sampling only: fast's sampler without torch.compile (its Triton kernels, bf16 weights, NDHWC, CUDA "
                  "graphs, cuDNN's heuristics; each ResBlock's output in one Triton kernel): little to compile, so a "
                  "small job finishes first",
}
TRITON_KNOBS = ("triton_norm", "triton_conv", "triton_upsample", "fused_residual")  # knobs whose kernels Triton compiles itself (and caches)
GPU_LEVERS = ("compile", "cuda_graphs", "fused_adam", "triton_norm", "triton_conv", "triton_upsample", "fp8_convs",
              "chain_graph", "fused_residual")  # knobs that act only on a GPU; a CPU runs their PyTorch reference path, eagerly


def knob_changes(knobs: Knobs, base: Knobs) -> list[str]:
    """The knobs ``knobs`` sets apart from ``base``, in field order: a switch by its name, any other
    knob as name=value."""
    return [f.name if isinstance(getattr(knobs, f.name), bool) else f"{f.name}={getattr(knobs, f.name)}"
            for f in fields(Knobs) if f.name != "name" and getattr(knobs, f.name) != getattr(base, f.name)]


def describe(name: str) -> dict[str, str]:
    """One row of ``medddpm configs``: the name, what it does (``USER_CONFIGS``' line, else the knobs
    it sets apart from ``baseline``), what it is for (train and sample, or sample only) and what a
    CPU runs of it."""
    knobs = CONFIGS[name] if name in CONFIGS else sampling_config(name)  # `fast` trains as itself
    changed = knob_changes(knobs, CONFIGS["baseline"])
    gpu = switched_on(knobs, GPU_LEVERS)
    return {"name": name, "use": "sample" if switched_on(knobs, SAMPLING_ONLY_KNOBS) else "train, sample",
            "GPU": "for its speed levers" if gpu else "not needed",
            "on a CPU": "its PyTorch reference path, eagerly" if gpu else "as on a GPU",
            "what": USER_CONFIGS.get(name, ", ".join(changed) or "the baseline")}


def switched_on(knobs: Knobs, names: tuple[str, ...]) -> list[str]:
    """Those of the knobs ``names`` that ``knobs`` turns on (True, or a value other than "none")."""
    return [k for k in names if getattr(knobs, k) not in (False, "none")]


def sampling_config(name: str) -> Knobs:
    """The configuration a sampler runs under ``name``: a ``SAMPLING_ALIASES`` name or any configuration."""
    return run_config(SAMPLING_ALIASES.get(name, name))


def run_config(name: str, training: bool = False) -> Knobs:
    """The configuration ``name``; with ``training``, one that can train (not a sampling variant)."""
    if name not in CONFIGS:
        raise ValueError(f"unknown configuration {name!r}; choose one of {sorted(CONFIGS)}")
    knobs = CONFIGS[name]
    used = switched_on(knobs, SAMPLING_ONLY_KNOBS)
    if training and used:
        raise ValueError(f"configuration {name!r} is for sampling only ({', '.join(used)}: training keeps the "
                         f"model's own weights); train with 'fast', then sample with --config {name}")
    return knobs


__all__ = [
    "ModelConfig", "DiffusionConfig", "DataConfig", "TrainConfig", "Knobs", "MODEL_PRESETS", "CONFIGS", "PAPER_CONFIGS",
    "LADDER", "KERNEL_VARIANTS", "SAMPLING_VARIANTS", "ALL_CONFIGS", "COMPILE_MODES", "DATA_CACHES", "GRAD_SYNCS", "GRAD_REDUCES", "PIPELINE_KNOBS",
    "model_preset", "run_config", "sampling_config", "SAMPLING_ALIASES", "from_dict", "asdict", "replace",
]
