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
# # Quality: the same network, the same model, the same volumes
#
# The paper says its interventions speed training up "without degrading synthesis quality" and
# never measures quality. This chapter asks three questions of every configuration, each a step
# further from the arithmetic: does it compute the same network (ε-prediction against an FP64
# forward), does it train the same model (held-out loss after training, against the seed-to-seed
# spread of the FP32 baseline), and does it sample the same volumes (one trained checkpoint
# sampled under every configuration). {doc}`10_sampling` times sampling and judges the samplers,
# {doc}`11_few_step` the few-step solvers and {doc}`12_fp8` FP8. Everything here is measured
# by `scripts/quality_measure.sh` (logic in `medddpm/train/parity.py` and `medddpm/sample/quality.py`)
# and read from `data/results/<gpu>/quality/`.

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # no measurement of its own (scripts/quality_measure.sh: trained checkpoints, about an hour); True says so, then renders
size = 128  # volume side when measuring
configs = "opt1,bf16-graphs,fast-w16-p8,fast-w16-tnorm-tconv-fold-up"  # not used: this chapter measures nothing

# %% tags=["remove-cell"]
import matplotlib.pyplot as plt
from IPython.display import display

from medddpm.report import plots, quality_tables
from medddpm.report.measure import render_only
from medddpm.report.present import table

root, G = render_only(results_dir, gpus, measure, "scripts/quality_measure.sh (trained checkpoints: about an hour of GPU time)")
QG, QGPU = quality_tables.quality_gpus(root, G)  # GPUs with quality results; the one shown

# %% [markdown]
# ## Does every configuration compute the same network?
#
# The ε-prediction of seeded weights (whole-head model, its zero-initialised layers jittered so ε
# is not zero) on fixed (x_t, mask, t) inputs, each configuration on the GPU against the same
# network in float64 on the CPU (`medddpm.train.parity.denoiser_agreement`, reference `fp64-cpu`), at
# 64³ (the FP64 CPU forward at 128³ would take minutes per input). TF32 keeps 10 mantissa bits and
# bf16 8, so relative errors near 10⁻³ and 10⁻² are what their rounding alone gives.

# %% tags=["hide-input"]
A = quality_tables.quality_csv(root, QG, "agreement")
if A.empty:
    print(plots.no_data_text("denoiser agreement (quality/agreement.csv)", "quality"))
else:
    A = A[A["gpu_slug"] == QGPU]
    display(table(A.pivot_table(index="config", columns="t", values="rel_l2", sort=False)
                  .rename(columns=lambda t: f"relative L2, t = {t}"), 6, index=True))
    display(table(A.pivot_table(index="config", columns="t", values="max_abs", sort=False)
                  .rename(columns=lambda t: f"max |Δε|, t = {t}"), 4, index=True))

# %% [markdown]
# In the first table, the FP32 configurations (baseline, and `opt2`, which only changes the layout) agree with FP64 at
# FP32's rounding level, the TF32 ones (`opt1`) at TF32's, and every bf16 one (`bf16`, `bf16-graphs`, the sampling
# levers `fast-w16…`, the Triton norm and thin-convolution kernels, the folded bias, `fast`) at bf16's, each relative
# to ε's own size.
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

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-parity", "caption": "Training parity: held-out denoising loss (L1, the same FP32 evaluator for every configuration) over the training steps at 64³ on the MNI152 demo subjects; baseline seeds 0–2 and their 95 % prediction band for one more seed, and one seed of each other configuration."}}
PC, PV = quality_tables.parity_curves(root, QG), quality_tables.parity_verdict(root, QG)
if not PV.empty:
    PV = PV[PV["gpu_slug"] == QGPU]
    plots.finish(plots.parity(PC, PV, QGPU))
else:
    plots.finish(plots.no_data("training-parity runs (quality/parity_*.csv)", "quality"))

# %% tags=["hide-input"]
if not PV.empty:
    display(table(PV[["gpu_slug", "config", "seed", "steps", "loss_step0", "loss", "band_low", "band_high", "inside_band"]]
                  .rename(columns={"loss_step0": "held-out loss, step 0", "loss": "held-out loss, end",
                                   "band_low": "band, low", "band_high": "band, high",
                                   "inside_band": "inside the band"}), 4))

# %% [markdown]
# The band is the baseline seeds' (its rows); the last column says whether each other configuration's end loss lies
# inside it. Where every row is inside, none of the paper's interventions nor bf16 with the fused kernels, compile and
# CUDA graphs trains a measurably different model at this length and scale.

# %% [markdown]
# ## Do they sample the same volumes?
#
# The baseline checkpoint of seed 0 above, sampled under every configuration with the same seed
# (DDIM 50, η = 0, so the chain is deterministic given its start noise) on the two held-out masks:
# each sample against the FP32 (`baseline`) sample, voxel by voxel. PSNR and SSIM (3D, 7³ window,
# scikit-image) use the model's intensity range [−1, 1]; "real" is the subject's own image,
# for scale.

# %% tags=["hide-input"]
per = quality_tables.sample_agreement(root, QGPU).drop("fast-long", errors="ignore") if QGPU else None
if per is None or per.empty:
    print(plots.no_data_text("sample agreement (quality/sample_agreement.csv)", "quality"))
else:
    display(table(per.rename(columns={"psnr_db": "PSNR, dB", "ssim": "SSIM", "mae": "mean |Δ|",
                                      "max_abs": "max |Δ|", "mae_brain": "mean |Δ| in brain"})
                  .rename_axis("sample (mean of 2 subjects)"), 4, index=True))

# %% [markdown]
# Against the FP32 sample, the TF32 and bf16 samples keep a PSNR far above the real image's own (the table's `real`
# row, for scale).
# Rounding differences grow along the 50 denoising steps but stay far below the difference between
# a sample and the anatomy it stands for. Where they sit, the difference maps show (absolute
# difference to the FP32 sample; black 0, yellow 0.05 or more on the [−1, 1] scale):

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-diff", "caption": "Where the configurations' samples differ from the FP32 sample (same checkpoint, seed and DDIM 50 chain): orthogonal slices through the held-out subject's lesion, the FP32 sample first, then the absolute difference of each configuration (black 0, yellow ≥ 0.05 on the [−1, 1] intensity scale)."}}
SL = quality_tables.quality_slices(root, QGPU) if QGPU else None
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

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-hist", "caption": "Intensity histograms inside the brain mask of each held-out subject: the real image, the FP32 (`baseline`) and `bf16-graphs` samples of the 1,000-step checkpoint, and `bf16-graphs` samples of the 20,000-step model (`fast-long`)."}}
H = quality_tables.quality_csv(root, QG, "histograms")
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
