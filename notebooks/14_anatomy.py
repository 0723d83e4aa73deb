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
# # Real anatomy: IXI brains the model has never seen
#
# Every quality verdict before this chapter came from the MNI152 demo set: one template brain with random lesions, so
# its held-out subjects share the training subjects' anatomy. This chapter trains and judges the model on real, varied
# brains.
#
# **Data.** 185 T1 scans of the IXI data set (brain-development.org, CC BY-SA 3.0; whole head, 2 mm), with the DLMUSE
# parcellations of NiChart (CBICA/NiChart_Project, `test_data/processed/IXI`). `medddpm prepare-ixi` pads each scan to a
# cube, resamples it to 64³ and splits by IXI ID: training, IDs below 500 less the last 16; validation, those 16
# ({glue:text}`an_val_n` here), on which every choice below is made; the external test set, IDs 500 and above
# ({glue:text}`an_test_n` scans), used once, at the end.
#
# The masks map every DLMUSE label to *brain* (`--mask-labels brain=nonzero`). The scans are never committed:
# `prepare-ixi` makes them from the reader's copy.
#
# **Training and measures.** `scripts/anatomy_measure.sh` trains `fast` at 64³ (lr 10⁻⁴, grad-accum 1) for a fixed time,
# one run per GPU, with the validation subjects' held-out loss every 2,000 steps. It samples their masks from the
# checkpoint of the lowest held-out loss, with the 12-step chain and DDPM 250, each over 3 seeds. Measured on the
# {glue:text}`an_gpu` (logic in `medddpm/sample/anatomy.py`), each sample is compared with its subject's real scan:
# paired, the in-brain correlation (r), 3D SSIM and PSNR; intensity, the background's mean (outside the brain), the
# Wasserstein-1 distance (W1) between the in-brain intensity distributions, and the correlation over the 148 DLMUSE
# regions of their mean intensity (region r); diversity, SSIM between seeds of one mask.
#
# The trivial baseline is the training scans' mean, the *template*. Every measure is computed for it too.
#
# **Where it stands** (the first table): the v recipe's samples of the validation subjects (64³: the 12-step chain; the
# largest size: DDPM 250, `sample`'s default, over its runs) against that size's targets. Every number this chapter
# discusses is in a table; what superseded measurements found is in the history table at its end.

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # no measurement of its own (scripts/anatomy_measure.sh); True says so, then renders
size = 128  # not used: this chapter measures nothing (its runs are 64³: scripts/anatomy_measure.sh)
configs = "fast"  # not used: this chapter measures nothing

# %% tags=["remove-cell"]
from medddpm.report import anatomy, history, plots
from medddpm.report.measure import render_only
from medddpm.report.notebook import glue_facts
from medddpm.report.plots import show_table

root, G = render_only(results_dir, gpus, measure, "scripts/anatomy_measure.sh OUT IXI WORK RECIPE:SEED…")
glue_facts(anatomy.facts(root, G))
AG = anatomy.anatomy_gpu(root, G)

# %% tags=["hide-input"]
show_table(anatomy.state(root, AG), "anatomy tables (anatomy/)", "scripts/anatomy_measure.sh")

# %% [markdown]
# ## The background problem, and its cause
#
# Trained as the reference trains (recipe `ref`: min-max scaling, ε-prediction, i.i.d. noise), the model places the
# background above the real scans' mean (`gap` in the table below, on the [−1, 1] scale), with the 12-step chain and
# with DDPM 250 alike, and moves it between seeds of one mask (`spread between seeds`). Both samplers show it, so it is
# the model's, not the sampler's.
#
# Each candidate cause is a knob, trained on its own from the same seed for the same time (the paper's five
# configurations keep the reference; `train` now predicts v by default):
# - **percentile scaling** (`pct`, `--intensity percentile`: the 0.5th and 99.5th percentiles → ±1, clipped): one
#   bright voxel no longer sets a scan's scale. The gap stays: scaling is not the cause.
# - **offset noise** (`offset`, `--offset-noise 0.1`, Guttenberg 2023): one extra N(0, 1) number per volume is added to
#   the training noise.
# - **v-prediction** (`v`, `--prediction v`, Salimans & Ho 2022, §4): the network predicts v = √ᾱ ε − √(1−ᾱ) x₀, and
#   every sampler converts it to ε.
#
# **The cause is ε-prediction's low-frequency error.** The predicted clean image is x̂₀ = (x_t − √(1−ᾱ_t) ε̂)/√ᾱ_t. At
# the 12-step chain's first timestep √(1−ᾱ_t)/√ᾱ_t is {glue:text}`an_gain`. So an error of 10⁻⁴ in the mean of ε̂ over
# the volume moves x̂₀'s mean by about 0.5, and the L1 loss on ε barely sees such an error: it is one number spread over
# 262,144 voxels. That mean is the background's level, set in the first, noisiest steps. The demo set hid this, because
# one template anatomy has one background.
#
# Both fixes act there. Offset noise trains the network to see a volume-wide shift in ε. With v, the network's output at
# high noise is −x₀ itself, and no factor amplifies its error. Zero-terminal-SNR rescaling (Lin et al. 2024) was not
# needed: the cosine schedule's last ᾱ is already {glue:text}`an_terminal_abar`. Too short a run is ruled out too: the
# reference and v ran for the same steps, and only the reference is off.

# %% tags=["hide-input"]
show_table(anatomy.recipes(root, AG), "IXI results (anatomy/anatomy_summary.csv)", "scripts/anatomy_measure.sh", digits=3)

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-anatomy-slices", "caption": "One validation subject's samples (64³, {glue:text}`an_gpu`): the 12-step chain's first seed from each recipe, the same mask and noise; the scans are IXI's and are not committed. Outside the head a scan is near −1 (black)."}}
SL = anatomy.slices(root, AG, ["ref-s0-fast", "pct-s0-fast", "offset-s0-fast", "v-s0-fast"])
plots.finish(plots.slices(SL[0], sorted(SL[0]["subject"].unique()), SL[1]) if SL
             else plots.no_data("IXI slices (anatomy/slices-*.parquet)", "anatomy"))

# %% [markdown]
# ## Training runs and convergence
#
# The held-out loss of every run (EMA weights, in ε for either parameterization), and per run (the table): its GPUs and
# global batch, its steps, its lowest held-out loss, how much that loss fell between its last two evaluations and
# whether that is under {glue:text}`an_plateau` (levelled off), its steady step, and its wall time where the run kept
# it. The TF32 reference (`opt1`, dashed) trains the v recipe beside `fast`'s seeds.
#
# The v recipe also trained at 96³ (`SIZE=96 scripts/anatomy_measure.sh`, one run per GPU) and at 128³, the size of
# every speed claim in this book: `prepare-ixi --size 128`, then `medddpm train` under `fast` on several GPUs
# (`--nproc`, DDP).
#
# **Batch and learning rate.** DDP averages the ranks' gradients, so on N GPUs a step sees N volumes: the gradient is
# the same expectation with 1/N of the variance. Adam divides each update by its own running root-mean-square gradient,
# so the size of a step is set by the learning rate, not by the batch. Each run keeps its recipe's 64³ rate (Med-DDPM's
# at 10⁻⁴; the cosine recipe, `train`'s default when they ran, at its own peak) and does not scale it with N: the
# larger batch buys a less noisy step, and in the same number of steps N times the volumes. A run still learning
# gives its model's measures on the way, not the size's last word; {doc}`17_time_to_trained` times the runs to their
# plateau.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-anatomy-curves", "caption": "Held-out loss on the 16 validation subjects (6 timesteps each) against optimizer steps, one line per training run (recipe-seed-configuration[-size]; dashed: TF32 `opt1`; dotted: a larger size), {glue:text}`an_gpu`."}}
C = anatomy.curves(root, AG)
plots.finish(anatomy.curves_figure(C) if len(C) else plots.no_data("IXI training curves (anatomy/train/)", "anatomy"))

# %% tags=["hide-input"]
show_table(anatomy.runs(root, AG), "IXI training runs (anatomy/train/)",
           "scripts/anatomy_measure.sh; medddpm train --size 128 --nproc N", digits=3)

# %% [markdown]
# At the larger sizes DDPM 250 under `fast` sampled the validation masks over 3 seeds: every measure per size below.

# %% tags=["hide-input"]
show_table(anatomy.larger(root, AG), "IXI runs at larger sizes", "SIZE=96 scripts/anatomy_measure.sh; "
           "medddpm train --size 128 --nproc N", digits=3)

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-anatomy-big-slices", "caption": "One validation subject sampled by the largest-size run (its best EMA checkpoint), by DDPM 250 and by the 12-step chain, first seed, under `fast`. The scans are IXI's and are not committed: a user with IXI sees them beside these with `scripts/anatomy.py`."}}
BIG = anatomy.run_slices(root, AG, anatomy.largest_run(root, AG))
plots.finish(plots.slices(BIG[0], sorted(BIG[0]["subject"].unique()), BIG[1]) if BIG
             else plots.no_data("IXI slices at a larger size (anatomy/slices-*.parquet)", "anatomy"))

# %% [markdown]
# ## The external test set, segmentation utility and the numerics gate
#
# **The external test set** ({glue:text}`an_test_n` scans, IDs 500 and above; {glue:text}`an_val_n` validation
# subjects). Once, at the end, one v run's checkpoint samples the test masks (3 seeds): the first table below, against
# the same targets (background within 0.05 with a spread ≤ 0.05, W1 at or below the template's).
#
# **Segmentation utility.** The Med-DDPM paper judges synthetic scans by what they are good for. A small 3D segmenter
# of the brain (`medddpm/sample/utility.py`) is trained on synthetic scans sampled from the training masks, and the same
# segmenter on the real training scans; both are tested on the real validation scans (the second table: mean Dice per
# run and source, `scripts/anatomy_measure.sh` with `UTILITY_STEPS`).
#
# **The numerics gate.** The gate of {doc}`11_few_step` on a v checkpoint judges numerics, not samplers: FP32 DDPM 250
# over several seeds gives each validation subject's band, and every candidate must lie inside it on every subject. The
# third table gives each judged checkpoint's verdicts; the history below, what they showed of the gate itself (FP32
# judged against itself, the chain's shift against the noise, the cause of its failures). A sampler of other noise is
# judged by the equivalence gate of {doc}`16_equivalence`; `medddpm sample` runs {glue:text}`an_default` by default.

# %% tags=["hide-input"]
show_table(anatomy.recipes(root, AG, "test"), "IXI test-set results", "scripts/anatomy_measure.sh (MODE test)", digits=3)
show_table(anatomy.utility(root, AG), "segmentation utility (anatomy/anatomy_utility.csv)",
           "UTILITY_STEPS=<steps> scripts/anatomy_measure.sh", digits=3)
show_table(anatomy.gate_history(root, AG), "the sampler gate on IXI (FP32 DDPM 250 in anatomy/)",
           "scripts/anatomy_measure.sh (MODE gate)", digits=3)

# %% [markdown]
# ## History
#
# What earlier measurements of this chapter found, each row computed once from the store by the reader of its day
# (`history.json`'s `frozen_by`).

# %% tags=["hide-input"]
show_table(history.table(root, [AG] if AG else [], "anatomy"), "chapter 14's history (anatomy/history.json)",
           "scripts/anatomy_measure.sh")
