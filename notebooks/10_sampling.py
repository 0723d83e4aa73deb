# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Sampling: seconds per volume, and which sampler is right
#
# How long a 128³ volume takes to sample under each configuration, where a denoising step's time goes, and which
# sampler's samples are as good as DDPM 250's. The quality measures are those of {doc}`09_quality`; the few-step
# solvers follow in {doc}`11_few_step`.

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # True: time sampling on this machine's GPU first (bench-sample, DDIM 50 and DDPM 250; quality runs: scripts/quality_measure.sh)
size = 128  # volume side when measuring
configs = "opt1,bf16-graphs,fast-w16-p8,fast-w16-tnorm-tconv-fold-up"  # sampling configurations to measure (DDIM 50 and DDPM 250)

# %% tags=["remove-cell"]
from IPython.display import display

from medddpm.report import history, plots, quality_tables
from medddpm.report.measure import prepare
from medddpm.report.present import table

root, G = prepare(results_dir, gpus, measure, "sampling", size, configs)
QG, QGPU = quality_tables.quality_gpus(root, G)  # GPUs with quality results; the one shown
SB = quality_tables.sample_bench(root, G)  # 128³ rows, every batch
SGPU = quality_tables.sampling_roles(SB)["ref"]  # the GPU the sampling prose quotes
TG = quality_tables.sampling_targets(root, SB, QGPU)  # each GPU's fastest sampler against the targets

# %% [markdown]
# **Where it stands**: one 128³ volume of DDPM 250 per GPU, in true FP32, under OPT1 and under the fastest
# configuration measured (`bench-sample`, batch 1).

# %% tags=["hide-input"]
plots.show_table(quality_tables.sampling_state(SB), "bench-sample rows (sample_bench.csv)", "sampling", digits=2)

# %% [markdown]
# ## Sampling in seconds
#
# `medddpm bench-sample`: seeded weights and phantom masks, whole-head 128³, one untimed warm-up run (compilation and
# the capture of one denoising step as a CUDA graph), then whole sampling chains timed with CUDA events. The denoiser
# runs under inference mode in each configuration; in `bf16-graphs`, bf16 with compiled NDHWC kernels and one CUDA
# graph per step. Two levers only a sampler can pull, each a configuration of its own that training refuses:
# `fast-w16` stores the convolution and linear weights in bf16 once (the numbers autocast casts them to at every
# call), and `fast-w16-p8` also pads the 3-channel stem and the 1-channel output convolution with zero channels to 8
# (the same sums). `fast-w16-p8-tnorm` also runs GroupNorm + SiLU through the Triton kernels of
# `medddpm/net/kernels.py`, which read and write each activation the fewest times the operation allows (the training
# step's lever, see {doc}`07_kernels`). `fast-w16-tnorm-tconv` runs those norm kernels and, instead of the padding,
# the Triton thin convolutions of the same module for the stem and the output convolution. `fast-w16-tnorm-tconv-fold`
# also adds each ResBlock's first convolution bias inside the norm kernels, with the timestep embedding, instead of in
# a kernel of its own (the training step's `fold_conv_bias`).

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-sampling", "caption": "Seconds per generated 128³ volume (whole-head model, batch 1, CUDA events after one warm-up chain) for DDPM (all 250 steps) and DDIM 50, per configuration and GPU; dashed lines: the targets (DDIM 50 ≤ 1 s, DDPM 250 ≤ 4 s a volume on the H200). The paper reports no sampling times."}}
if SB.empty:
    plots.finish(plots.no_data("128³ sampling benchmarks (sample_bench.csv)", "sampling"))
else:
    plots.finish(plots.sampling(SB[SB["batch"] == 1], quality_tables.SAMPLING_TARGETS_S))

# %% tags=["hide-input"]
if not SB.empty:
    display(table(SB[["gpu_slug", "config", "sampler", "steps", "eta", "batch", "s_per_volume_median", "s_per_volume_min",
                      "s_per_volume_max", "peak_mem_gib"]], 3))

# %% [markdown]
# Each GPU's fastest sampler (the fastest rung with DDIM 50) against the targets: at batch 1 (`met`), and as
# throughput (`met from batch`: the smallest batch whose seconds a volume meet the target; each volume of a batch still
# waits for the whole batch, so the targets are judged at batch 1). `samples judged` says how its samples were checked
# on the trained checkpoint below; a sampler whose samples were not checked does not yet count for the targets.

# %% tags=["hide-input"]
plots.show_table(TG, "the fastest sampler against the targets (sample_bench.csv, sampling/denoise_kernels.csv)",
                 "sampling", digits={"s a volume": 2, "× opt1": 1, "target (s)": 0, "ms a step": 1,
                                     "kernel ms a step": 1, "kernels alone (s)": 2})

# %% [markdown]
# `fast-w16-tnorm-tconv-fold-up` also runs the decoder's trilinear ×2 upsampling as one Triton kernel that writes its
# output once (Inductor's kernels of the axis-by-axis reference write intermediates of the output's size). Two levers
# stand beside it, each measured on its own: `fast-w16-tnorm-tconv-fold-up-update` runs DDPM's update x_t → x_{t−1} as
# one compiled kernel instead of some thirty eager ones a step (its DDIM is fold-up's);
# `fast-w16-tnorm-tconv-fold-up-table` reads every ResBlock's time addend from a table computed once (Inductor then
# writes one small slice kernel per ResBlock, and the step got no faster). DDIM's η (the table's `eta`; older rows ran
# at 0, "Which sampler is right?" below says why the default is now 1) costs one noise draw a step, no time. The
# fastest sampler's rows at every η and batch:

# %% tags=["hide-input"]
plots.show_table(quality_tables.fastest_rows(root, TG), "the fastest sampler's rows", "sampling", digits=3)

# %% [markdown]
# Where one denoising step's time goes (torch.profiler over five warm DDIM steps, kernels inside the replayed CUDA
# graph included), milliseconds per step by kernel category:

# %% tags=["hide-input"]
per_cat = quality_tables.denoise_categories(root, [SGPU] if SGPU else [])
if per_cat.empty:
    print(plots.no_data_text("denoising-step kernel tables (sampling/denoise_kernels.csv)", "sampling"))
else:
    display(table(per_cat, 2, index=True))

# %% [markdown]
# A `bf16-graphs` denoising step (its column) spends most of its kernel time in convolutions and in cuDNN's
# NCHW↔NHWC transposes (`layout transform`). Under inference mode the compiled network casts each weight to bf16
# inside its graph, and Inductor lays those casts and the activations around them out NCDHW (in training, the
# activations saved for the backward pass keep the eager NDHWC layout); cuDNN then transposes the input, the weight and
# the output of almost every convolution. With the weights stored in bf16 once, Inductor keeps every activation NDHWC;
# with the two odd-channel convolutions padded, no small-channel kernel, copy or transpose is left either (the later
# rungs' columns). What is left is convolutions and the Triton normalization kernels: the per-layer work of the
# training step (every convolution at its shape's best, every norm at its minimal bytes) is what would take DDPM under
# its target. The targets table's DDPM row sets a step's time beside its kernels' (`kernel ms a step`): `kernels alone`
# is the chain with no time between kernels (the gaps between the graph's kernels and the sampler's own small update
# kernels); where it is still above the target, the kernels themselves must get faster.

# %% [markdown]
# ## Which sampler is right?
#
# A faster sampler counts only if its samples are as good as DDPM 250's from the same checkpoint, so first a
# checkpoint worth judging. `medddpm train --config bf16-graphs --held-out 2 --eval-every 1000` trains on the 6
# training subjects (64³, learning rate 10⁻⁴, batch 1) and every 1,000 steps evaluates the denoising loss of the 2
# held-out subjects, on the same fixed noised inputs and with the same FP32 evaluator each time (`heldout.csv`),
# keeping the checkpoint of the lowest loss (`best.pt`); `--time-limit` and `--resume` split the run into device
# calls.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-converge", "caption": "Held-out denoising loss (L1 on ε, mean over the 2 held-out subjects and 6 timesteps) of `medddpm train --config bf16-graphs` on the 6 training subjects (64³), for the model's weights and their EMA (which sampling uses); dashed: the EMA's lowest point; red: the step of the checkpoint sampled below (the same recipe, trained again)."}}
curve = quality_tables.heldout_curve(root, QGPU) if QGPU else None
if curve is not None and not curve.empty:
    low, sampled = quality_tables.plateau(curve), quality_tables.plateau(quality_tables.heldout_curve(root, QGPU, "samplers_heldout"))
    plots.finish(plots.heldout_curve(curve, low["best_step"], sampled["last_step"] if sampled else None))
else:
    plots.finish(plots.no_data("held-out loss curve (quality/converge_heldout.csv)", "quality"))

# %% [markdown]
# The EMA's held-out loss reaches its lowest point (dashed) and rises after it: past that point the model learns its
# six training subjects, not the task. The checkpoint sampled here is the same recipe trained again to about that
# point (red).
#
# From it, each sampler drew samples of the held-out subjects under `bf16-graphs` and under the fastest sampling
# configuration of the time, `fast-w16-tnorm-tconv`, and every sample was compared with its subject's real image
# (`scripts/quality.py samplers` → `quality/samplers.csv`): the mean intensity of the background (outside the brain
# mask; the real image's is the table's `real` row), the Pearson correlation with the real image inside the brain,
# PSNR and SSIM. A run *matches DDPM 250* when its background mean lies within 0.1 of DDPM 250's and its in-brain
# correlation at most 0.05 below, both as means over all samples of the run.

# %% tags=["hide-input"]
runs = quality_tables.samplers(root, QGPU) if QGPU else None
if runs is None or runs.empty:
    print(plots.no_data_text("sampler runs (quality/samplers.csv)", "quality"))
else:
    summary = quality_tables.sampler_summary(runs)
    display(table(summary.rename(columns={
        "background": "background mean", "background_sd": "sd over samples", "background_se": "standard error",
        "brain_corr": "in-brain r", "brain_corr_min": "lowest r", "psnr_db": "PSNR, dB", "ssim": "SSIM",
        "matches_ddpm250": "matches DDPM 250"}), 3))

# %% [markdown]
# Read from the table (the history at the end of the chapter keeps the figures as first written):
# - **Deterministic DDIM is what was wrong, at any step count.** With η = 0 the in-brain correlation falls well below
#   DDPM 250's at 50 steps and at all 250, so neither the step count nor the spacing of the steps is the cause:
#   without fresh noise at each step the chain does not forgive the model's errors. The samplers' equations themselves
#   are tested against an exact denoiser (Gaussian data, whose optimal ε is known: `tests/test_diffusion.py`).
# - **DDIM 50 with η = 1 keeps DDPM's quality at a fifth of its steps** (`matches DDPM 250` in the table), so
#   `medddpm sample` and `bench-sample` default to η = 1 for DDIM.
# - **Clipping x̂₀ to [−1, 1] is needed.** Without it (`--no-clip`, DDPM's Algorithm 2 as published) every chain
#   diverges: the unclipped rows' background means lie far outside [−1, 1].
# - **No sampler draws a black background.** When measured, no clipped run lay within 0.1 of the real image's
#   background (the history), and single samples spread around their run's mean (`sd over samples`): a grey offset
#   whose level depends on the seed,
#   while the brain inside the mask is right. The model at its best held-out loss sets the background's level only
#   loosely, and a sampler cannot add what the model lacks. On real brains {doc}`14_anatomy` finds the cause,
#   ε-prediction's error in a volume's mean, and the fix: v-prediction (`train --prediction v`).
#
# ## From Python: one sampler, many calls
#
# `medddpm sample` builds its denoiser once per command and compiles it on first use; in a notebook, keep that object
# (`Sampler.from_checkpoint`, `medddpm/sample/sampler.py`: the README shows the calls) and call it again and again: a
# shape compiles once, then replays. Each mask's noise comes from a generator seeded by (seed, mask name), so its
# sample does not depend on the call, the batch or the rank. Compiled work is kept in `MEDDDPM_CACHE` (default
# `~/.cache/medddpm`) for later processes, and `medddpm warmup --checkpoint RUN/best.pt` fills it ahead of time; how
# `sample` picks its configuration without `--config` is in {doc}`15_time_to_result`.

# %% [markdown]
# ## History
#
# What earlier measurements of this chapter found, each row computed once from the store by the reader of its day
# (`history.json`'s `frozen_by`).

# %% tags=["hide-input"]
plots.show_table(history.table(root, [QGPU] if QGPU else [], "quality", "10_sampling"),
                 "chapter 10's history (quality/history.json)", "quality")
