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
# # FP8 sampling, and the paper's Fig. 1 from our own model
#
# The last lever a sampler can pull, its price in the samples, and what the model the quality
# chapters trained draws. **Where it stands** (the first table): per GPU, one 128³ volume of DDPM 250 under the
# fastest bf16 configuration and the fastest FP8 one.
#
# ## FP8 convolutions: DDPM under 4 s, at what cost?
#
# The bf16 samplers stop where the first table's `bf16 (s)` says for DDPM 250, most of a DDPM step's kernel time in
# its convolutions. A sampler needs no
# backward, so it can take a lever training cannot: FP8 (E4M3) operands, through cuDNN's graph API
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
# PyTorch's autotuned bf16 convolution, CUDA graphs, `sampling/fp8_convs.csv`), the second table; the errors are
# against an fp32 convolution of the unquantized operands.

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # no measurement of its own (scripts/quality_measure.sh, scripts/probes/fp8_conv_probe.py); True says so, then renders
size = 128  # volume side when measuring
configs = "opt1,bf16-graphs,fast-w16-p8,fast-w16-tnorm-tconv-fold-up"  # not used: this chapter measures nothing

# %% tags=["remove-cell"]
from IPython.display import display

from medddpm.report import history, plots, quality_tables
from medddpm.report.measure import render_only
from medddpm.report.present import table

root, G = render_only(results_dir, gpus, measure, "scripts/quality_measure.sh (trained checkpoints: about an hour of GPU time) and scripts/probes/fp8_conv_probe.py")
QG, QGPU = quality_tables.quality_gpus(root, G)  # GPUs with quality results; the one shown
SB = quality_tables.sample_bench(root, G)  # 128³ rows, every batch
SGPU = quality_tables.sampling_roles(SB)["ref"]  # the GPU the sampling prose quotes

# %% tags=["hide-input"]
plots.show_table(quality_tables.fp8_state(SB), "bench-sample rows of a bf16 and an FP8 configuration", "sampling",
                 digits=2)

# %% tags=["hide-input"]
probe = quality_tables.fp8_convs(root, SGPU) if SGPU else None
if probe is None or probe.empty:
    print(plots.no_data_text("FP8 convolution probe (sampling/fp8_convs.csv)", "sampling"))
else:
    display(table(probe.rename(columns={"cin": "in channels", "cout": "out channels", "side": "side (voxels)",
                                        "bf16_ms": "bf16 ms", "fp8_ms": "FP8 ms", "speedup": "speed-up",
                                        "bf16_rel_err": "bf16 error", "fp8_rel_err": "FP8 error",
                                        "fp8_plan": "cuDNN plan"}), 3))

# %% [markdown]
# At 128³ the 64-output-channel convolutions gain, most of all the decoder's 128 → 64 after a skip concatenation; at
# 64³ a 128 → 128 convolution gains nothing, so only convolutions of at most 64 output channels change
# (`fp8.MAX_OUT_CHANNELS`). The price is precision: each FP8 convolution's error lies far above a bf16 one's (the
# table's errors).
#
# Two configurations add the lever to `fast-w16-tnorm-tconv-fold-up-update`, their seconds in the first table:
# - `…-fp8skip` changes only the decoder ResBlocks' first convolutions, whose input is a skip concatenation (2C → C,
#   the largest gain per convolution);
# - `…-fp8` changes every ResBlock and upsampling convolution of at most 64 output channels.
#
# Are the FP8 samples right? A fresh checkpoint of {doc}`10_sampling`'s recipe (64³) was sampled by DDPM 250 and by
# the deterministic DDIM 50 (η = 0) under the FP32 baseline, `fast-w16-tnorm-tconv-fold-up-update` (bf16) and both FP8
# configurations, each seed's noise the same in every configuration (`scripts/quality.py samplers --name precision
# --reference baseline` → `quality/precision.csv`, `precision_agreement.csv`). The first columns compare each run's
# samples with the FP32 samples of the same run and seed, voxel by voxel and by their background; the last ones, like
# {doc}`10_sampling`, compare them with the real images, and judge each run against the FP32 baseline's DDPM 250.

# %% tags=["hide-input"]
prec = quality_tables.precision(root, QGPU) if QGPU else None
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
# What the comparisons say (the history at the chapter's end keeps the figures as first written):
#
# - **Voxel by voxel** no configuration reaches the bar of the earlier fast sampler's agreement with FP32
#   (`bf16-graphs`, "Do they sample the same volumes?" in {doc}`09_quality`), bf16 included: a DDPM chain draws fresh
#   noise at every step, and every small change of ε moves the sample to a neighbouring one. FP8 moves it further.
# - **Paired** with the FP32 sample of the same seed and subject (the same noise), the DDPM 250 background moves up,
#   more under FP8 than under bf16, and most under `…-fp8` (the table's "background shift", mean ± standard error
#   over the pairs). The unpaired means carry the spread between subjects and seeds, which hides a shift of this size;
#   the pairs show it.
# - What the voxel bar stands for, the quality of the sample, is judged in the last column, with the criterion of
#   {doc}`10_sampling`. Only a configuration whose DDPM 250 verdict is "yes" counts for the 4 s target. This rests on a
#   few seeds and subjects of one checkpoint; the distribution-level metrics (FID, MS-SSIM) were not measured.
# - So FP8 is an option you choose, not the default. `medddpm sample` without `--config` samples with bf16
#   (`fast-w16-tnorm-tconv-fold-up-update`). `--config fast-w16-tnorm-tconv-fold-up-update-fp8skip` trades the voxel
#   agreement and the background shift above for the time above.

# %% [markdown]
# ## The paper's Fig. 1, made from our own model
#
# Held-out masks (brain and lesion), the subject's real image, and the first seed's samples of the
# checkpoint of {doc}`10_sampling`: DDPM 250, the recommended DDIM 50 with η = 1, and the deterministic DDIM 50
# (η = 0) it replaces. Slices go through each subject's lesion.

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-1-ours", "caption": "The paper's Fig. 1 made from our own model (64³, the checkpoint chapter 10 sampled): per held-out subject, the mask (brain and lesion), the real image and samples of DDPM 250, DDIM 50 with η = 1 and DDIM 50 with η = 0 (seed 0), in orthogonal slices through the lesion."}}
SSL = quality_tables.sampler_slices(root, QGPU) if QGPU else None
if SSL is not None:
    plots.finish(plots.slices(SSL, sorted(SSL["subject"].unique()), quality_tables.fig1_sources(SSL, quality_tables.SAMPLER_QUALITY_CONFIGS)))
else:
    plots.finish(plots.no_data("sampler slices (quality/sampler_slices.parquet)", "quality"))

# %% [markdown]
# The demo set has a single anatomy (the MNI152 template) under different lesions, so this shows
# conditioning on the mask, not generalisation across brains. An earlier run of the same recipe (`fast-long` in
# {doc}`09_quality`) ran past the held-out minimum; it, and one 64³ volume with `bf16-graphs` and DDIM 50
# (`bench-sample`, warm), on the GPU with the quality results:

# %% tags=["hide-input"]
table(quality_tables.long_run(root, QGPU), {"ms a step": 1, "training loss, last 500 steps": 3,
                                            "64³ volume, DDIM 50 (s)": 2})

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

# %% [markdown]
# ## History
#
# What the FP8 study found when it ran, each row computed once from the store by the reader of its day
# (`history.json`'s `frozen_by`).

# %% tags=["hide-input"]
plots.show_table(history.table(root, [SGPU] if SGPU else [], "sampling"), "chapter 12's history (sampling/history.json)",
                 "sampling")
