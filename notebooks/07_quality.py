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
# # Quality and sampling
#
# The paper says its interventions speed training up "without degrading synthesis quality" and
# never measures quality. This chapter times sampling, then asks three questions of every
# configuration, each a step further from the arithmetic: does it compute the same network
# (ε-prediction against an FP64 forward), does it train the same model (held-out loss after
# training, against the seed-to-seed spread of the FP32 baseline), and does it sample the same
# volumes (one trained checkpoint sampled under every configuration). Everything here is measured
# by `scripts/quality_measure.sh` (logic in `medddpm/train/parity.py` and `medddpm/sample/quality.py`)
# and read from `data/results/<gpu>/quality/`.

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # True: time sampling on this machine's GPU first (bench-sample; quality runs: scripts/quality_measure.sh)
size = 128  # volume side when measuring
configs = "opt1,bf16-graphs,fast-w16-p8,fast-w16-tnorm-tconv-fold-up"  # sampling configurations to measure (DDIM 50 and DDPM 250)

# %% tags=["remove-cell"]
import matplotlib.pyplot as plt
from IPython.display import display

from medddpm.report import plots, tables
from medddpm.report.measure import prepare
from medddpm.report import facts, few_step
from medddpm.report.notebook import glue_facts
from medddpm.report.present import table

root, G = prepare(results_dir, gpus, measure, "sampling", size, configs)
QG = [g for g in G if (root / g / "quality").is_dir()]  # GPUs with quality results
QGPU = facts.roles(QG)["ref"]  # the one this chapter's quality sections show
glue_facts(facts.quality_chapter(root, G))

# %% [markdown]
# ## Sampling in seconds
#
# `medddpm bench-sample`: seeded weights and phantom masks, whole-head 128³, one untimed warm-up
# run (compilation and the capture of one denoising step as a CUDA graph), then whole sampling
# chains timed with CUDA events. The denoiser runs under inference mode in each configuration; in
# `bf16-graphs`, bf16 with compiled NDHWC kernels and one CUDA graph per step. Two levers only a sampler
# can pull, each a configuration of its own that training refuses: `fast-w16` stores the
# convolution and linear weights in bf16 once (the numbers autocast casts them to at every call),
# and `fast-w16-p8` also pads the 3-channel stem and the 1-channel output convolution with zero
# channels to 8 (the same sums). `fast-w16-p8-tnorm` also runs GroupNorm + SiLU through the Triton
# kernels of `medddpm/net/kernels.py`, which read and write each activation the fewest times the
# operation allows (the training step's lever, see "Beyond the paper"). `fast-w16-tnorm-tconv`
# runs those norm kernels and, instead of the padding, the Triton thin convolutions of the same
# module for the stem and the output convolution. `fast-w16-tnorm-tconv-fold` also adds each
# ResBlock's first convolution bias inside the norm kernels, with the timestep embedding, instead
# of in a kernel of its own (the training step's `fold_conv_bias`).

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-sampling", "caption": "Seconds per generated 128³ volume (whole-head model, batch 1, CUDA events after one warm-up chain) for DDPM (all 250 steps) and DDIM 50, per configuration and GPU ({glue:text}`sample_gpus`); dashed lines: the targets (DDIM 50 ≤ 1 s, DDPM 250 ≤ 4 s a volume on the H200). The paper reports no sampling times."}}
SB = tables.sample_bench(root, G)  # 128³ rows, every batch
if SB.empty:
    plots.finish(plots.no_data("128³ sampling benchmarks (sample_bench.csv)", "sampling"))
else:
    plots.finish(plots.sampling(SB[SB["batch"] == 1], facts.SAMPLING_TARGETS_S))

# %% tags=["hide-input"]
if not SB.empty:
    display(table(SB[["gpu_slug", "config", "sampler", "steps", "eta", "batch", "s_per_volume_median", "s_per_volume_min",
                      "s_per_volume_max", "peak_mem_gib"]], 3))

# %% [markdown]
# On the {glue:text}`samp_ref_gpu` the fastest sampler, {glue:text}`samp_best`, samples a volume
# with DDIM 50 in {glue:text}`samp_best_ddim_s` s ({glue:text}`samp_best_ddim_vs_opt1`× faster than
# `opt1`) and with DDPM's 250 steps in {glue:text}`samp_best_ddpm_s` s
# ({glue:text}`samp_best_ddpm_vs_opt1`×): it {glue:text}`samp_best_ddim_verdict` the DDIM target
# of {glue:text}`samp_best_ddim_target` s and {glue:text}`samp_best_ddpm_verdict` the DDPM target
# of {glue:text}`samp_best_ddpm_target` s; {glue:text}`samp_best_quality`. `bf16-graphs` took {glue:text}`samp_bf16-graphs_ddim_s` s and
# {glue:text}`samp_bf16-graphs_ddpm_s` s; `fast-w16` {glue:text}`samp_fast-w16_ddim_s` s and
# {glue:text}`samp_fast-w16_ddpm_s` s; `fast-w16-p8-tnorm` {glue:text}`samp_fast-w16-p8-tnorm_ddim_s` s and
# {glue:text}`samp_fast-w16-p8-tnorm_ddpm_s` s; `fast-w16-tnorm-tconv`
# {glue:text}`samp_fast-w16-tnorm-tconv_ddim_s` s and {glue:text}`samp_fast-w16-tnorm-tconv_ddpm_s` s;
# `fast-w16-tnorm-tconv-fold` {glue:text}`samp_fast-w16-tnorm-tconv-fold_ddim_s` s and
# {glue:text}`samp_fast-w16-tnorm-tconv-fold_ddpm_s` s; `fast-w16-tnorm-tconv-fold-up`, which also
# runs the decoder's trilinear ×2 upsampling as one Triton kernel that writes its output once
# (Inductor's kernels of the axis-by-axis reference write intermediates of the output's size),
# {glue:text}`samp_fast-w16-tnorm-tconv-fold-up_ddim_s` s and
# {glue:text}`samp_fast-w16-tnorm-tconv-fold-up_ddpm_s` s. Two levers stand beside it, each
# measured on its own: `fast-w16-tnorm-tconv-fold-up-update` runs DDPM's update x_t → x_{t−1} as
# one compiled kernel instead of some thirty eager ones a step (its DDIM is fold-up's), DDPM 250
# {glue:text}`samp_fast-w16-tnorm-tconv-fold-up-update_ddpm_s` s; `fast-w16-tnorm-tconv-fold-up-table`
# reads every ResBlock's time addend from a table computed once, DDPM 250
# {glue:text}`samp_fast-w16-tnorm-tconv-fold-up-table_ddpm_s` s (Inductor then writes one small
# slice kernel per ResBlock, and the step got no faster).
# DDIM's η (the table's `eta`; older rows ran at 0, "Which sampler is right?" below says why the
# default is now 1) costs one noise draw a step, no time: {glue:text}`samp_best` took
# {glue:text}`samp_best_ddim_etas`. Several volumes a batch, seconds per volume with DDIM 50
# ({glue:text}`samp_best`): {glue:text}`samp_best_ddim_batches`, and with DDPM 250:
# {glue:text}`samp_best_ddpm_batches`. Against the DDIM target, {glue:text}`samp_best_ddim_batch_meets`;
# against the DDPM target, {glue:text}`samp_best_ddpm_batch_meets`. Batching is a throughput knob:
# each volume of a batch still waits for the whole batch, so the targets above are judged at batch 1.
#
# Where one denoising step's time goes (torch.profiler over five warm DDIM steps, kernels inside
# the replayed CUDA graph included), milliseconds per step by kernel category:

# %% tags=["hide-input"]
SGPU = facts.roles(SB["gpu_slug"] if not SB.empty else [])["ref"]  # the GPU the prose above quotes
per_cat = tables.denoise_categories(root, [SGPU] if SGPU else [])
if per_cat.empty:
    print(plots.no_data_text("denoising-step kernel tables (sampling/denoise_kernels.csv)", "sampling"))
else:
    display(table(per_cat, 2, index=True))

# %% [markdown]
# A `bf16-graphs` denoising step takes {glue:text}`denoise_fast_ms` ms of kernel time, of which
# convolutions {glue:text}`denoise_fast_conv_ms` ms and cuDNN's NCHW↔NHWC transposes
# {glue:text}`denoise_fast_layout_ms` ms. Under inference mode the compiled network casts each
# weight to bf16 inside its graph, and Inductor lays those casts and the activations around them
# out NCDHW (in training, the activations saved for the backward pass keep the eager NDHWC
# layout); cuDNN then transposes the input, the weight and the output of almost every
# convolution. With the weights stored in bf16 once, Inductor keeps every activation NDHWC; with
# the two odd-channel convolutions padded, no small-channel kernel, copy or transpose is left
# either: a {glue:text}`denoise_best_config` step (the fastest sampler with a kernel table) takes
# {glue:text}`denoise_best_ms` ms, convolutions
# {glue:text}`denoise_best_conv_ms` ms, transposes {glue:text}`denoise_best_layout_ms` ms. What is
# left is convolutions and the Triton normalization kernels: the per-layer work of the training
# step (every convolution at its shape's best, every norm at its minimal bytes) is what would take
# DDPM under its target. DDPM 250 of {glue:text}`samp_best` takes {glue:text}`samp_best_ddpm_step_ms`
# ms a step, of which its kernels take {glue:text}`samp_best_kernel_ms` ms; with no time between
# them (the gaps between the graph's kernels and the sampler's own small update kernels) DDPM 250
# would take {glue:text}`samp_best_kernels_only_s` s: {glue:text}`samp_best_gap_verdict`.

# %% [markdown]
# ## Does every configuration compute the same network?
#
# The ε-prediction of seeded weights (whole-head model, its zero-initialised layers jittered so ε
# is not zero) on fixed (x_t, mask, t) inputs, each configuration on the GPU against the same
# network in float64 on the CPU (`medddpm.train.parity.denoiser_agreement`, reference `fp64-cpu`), at
# 64³ (the FP64 CPU forward at 128³ would take minutes per input). TF32 keeps 10 mantissa bits and
# bf16 8, so relative errors near 10⁻³ and 10⁻² are what their rounding alone gives.

# %% tags=["hide-input"]
A = tables.quality_csv(root, QG, "agreement")
if A.empty:
    print(plots.no_data_text("denoiser agreement (quality/agreement.csv)", "quality"))
else:
    A = A[A["gpu_slug"] == QGPU]
    display(table(A.pivot_table(index="config", columns="t", values="rel_l2", sort=False)
                  .rename(columns=lambda t: f"relative L2, t = {t}"), 6, index=True))
    display(table(A.pivot_table(index="config", columns="t", values="max_abs", sort=False)
                  .rename(columns=lambda t: f"max |Δε|, t = {t}"), 4, index=True))

# %% [markdown]
# The FP32 configurations (baseline, and `opt2`, which only changes the layout) agree with FP64 to
# {glue:text}`q_baseline_rel` (worst relative L2 over t); the TF32 ones to
# {glue:text}`q_opt1_rel` (`opt1`); the bf16 ones to {glue:text}`q_bf16_rel` (`bf16`),
# {glue:text}`q_bf16-graphs_rel` (`bf16-graphs`), {glue:text}`q_fast-w16_rel` (`fast-w16`) and
# {glue:text}`q_fast-w16-p8_rel` (`fast-w16-p8`); with the Triton norm kernels
# {glue:text}`q_fast-tnorm_rel` (`fast-tnorm`) and {glue:text}`q_fast-w16-p8-tnorm_rel`
# (`fast-w16-p8-tnorm`); with the thin-convolution kernels as well
# {glue:text}`q_fast-tnorm-tconv_rel` (`fast-tnorm-tconv`) and
# {glue:text}`q_fast-w16-tnorm-tconv_rel` (`fast-w16-tnorm-tconv`); with the folded convolution
# bias too (the other two levers of `fast` change only the backward) {glue:text}`q_fast_rel`
# (`fast`) and {glue:text}`q_fast-w16-tnorm-tconv-fold_rel` (`fast-w16-tnorm-tconv-fold`); against an ε whose RMS is
# {glue:text}`q_rms`.
# Each sits at its format's rounding level: none adds error of its own, and the sampling levers
# compute the same network as `bf16-graphs`.

# %% [markdown]
# ## Does every configuration train the same model?
#
# The real training loop (`medddpm.train.trainer.Trainer`) on the MNI152-based demo set (`medddpm
# demo-data`, 8 subjects at 64³: the template's anatomy with random lesions and noise), trained on
# 6 subjects and evaluated on the 2 held out: 1,000 Adam steps (batch 1, no accumulation, learning
# rate 10⁻⁴), the same seeded data order, diffusion times and noise in every configuration. Every 100
# steps the held-out loss, L1 between ε and ε_θ at fixed (x0, t, ε) triples (both held-out
# subjects × t ∈ {1, 25, 50, 125, 200, 249}), always computed by the FP32 baseline forward, so it
# judges the weights, not the evaluator. Baseline with three seeds gives the spread; the band is
# the 95 % prediction interval of one more seed (mean ± t₀.₉₇₅,₂ · s · √(1 + 1/3)).

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-parity", "caption": "Training parity on {glue:text}`q_gpu`: held-out denoising loss (L1, the same FP32 evaluator for every configuration) over {glue:text}`p_steps` training steps at 64³ on the MNI152 demo subjects; baseline seeds 0–2 and their 95 % prediction band for one more seed, and one seed of each other configuration."}}
PC, PV = tables.parity_curves(root, QG), tables.parity_verdict(root, QG)
if not PV.empty:
    PV = PV[PV["gpu_slug"] == QGPU]
    plots.finish(plots.parity(PC, PV, QGPU))
else:
    plots.finish(plots.no_data("training-parity runs (quality/parity_*.csv)", "quality"))

# %% tags=["hide-input"]
if not PV.empty:
    display(table(PV[["config", "seed", "steps", "loss_step0", "loss", "band_low", "band_high", "inside_band"]]
                  .rename(columns={"loss_step0": "held-out loss, step 0", "loss": "held-out loss, end",
                                   "band_low": "band, low", "band_high": "band, high",
                                   "inside_band": "inside the band"}), 4))

# %% [markdown]
# On the {glue:text}`q_gpu`, the held-out loss falls from {glue:text}`p_start` to the baseline
# seeds' {glue:text}`p_seeds` after {glue:text}`p_steps` steps; the prediction band is
# {glue:text}`p_band`. The other configurations end at {glue:text}`p_range`:
# **{glue:text}`p_inside`** lie inside the band. At this length and scale, none of the paper's
# interventions nor bf16 with the fused kernels, compile and CUDA graphs trains a measurably
# different model.

# %% [markdown]
# ## Do they sample the same volumes?
#
# The baseline checkpoint of seed 0 above, sampled under every configuration with the same seed
# (DDIM 50, η = 0, so the chain is deterministic given its start noise) on the two held-out masks:
# each sample against the FP32 (`baseline`) sample, voxel by voxel. PSNR and SSIM (3D, 7³ window,
# scikit-image) use the model's intensity range [−1, 1]; "real" is the subject's own image,
# for scale.

# %% tags=["hide-input"]
per = tables.sample_agreement(root, QGPU).drop("fast-long", errors="ignore") if QGPU else None
if per is None or per.empty:
    print(plots.no_data_text("sample agreement (quality/sample_agreement.csv)", "quality"))
else:
    display(table(per.rename(columns={"psnr_db": "PSNR, dB", "ssim": "SSIM", "mae": "mean |Δ|",
                                      "max_abs": "max |Δ|", "mae_brain": "mean |Δ| in brain"})
                  .rename_axis("sample (mean of 2 subjects)"), 4, index=True))

# %% [markdown]
# Against the FP32 sample, `opt1`'s sample reaches {glue:text}`s_opt1_psnr` (SSIM
# {glue:text}`s_opt1_ssim`), `opt2`'s is {glue:text}`s_opt2_psnr`, `bf16`'s
# {glue:text}`s_bf16_psnr` (SSIM {glue:text}`s_bf16_ssim`) and `bf16-graphs`'s {glue:text}`s_bf16-graphs_psnr`
# (SSIM {glue:text}`s_bf16-graphs_ssim`); the real image, for scale, is at {glue:text}`s_real_psnr`.
# Rounding differences grow along the 50 denoising steps but stay far below the difference between
# a sample and the anatomy it stands for. Where they sit, the difference maps show (absolute
# difference to the FP32 sample; black 0, yellow 0.05 or more on the [−1, 1] scale):

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-diff", "caption": "Where the configurations' samples differ from the FP32 sample ({glue:text}`q_gpu`, same checkpoint, seed and DDIM 50 chain): orthogonal slices through the held-out subject's lesion, the FP32 sample first, then the absolute difference of each configuration (black 0, yellow ≥ 0.05 on the [−1, 1] intensity scale)."}}
SL = tables.quality_slices(root, QGPU) if QGPU else None
if SL is not None:
    plots.finish(plots.slices(SL, sorted(SL["subject"].unique())[:1],
                              {"baseline": "FP32 sample", "opt1": "|opt1 − FP32|", "pytorch-default": "|default − FP32|",
                               "bf16": "|bf16 − FP32|", "bf16-graphs": "|fast − FP32|"}, diff_to="baseline"))
else:
    plots.finish(plots.no_data("sample slices (quality/slices.parquet)", "quality"))

# %% [markdown]
# Intensities inside the brain mask, per source, for each held-out subject (`fast-long`: a
# 20,000-step model, `medddpm train --config bf16-graphs` on the same 6 training subjects, sampled with
# `bf16-graphs`):

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-hist", "caption": "Intensity histograms inside the brain mask of each held-out subject ({glue:text}`q_gpu`): the real image, the FP32 (`baseline`) and `bf16-graphs` samples of the 1,000-step checkpoint, and `bf16-graphs` samples of the 20,000-step model (`fast-long`)."}}
H = tables.quality_csv(root, QG, "histograms")
if not H.empty:
    H = H[H["gpu_slug"] == QGPU]
    subjects = sorted(H["subject"].unique())
    fig, axes = plt.subplots(len(subjects), 1, figsize=(8, 3.2 * len(subjects)), squeeze=False)
    for ax, s in zip(axes[:, 0], subjects):
        plots.histograms(H, ["real", "baseline", "bf16-graphs", "fast-long"], s, ax)
        ax.set_title(f"held-out subject {s}")
    plots.finish(fig)
else:
    plots.finish(plots.no_data("brain histograms (quality/histograms.csv)", "quality"))

# %% [markdown]
# The configurations' histograms (`baseline`, `bf16-graphs`) lie on top of each other. Neither has the
# real image's two tissue peaks: after 1,000 steps the model has learnt where the brain is, not
# yet its tissue contrast. `fast-long`, the 20,000-step model, is closer in shape but brighter
# than the real image inside the brain.

# %% [markdown]
# ## Which sampler is right?
#
# A faster sampler counts only if its samples are as good as DDPM 250's from the same checkpoint,
# so first a checkpoint worth judging. `medddpm train --config bf16-graphs --held-out 2 --eval-every 1000`
# trains on the 6 training subjects (64³, learning rate 10⁻⁴, batch 1) and every 1,000 steps evaluates the
# denoising loss of the 2 held-out subjects, on the same fixed noised inputs and with the same FP32
# evaluator each time (`heldout.csv`), keeping the checkpoint of the lowest loss (`best.pt`);
# `--time-limit` and `--resume` split the run into device calls.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-converge", "caption": "Held-out denoising loss (L1 on ε, mean over the 2 held-out subjects and 6 timesteps) of `medddpm train --config bf16-graphs` on the 6 training subjects ({glue:text}`q_gpu`, 64³), for the model's weights and their EMA (which sampling uses); dashed: the EMA's lowest point; red: the step of the checkpoint sampled below (the same recipe, trained again)."}}
curve = tables.heldout_curve(root, QGPU) if QGPU else None
if curve is not None and not curve.empty:
    low, sampled = tables.plateau(curve), tables.plateau(tables.heldout_curve(root, QGPU, "samplers_heldout"))
    plots.finish(plots.heldout_curve(curve, low["best_step"], sampled["last_step"] if sampled else None))
else:
    plots.finish(plots.no_data("held-out loss curve (quality/converge_heldout.csv)", "quality"))

# %% [markdown]
# The EMA's held-out loss {glue:text}`cv_verdict` at step {glue:text}`cv_best_step`
# ({glue:text}`cv_best_loss`) and was {glue:text}`cv_rise` higher by step {glue:text}`cv_last_step`
# ({glue:text}`cv_last_loss`): past that point the model learns its six training subjects, not
# the task (the run took {glue:text}`cv_ms` ms a step). The checkpoint sampled here is the same
# recipe trained to step {glue:text}`sm_ckpt_step` (held-out loss {glue:text}`sm_ckpt_loss`).
#
# From it, each sampler drew {glue:text}`sm_n` samples under `bf16-graphs` and under the fastest sampling
# configuration, `fast-w16-tnorm-tconv`, and every sample was compared with its subject's real
# image (`scripts/quality.py samplers` → `quality/samplers.csv`): the mean intensity of the
# background (outside the brain mask; the real image's is {glue:text}`sm_real_bg`), the Pearson
# correlation with the real image inside the brain, PSNR and SSIM. A run *matches DDPM 250* when
# its background mean lies within 0.1 of DDPM 250's and its in-brain correlation at most 0.05 below,
# both as means over all samples of the run.

# %% tags=["hide-input"]
runs = tables.samplers(root, QGPU) if QGPU else None
if runs is None or runs.empty:
    print(plots.no_data_text("sampler runs (quality/samplers.csv)", "quality"))
else:
    summary = tables.sampler_summary(runs)
    display(table(summary.rename(columns={
        "background": "background mean", "background_sd": "sd over samples", "background_se": "standard error",
        "brain_corr": "in-brain r", "brain_corr_min": "lowest r", "psnr_db": "PSNR, dB", "ssim": "SSIM",
        "matches_ddpm250": "matches DDPM 250"}), 3))

# %% [markdown]
# - **Deterministic DDIM is what was wrong, at any step count.** With η = 0 the in-brain
#   correlation falls to {glue:text}`sm_ddim50_eta0_bf16-graphs_corr` at 50 steps and to
#   {glue:text}`sm_ddim250_eta0_bf16-graphs_corr` at all 250 (`bf16-graphs`; DDPM 250:
#   {glue:text}`sm_ddpm250_bf16-graphs_corr`), so neither the step count nor the spacing of the steps is
#   the cause: without fresh noise at each step the chain does not forgive the model's errors. The
#   samplers' equations themselves are tested against an exact denoiser (Gaussian data, whose
#   optimal ε is known: `tests/test_diffusion.py`).
# - **DDIM 50 with η = 1 keeps DDPM's quality at a fifth of its steps**: in-brain correlation
#   {glue:text}`sm_ddim50_eta1_fast-w16-tnorm-tconv_corr` under `fast-w16-tnorm-tconv` (matches:
#   {glue:text}`sm_ddim50_eta1_fast-w16-tnorm-tconv_match`) and {glue:text}`sm_ddim50_eta1_bf16-graphs_corr`
#   under `bf16-graphs` (matches: {glue:text}`sm_ddim50_eta1_bf16-graphs_match`;
#   {glue:text}`sm_ddim50_eta1_bf16-graphs_vs`). `medddpm sample`
#   and `bench-sample` therefore default to η = 1. The fastest DDIM chain is
#   {glue:text}`sm_rec`: {glue:text}`sm_rec_s` s per 128³ volume on the {glue:text}`sm_rec_gpu`,
#   which {glue:text}`sm_rec_verdict` the 1 s target.
# - **Clipping x̂₀ to [−1, 1] is needed.** Without it (`--no-clip`, DDPM's Algorithm 2 as
#   published) every chain diverges: background means {glue:text}`sm_noclip_bg`, in-brain
#   correlation at most {glue:text}`sm_noclip_corr`.
# - **No sampler draws a black background.** Of the clipped runs, {glue:text}`sm_black` lies within
#   0.1 of the real image's background; DDPM 250's is {glue:text}`sm_ddpm250_bf16-graphs_bg` and
#   {glue:text}`sm_ddpm250_fast-w16-tnorm-tconv_bg`, and single samples spread by
#   {glue:text}`sm_bg_sd` (standard deviation): a uniform grey offset whose level depends on the
#   seed, while the brain inside the mask is right. The model at its best held-out loss sets the
#   background's level only loosely, and a sampler cannot add what the model lacks; more training
#   subjects, or a loss that weighs the noisiest steps more, are where to look next.

# %% [markdown]
# ## A dozen steps instead of 250
#
# DDPM's 250 denoiser calls decide the sampling time, not the kernels. `medddpm sample` also has
# few-step solvers of the same reverse process (`medddpm/diffusion/solvers.py`, each from its paper's
# equations): DPM-Solver++(2M) in its ODE and SDE forms, a third-order multistep of the same
# exponential integrator, and DEIS's iPNDM (the reference repository's 10-step sampler), each on
# timesteps spaced uniformly in time, quadratically, or uniformly in log-SNR. With the `fast`
# configuration, a solver's whole chain, updates included, replays as one CUDA graph.
#
# **The gate.** A sampler passes only inside FP32 DDPM 250's band: a converged checkpoint
# (64³, the demo set's 2 held-out masks) is sampled with {glue:text}`fs_seeds` seeds by FP32 DDPM 250
# and by each candidate; on every held-out subject, the mean over the candidate's seeds of its in-brain
# correlation with the real image must not fall below DDPM's lowest seed, its background mean must
# lie between DDPM's lowest and highest, its in-brain intensity histogram's Wasserstein-1 distance
# to the real image's must not exceed DDPM's highest, and the 3D SSIM between its seeds must not
# exceed DDPM's highest (fewer steps must not collapse the samples onto one). Measured on the
# {glue:text}`fs_gpu` by `scripts/quality.py gate` (logic in `medddpm/sample/gate.py`); the table
# shows the {glue:text}`fs_runs` runs of the checkpoint that judged the recommended sampler
# ({glue:text}`fs_ckpt`), beside their verdicts at the store's other checkpoints
# ({glue:text}`fs_checkpoints` in all).

# %% tags=["hide-input"]
FSG = few_step.gate_gpu(root, G)
table(few_step.passing_runs(root, FSG), digits={"in-brain r": 3, "background": 3, "W1": 3,
                                                "SSIM between seeds": 3, "s / volume (128³)": 3})

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-few-step", "caption": "Time per generated 128³ volume (batch 1, `bench-sample`, {glue:text}`fs_gpu`) against the gate's three measures per held-out subject (64³ checkpoint, mean over the seeds), for the runs that were timed; grey: FP32 DDPM 250's band over its seeds (for the correlation: at or above its lowest; for W1: at or below its highest)."}}
plots.finish(few_step.tradeoff(root, FSG))

# %% [markdown]
# - **The recommended sampler is {glue:text}`fs_rec`** (`medddpm sample`'s default): its verdict
#   is {glue:text}`fs_rec_verdict`, and it samples a 128³ volume in {glue:text}`fs_rec_s` s on the
#   {glue:text}`fs_gpu` ({glue:text}`fs_rec_batches`): {glue:text}`fs_vs_ddpm_fast`× faster than
#   DDPM 250 on the same denoiser ({glue:text}`fs_ddpm_fast_s` s), {glue:text}`fs_vs_opt1`× faster
#   than DDPM 250 under the paper's OPT1 ({glue:text}`fs_ddpm_opt1_s` s) and {glue:text}`fs_vs_fp32`×
#   faster than under FP32 ({glue:text}`fs_ddpm_fp32_s` s). The target of 0.2 s on the H200:
#   {glue:text}`fs_target`.
# - **Ten steps miss, narrowly.** The same solver at 10 steps ({glue:text}`fs_10_s` s) is
#   {glue:text}`fs_10_verdict`: its histogram distance is {glue:text}`fs_10_w1`. Its FP8 form
#   (`fast-fp8`, {glue:text}`fs_fp8_10_s` s) is {glue:text}`fs_fp8_10_verdict` on this checkpoint, and
#   {glue:text}`fs_fp8_10_other`: this close to the band's edge the verdict follows the checkpoint and
#   the seeds, so the default takes the fewest steps that passed under `fast`.
# - **Only the stochastic form keeps the model's quality.** The deterministic solvers (ODE
#   DPM-Solver++, iPNDM) lose the in-brain correlation at 10 steps
#   ({glue:text}`fs_ode_corr`, against DDPM's {glue:text}`fs_ref_corr`), as deterministic DDIM does
#   at any step count: fresh noise at every step forgives the model's errors.
# - **The spacing matters more than the order.** The stochastic solver at 10 steps, by spacing and
#   checkpoint: {glue:text}`fs_spacings` (call 1's checkpoint stopped at 10,000 steps, before its
#   held-out loss reached its plateau). Uniform in log-SNR over the whole schedule (`logsnr-full`)
#   spends 4 of 10 steps where x_t is still noise: the cosine schedule's last, clipped β puts
#   λ(T − 1) far below the rest. `logsnr` spaces the steps uniformly over the unclipped schedule after
#   T − 1. The solvers' equations are tested against an exact denoiser (Gaussian data:
#   `tests/test_solvers.py`).

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-few-step-slices", "caption": "One held-out subject (64³, seed 0, the gate's checkpoint, {glue:text}`fs_gpu`): its mask, the real image, FP32 DDPM 250 and the few-step runs whose slices the gate kept (the stochastic solver at 10 and 20 steps bracket the recommended 12; the deterministic iPNDM at 10)."}}
FSL = few_step.slices(root, FSG)
if FSL is not None:
    plots.finish(plots.slices(FSL[0], sorted(FSL[0]["subject"].unique()), FSL[1]))
else:
    plots.finish(plots.no_data("the sampler gate's slices (quality/sampler_gate_slices.parquet)", "quality"))

# %% [markdown]
# ## Are the fast samplers' samples the model's?
#
# The samplers above were compared within each configuration's own numerics. Speed counts only
# with the model's output, so the bf16 sampling configurations are also set beside the FP32
# network. First their ε from trained weights: the EMA weights of {glue:text}`sn_bias_n`
# checkpoints of the recipe above (64³, step 14,000), on the held-out subjects at 6 timesteps,
# against the FP32 baseline on the same GPU (`scripts/quality.py agree --checkpoint` →
# `quality/agreement_trained.csv`). Seeded weights (the agreement table above) have small jittered
# biases; trained ones have real ones.

# %% tags=["hide-input"]
bias = tables.eps_bias(root, [QGPU]) if QGPU else None
if bias is None or bias.empty:
    print(plots.no_data_text("trained-weights ε agreement (quality/agreement_trained.csv)", "quality"))
else:
    display(table(bias.drop(columns=["gpu_slug"]).rename(columns={
        "mean_err": "ε error, signed mean", "worst_mean_err": "largest |signed mean|",
        "rel_l2": "worst relative L2", "checkpoints": "checkpoints"}), 5))

# %% [markdown]
# ε's error has a constant part under {glue:text}`sn_offset` (signed mean above 3 × 10⁻⁴), and
# none under {glue:text}`sn_no_offset`. `bf16-graphs`'s offset is {glue:text}`sn_bias_bf16-graphs` on average
# (up to {glue:text}`sn_bias_bf16-graphs_worst`), while its relative L2 error, {glue:text}`sn_l2_bf16-graphs`,
# is at the level of the others: relative L2 does not see an offset this small. It goes with the
# thin convolutions (the stem's 3 channels in, the output's 1 out) in cuDNN's bf16 kernels, and
# goes away with `triton_conv`, whose kernels sum in fp32, add the bias and round once
# (`fast-w16-tnorm-tconv`: {glue:text}`sn_bias_fast-w16-tnorm-tconv`,
# `fast-w16-tnorm-tconv-fold`: {glue:text}`sn_bias_fast-w16-tnorm-tconv-fold`).
#
# The two convolutions alone (`scripts/probes/thin_offset_probe.py`, {glue:text}`sn_probe_gpu`, 64³,
# seeded bf16 inputs and weights, a bias of 0.3, against float64 of the same numbers) show where:
# cuDNN's output convolution is offset by {glue:text}`sn_probe_out_cudnn_bias` with the bias and by
# {glue:text}`sn_probe_out_cudnn` without it, its stem by {glue:text}`sn_probe_stem_cudnn_bias`
# and {glue:text}`sn_probe_stem_cudnn`; `conv3d_thin` by {glue:text}`sn_probe_out_triton_bias` and
# {glue:text}`sn_probe_stem_triton_bias` with the bias. The offset comes with the bias in cuDNN's
# bf16 kernels; how it grows with the bias's value was not measured (one value, 0.3).
#
# A sampler adds ε up over its steps, so an offset moves the samples. One checkpoint (step
# {glue:text}`sn_step`) was sampled by DDPM 250 and DDIM 50 (η = 1) under the FP32 baseline and
# the bf16 configurations, {glue:text}`sn_n` each, and every run is judged against the FP32
# baseline's DDPM 250 (`quality/sampler_numerics.csv`; the same criterion as above).

# %% tags=["hide-input"]
numerics = tables.sampler_numerics(root, QGPU) if QGPU else None
if numerics is None or numerics.empty:
    print(plots.no_data_text("sampler runs beside FP32 (quality/sampler_numerics.csv)", "quality"))
else:
    display(table(tables.sampler_summary(numerics).rename(columns={
        "background": "background mean", "background_sd": "sd over samples", "background_se": "standard error",
        "brain_corr": "in-brain r", "brain_corr_min": "lowest r", "psnr_db": "PSNR, dB", "ssim": "SSIM",
        "matches_ddpm250": "matches FP32 DDPM 250"}), 3))

# %% [markdown]
# - The FP32 model's DDPM 250 samples have a background mean of
#   {glue:text}`sn_ddpm250_baseline_bg` (in-brain r {glue:text}`sn_ddpm250_baseline_corr`).
# - `bf16-graphs`'s DDPM 250: {glue:text}`sn_ddpm250_bf16-graphs_bg` (r {glue:text}`sn_ddpm250_bf16-graphs_corr`;
#   matches: {glue:text}`sn_ddpm250_bf16-graphs_match`). Its darker background lies nearer the real
#   image's, but it comes from ε's offset, not from the model.
# - `fast-w16-tnorm-tconv-fold`, DDPM 250: {glue:text}`sn_ddpm250_fast-w16-tnorm-tconv-fold_bg`
#   (r {glue:text}`sn_ddpm250_fast-w16-tnorm-tconv-fold_corr`; matches:
#   {glue:text}`sn_ddpm250_fast-w16-tnorm-tconv-fold_match`).
# - `fast-w16-tnorm-tconv-fold-up`, the fastest sampler (the same denoiser with the Triton
#   upsampling), DDPM 250: {glue:text}`sn_ddpm250_fast-w16-tnorm-tconv-fold-up_bg`
#   (r {glue:text}`sn_ddpm250_fast-w16-tnorm-tconv-fold-up_corr`; matches:
#   {glue:text}`sn_ddpm250_fast-w16-tnorm-tconv-fold-up_match`).
# - Its DDIM 50 (η = 1): {glue:text}`sn_ddim50_eta1_fast-w16-tnorm-tconv-fold-up_bg`
#   (r {glue:text}`sn_ddim50_eta1_fast-w16-tnorm-tconv-fold-up_corr`; matches:
#   {glue:text}`sn_ddim50_eta1_fast-w16-tnorm-tconv-fold-up_match`;
#   {glue:text}`sn_ddim50_eta1_fast-w16-tnorm-tconv-fold-up_vs`).
# - The FP32 model's own DDIM 50 (η = 1): {glue:text}`sn_ddim50_eta1_baseline_bg` (matches:
#   {glue:text}`sn_ddim50_eta1_baseline_match`; {glue:text}`sn_ddim50_eta1_baseline_vs`).
#
# The comparisons of the section before hold within each configuration's numerics. Where a Triton
# sampling variant's DDIM 50 and the FP32 model's own DDIM 50 get the same verdict, what DDIM 50
# changes is the sampler's, not the numerics'; `bf16-graphs`'s DDPM 250 samples are shifted by
# its ε offset.

# %% [markdown]
# ## FP8 convolutions: DDPM under 4 s, at what cost?
#
# The bf16 samplers stop at {glue:text}`samp_fast-w16-tnorm-tconv-fold-up-update_ddpm_s` s for DDPM 250
# (`fast-w16-tnorm-tconv-fold-up-update`): its convolutions take {glue:text}`fp8_step_bf16_conv_ms` of the
# {glue:text}`fp8_step_bf16_ms` ms of kernels a DDPM step runs. A sampler needs no backward, so it
# can take a lever training cannot: FP8 (E4M3) operands, through cuDNN's graph API
# (`medddpm/net/fp8.py`, `nvidia-cudnn-frontend`).
#
# - Activations are cast unscaled: E4M3 is a float, with 3 mantissa bits from 2⁻⁶ up to 448, where
#   it saturates. The Triton norm or upsampling kernel that produces a convolution's input writes it
#   in E4M3 directly, so no extra pass reads it.
# - Weights get one scale per output channel (each channel's largest magnitude at 448), frozen when
#   the sampler loads them.
# - cuDNN accumulates in fp32, multiplies by the per-channel descale and writes bf16.
#
# Each convolution shape alone (`scripts/probes/fp8_conv_probe.py`, the fastest of cuDNN's FP8 plans against
# PyTorch's autotuned bf16 convolution, CUDA graphs, `sampling/fp8_convs.csv`); the errors are
# against an fp32 convolution of the unquantized operands:

# %% tags=["hide-input"]
probe = tables.fp8_convs(root, SGPU) if SGPU else None
if probe is None or probe.empty:
    print(plots.no_data_text("FP8 convolution probe (sampling/fp8_convs.csv)", "sampling"))
else:
    display(table(probe.rename(columns={"cin": "in channels", "cout": "out channels", "side": "side (voxels)",
                                        "bf16_ms": "bf16 ms", "fp8_ms": "FP8 ms", "speedup": "speed-up",
                                        "bf16_rel_err": "bf16 error", "fp8_rel_err": "FP8 error",
                                        "fp8_plan": "cuDNN plan"}), 3))

# %% [markdown]
# At 128³, 64 → 64 channels goes from {glue:text}`fp8_probe_64_64_128_bf16` to
# {glue:text}`fp8_probe_64_64_128_fp8` ms ({glue:text}`fp8_probe_64_64_128_x`×) and the decoder's
# 128 → 64 (after a skip concatenation) from {glue:text}`fp8_probe_128_64_128_bf16` to
# {glue:text}`fp8_probe_128_64_128_fp8` ms ({glue:text}`fp8_probe_128_64_128_x`×); 128 → 128 at 64³
# gains nothing ({glue:text}`fp8_probe_128_128_64_x`×), so only convolutions of at most 64 output
# channels change (`fp8.MAX_OUT_CHANNELS`). The price is precision: each FP8 convolution is off by
# {glue:text}`fp8_probe_err` (relative RMS), a bf16 one by {glue:text}`fp8_probe_err_bf16`.
#
# Two configurations add the lever to `fast-w16-tnorm-tconv-fold-up-update`:
# - `…-fp8skip` changes only the decoder ResBlocks' first convolutions, whose input is a skip
#   concatenation (2C → C, the largest gain per convolution). DDPM 250:
#   {glue:text}`samp_fast-w16-tnorm-tconv-fold-up-update-fp8skip_ddpm_s` s ({glue:text}`samp_fast-w16-tnorm-tconv-fold-up-update-fp8skip_ddpm_verdict` the 4 s
#   target); DDIM 50: {glue:text}`samp_fast-w16-tnorm-tconv-fold-up-update-fp8skip_ddim_s` s.
# - `…-fp8` changes every ResBlock and upsampling convolution of at most 64 output channels. DDPM
#   250: {glue:text}`samp_fast-w16-tnorm-tconv-fold-up-update-fp8_ddpm_s` s ({glue:text}`samp_fast-w16-tnorm-tconv-fold-up-update-fp8_ddpm_verdict` it); DDIM 50:
#   {glue:text}`samp_fast-w16-tnorm-tconv-fold-up-update-fp8_ddim_s` s. Its DDPM step runs {glue:text}`fp8_step_fp8_ms` ms of
#   kernels, convolutions {glue:text}`fp8_step_fp8_conv_ms` ms.
#
# Are the FP8 samples right? A fresh checkpoint of the recipe above (64³, step
# {glue:text}`fp8_step`) was sampled by DDPM 250 and by the deterministic DDIM 50 (η = 0) under the
# FP32 baseline, `fast-w16-tnorm-tconv-fold-up-update` (bf16) and both FP8 configurations, {glue:text}`fp8_n`, each seed's noise
# the same in every configuration (`scripts/quality.py samplers --name precision --reference baseline`
# → `quality/precision.csv`, `precision_agreement.csv`). The first columns compare each run's
# samples with the FP32 samples of the same run and seed, voxel by voxel and by their background;
# the last ones, like the sections above, compare them with the real images, and judge each run
# against the FP32 baseline's DDPM 250.

# %% tags=["hide-input"]
prec = tables.precision(root, QGPU) if QGPU else None
if prec is None or prec.empty:
    print(plots.no_data_text("FP8 sample agreement (quality/precision*.csv)", "quality"))
else:
    cols = ["sampler", "steps", "eta", "config", "psnr_vs_fp32", "psnr_vs_fp32_min", "ssim_vs_fp32",
            "background_shift", "background_shift_se", "background", "background_se", "brain_corr", "matches_ddpm250"]
    display(table(prec[[c for c in cols if c in prec]].rename(columns={
        "psnr_vs_fp32": "PSNR vs FP32, dB", "psnr_vs_fp32_min": "lowest", "ssim_vs_fp32": "SSIM vs FP32",
        "background_shift": "background shift vs FP32", "background_shift_se": "its standard error",
        "background": "background mean", "background_se": "standard error", "brain_corr": "in-brain r",
        "matches_ddpm250": "matches FP32 DDPM 250"}), 3))

# %% [markdown]
# - **Voxel by voxel**, DDPM 250 against the FP32 samples: bf16 {glue:text}`fp8_ddpm250_bf16_psnr` dB
#   (lowest {glue:text}`fp8_ddpm250_bf16_psnr_min`), `…-fp8skip` {glue:text}`fp8_ddpm250_fp8skip_psnr` dB
#   (lowest {glue:text}`fp8_ddpm250_fp8skip_psnr_min`), `…-fp8` {glue:text}`fp8_ddpm250_fp8_psnr` dB
#   (lowest {glue:text}`fp8_ddpm250_fp8_psnr_min`). The bar is the earlier fast
#   sampler's agreement with FP32, {glue:text}`fp8_bar_db` dB (`bf16-graphs`, "Do they sample the same
#   volumes?"): bf16 is {glue:text}`fp8_ddpm250_bf16_bar` it, `…-fp8skip`
#   {glue:text}`fp8_ddpm250_fp8skip_bar`, `…-fp8` {glue:text}`fp8_ddpm250_fp8_bar`. With DDIM 50 (η = 0):
#   bf16 {glue:text}`fp8_ddim50_eta0_bf16_psnr` dB, `…-fp8skip` {glue:text}`fp8_ddim50_eta0_fp8skip_psnr`,
#   `…-fp8` {glue:text}`fp8_ddim50_eta0_fp8_psnr`.
# - **Against the real images**, DDPM 250: FP32 background {glue:text}`fp8_ddpm250_fp32_bg`
#   (in-brain r {glue:text}`fp8_ddpm250_fp32_corr`); bf16 {glue:text}`fp8_ddpm250_bf16_bg`
#   (r {glue:text}`fp8_ddpm250_bf16_corr`; matches FP32's DDPM 250: {glue:text}`fp8_ddpm250_bf16_match`);
#   `…-fp8skip` {glue:text}`fp8_ddpm250_fp8skip_bg` (r {glue:text}`fp8_ddpm250_fp8skip_corr`; matches:
#   {glue:text}`fp8_ddpm250_fp8skip_match`); `…-fp8` {glue:text}`fp8_ddpm250_fp8_bg`
#   (r {glue:text}`fp8_ddpm250_fp8_corr`; matches: {glue:text}`fp8_ddpm250_fp8_match`).
#
# What the comparisons say:
#
# - Where a PSNR is below the bar, those samples are not the FP32 model's samples voxel for voxel.
#   A DDPM chain draws fresh noise at every step, and every small change of ε moves the sample to a
#   neighbouring one: bf16's own lowest agreement is {glue:text}`fp8_ddpm250_bf16_psnr_min` dB.
# - Paired with the FP32 sample of the same seed and subject (the same noise), the DDPM 250
#   background moves by {glue:text}`fp8_ddpm250_bf16_shift` under bf16, by
#   {glue:text}`fp8_ddpm250_fp8skip_shift` under `…-fp8skip` and by {glue:text}`fp8_ddpm250_fp8_shift`
#   under `…-fp8` (mean ± standard error over the pairs, the table's "background shift"). The
#   unpaired means carry the spread between subjects and seeds, which hides a shift of this size;
#   the pairs show it.
# - What the voxel bar stands for, the quality of the sample, is judged in the last column, with
#   the criterion of the sections above. Only a configuration whose DDPM 250 verdict is "yes" counts
#   for the 4 s target: `…-fp8skip`: {glue:text}`fp8_ddpm250_fp8skip_match`
#   ({glue:text}`samp_fast-w16-tnorm-tconv-fold-up-update-fp8skip_ddpm_s` s), `…-fp8`: {glue:text}`fp8_ddpm250_fp8_match`
#   ({glue:text}`samp_fast-w16-tnorm-tconv-fold-up-update-fp8_ddpm_s` s). This rests on {glue:text}`fp8_n` of one checkpoint; the
#   distribution-level metrics below (FID, MS-SSIM) were not measured.
# - So FP8 is an option you choose, not the default. `medddpm sample` without `--config` samples
#   with bf16 (`fast-w16-tnorm-tconv-fold-up-update`). `--config fast-w16-tnorm-tconv-fold-up-update-fp8skip` trades the voxel agreement and the background shift
#   above for the time above.

# %% [markdown]
# ## The paper's Fig. 1, made from our own model
#
# Held-out masks (brain and lesion), the subject's real image, and the first seed's samples of the
# checkpoint above: DDPM 250, the recommended DDIM 50 with η = 1, and the deterministic DDIM 50
# (η = 0) it replaces. Slices go through each subject's lesion.

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-1-ours", "caption": "The paper's Fig. 1 made from our own model ({glue:text}`q_gpu`, 64³, the held-out-loss checkpoint of step {glue:text}`sm_ckpt_step`): per held-out subject, the mask (brain and lesion), the real image and samples of DDPM 250, DDIM 50 with η = 1 and DDIM 50 with η = 0 (seed 0), in orthogonal slices through the lesion."}}
SSL = tables.sampler_slices(root, QGPU) if QGPU else None
if SSL is not None:
    plots.finish(plots.slices(SSL, sorted(SSL["subject"].unique()), tables.fig1_sources(SSL, facts.SAMPLER_QUALITY_CONFIGS)))
else:
    plots.finish(plots.no_data("sampler slices (quality/sampler_slices.parquet)", "quality"))

# %% [markdown]
# The demo set has a single anatomy (the MNI152 template) under different lesions, so this shows
# conditioning on the mask, not generalisation across brains. An earlier run of the same recipe,
# {glue:text}`long_steps` steps at {glue:text}`long_ms` ms/step (training loss
# {glue:text}`long_loss`, mean of its last {glue:text}`long_tail` steps; `fast-long` above), ran past
# the held-out minimum; one 64³ volume takes {glue:text}`fig1_s` s with `bf16-graphs` and DDIM 50 on the
# {glue:text}`q_gpu` (`bench-sample`, warm).

# %% [markdown]
# ## What this does not show
#
# - **Distribution-level quality.** The Med-DDPM paper reports FID and MS-SSIM (and a
#   segmentation model trained on synthetic data). FID in 3D needs a feature network trained on
#   brain MRI (e.g. a 3D ResNet from MedicalNet) and hundreds of samples per configuration;
#   MS-SSIM diversity needs many samples per mask. Neither fits this artifact's GPU budget; both
#   would run on the checkpoints `scripts/quality.py` keeps.
# - **Scale.** Parity was measured at 64³ for 1,000 steps on one GPU; the paper trains at 128³
#   for far longer on real patients (BraTS, whole-head scans). Longer runs can separate
#   configurations that agree here.
# - **One seed per configuration.** Only the baseline has three seeds; a configuration at the
#   band's edge would need its own seeds to call.
