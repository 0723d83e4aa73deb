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
# larger size: DDPM 250, `sample`'s default, over its runs) against the larger size's targets.

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # no measurement of its own (scripts/anatomy_measure.sh); True says so, then renders
size = 128  # not used: this chapter measures nothing (its runs are 64³: scripts/anatomy_measure.sh)
configs = "fast"  # not used: this chapter measures nothing

# %% tags=["remove-cell"]
from medddpm.report import anatomy, plots
from medddpm.report.measure import render_only
from medddpm.report.notebook import glue_facts
from medddpm.report.plots import show_table

root, G = render_only(results_dir, gpus, measure, "scripts/anatomy_measure.sh OUT IXI WORK RECIPE:SEED…")
F = anatomy.facts(root, G)
glue_facts(F)
AG = anatomy.anatomy_gpu(root, G)


# %% tags=["hide-input"]
show_table(anatomy.state(F), "anatomy tables (anatomy/)", "scripts/anatomy_measure.sh")

# %% [markdown]
# ## The background problem, and its cause
#
# Trained as the reference trains (min-max scaling, ε-prediction, i.i.d. noise; {glue:text}`an_ref_runs` runs,
# {glue:text}`an_ref_steps` steps), the model places the background {glue:text}`an_ref_gap` above the real scans' mean
# ({glue:text}`an_real_bg` on the [−1, 1] scale) with the 12-step chain, and {glue:text}`an_ref_ddpm_gap` with DDPM
# 250. Between seeds of one mask the background mean moves by {glue:text}`an_ref_spread` on average and by up to
# {glue:text}`an_ref_maxspread`. Both samplers show it, so it is the model's, not the sampler's.
#
# Each candidate cause is a knob, trained on its own from the same seed for the same time (the paper's five
# configurations keep the reference; `train` now predicts v by default):
# - **percentile scaling** (`--intensity percentile`: the 0.5th and 99.5th percentiles → ±1, clipped): one bright
#   voxel no longer sets a scan's scale. The background is still {glue:text}`an_pct_gap` off, with a spread of
#   {glue:text}`an_pct_spread`. Scaling is not the cause.
# - **offset noise** (`--offset-noise 0.1`, Guttenberg 2023): one extra N(0, 1) number per volume is added to the
#   training noise. Gap {glue:text}`an_offset_gap`, spread {glue:text}`an_offset_spread`.
# - **v-prediction** (`--prediction v`, Salimans & Ho 2022, §4): the network predicts v = √ᾱ ε − √(1−ᾱ) x₀, and every
#   sampler converts it to ε. Gap {glue:text}`an_v_gap`, spread {glue:text}`an_v_spread`, W1 {glue:text}`an_v_w1`
#   against the template's {glue:text}`an_template_w1`.
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
# ## Convergence and training parity
#
# The held-out loss of every run (EMA weights, in ε for either parameterization). In {glue:text}`an_still_falling` runs
# it still fell by {glue:text}`an_plateau` or more between the last two evaluations (not at their plateau in the time
# each had); levelled off (less): {glue:text}`an_levelled`. The TF32 reference (`opt1`, dashed) trains the v recipe
# beside `fast`'s seeds, {glue:text}`an_opt1_ratio`× slower a step. Its held-out loss is {glue:text}`an_parity` of
# `fast`'s seeds.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-anatomy-curves", "caption": "Held-out loss on the 16 validation subjects (6 timesteps each) against optimizer steps, one line per training run (recipe-seed-configuration[-size]; dashed: TF32 `opt1`; dotted: a larger size), {glue:text}`an_gpu`."}}
C = anatomy.curves(root, AG)
plots.finish(anatomy.curves_figure(C) if len(C) else plots.no_data("IXI training curves (anatomy/train/)", "anatomy"))

# %% [markdown]
# ## Larger sizes, up to the paper's
#
# The v recipe also trained at 96³ (`SIZE=96 scripts/anatomy_measure.sh`, one run per GPU) and at
# {glue:text}`an_big_size`, the size of every speed claim in this book: `prepare-ixi --size 128`, then `medddpm train`
# (v-prediction by default) under `fast` on {glue:text}`an_big_gpus` (`--nproc`, DDP), one run each,
# {glue:text}`an_big_steps` steps at {glue:text}`an_big_step_ms` ms a step; {glue:text}`an_big_wall`. The table gives
# each run's GPUs, global batch, steps and wall time, and how far its held-out loss still fell (the plateau rule: less
# than {glue:text}`an_plateau`).
#
# **Batch and learning rate.** DDP averages the ranks' gradients, so on N GPUs a step sees N volumes: the gradient is
# the same expectation with 1/N of the variance. Adam divides each update by its own running root-mean-square gradient,
# so the size of a step is set by the learning rate, not by the batch. Each run keeps its recipe's 64³ rate (Med-DDPM's
# at 10⁻⁴; `train`'s default cosine recipe at its own peak) and does not scale it with N: the larger batch buys a less
# noisy step, and in the same number of steps N times the volumes.
#
# DDPM 250 under `fast` sampled the validation masks over 3 seeds. Beside the {glue:text}`an_base_size` runs of the same
# sampler ({glue:text}`an_base_steps` steps; theirs in brackets): background gap {glue:text}`an_big_gap`
# ({glue:text}`an_base_gap`); spread between seeds {glue:text}`an_big_spread` ({glue:text}`an_base_spread`), up to
# {glue:text}`an_big_maxspread`; W1 {glue:text}`an_big_w1` against the template's {glue:text}`an_big_template_w1`
# ({glue:text}`an_base_w1` against {glue:text}`an_base_template_w1`); in-brain r {glue:text}`an_big_r` against the
# template's {glue:text}`an_big_template_r` ({glue:text}`an_base_r` against {glue:text}`an_base_template_r`); Dice of a
# segmenter trained on synthetic scans {glue:text}`an_big_util_synthetic`, on real ones {glue:text}`an_big_util_real`,
# {glue:text}`an_big_util_ratio`, measured {glue:text}`an_big_util_step`.
#
# Targets at {glue:text}`an_big_size`: {glue:text}`an_big_targets`. The held-out loss between each run's last two
# evaluations: {glue:text}`an_big_falling`; by the plateau rule, {glue:text}`an_big_state`. A run still learning gives
# its model's in-brain r on the way, not the size's last word; {doc}`17_time_to_trained` times the run that levelled.
#
# **Numerics at {glue:text}`an_big_size`.** FP32 DDPM 250 takes {glue:text}`an_big_fp32_s` s a volume there, so the
# numerics gate sampled a few subjects: {glue:text}`an_big_numerics`. That band is {glue:text}`an_big_numerics_state`.
# The same noise makes each pair comparable sample by sample: `fast` less FP32, {glue:text}`an_big_numerics_shift`. The
# gate's rows are the last of the history table below; {doc}`16_equivalence` judges the 12-step chain, measured here
# beside DDPM 250, at this size.

# %% tags=["hide-input"]
show_table(anatomy.larger_runs(root, AG), "IXI training runs at larger sizes (anatomy/train/)",
           "SIZE=96 scripts/anatomy_measure.sh; medddpm train --size 128 --nproc N", digits=3)
show_table(anatomy.larger(root, AG), "IXI runs at larger sizes", "SIZE=96 scripts/anatomy_measure.sh; "
           "medddpm train --size 128 --nproc N", digits=3)

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-anatomy-big-slices", "caption": "One validation subject sampled by the largest-size run ({glue:text}`an_big_size`, its best EMA checkpoint), by DDPM 250 and by the 12-step chain, first seed, under `fast`. The scans are IXI's and are not committed: a user with IXI sees them beside these with `scripts/anatomy.py`."}}
BIG = anatomy.run_slices(root, AG, anatomy.largest_run(root, AG))
plots.finish(plots.slices(BIG[0], sorted(BIG[0]["subject"].unique()), BIG[1]) if BIG
             else plots.no_data("IXI slices at a larger size (anatomy/slices-*.parquet)", "anatomy"))

# %% [markdown]
# ## The external test set, segmentation utility and the numerics gate
#
# **The external test set.** Once, at the end, one v run's checkpoint samples the {glue:text}`an_test_n` test masks (3
# seeds): background gap {glue:text}`an_test_gap` to the scans' mean ({glue:text}`an_test_real_bg`), spread between seeds
# {glue:text}`an_test_spread` on average and up to {glue:text}`an_test_maxspread` (targets: within 0.05), W1
# {glue:text}`an_test_w1` against the template's {glue:text}`an_test_template_w1` (target: at or below it), in-brain r
# {glue:text}`an_test_r` against the template's {glue:text}`an_test_template_r` (the first table below).
#
# **Segmentation utility.** The Med-DDPM paper judges synthetic scans by what they are good for. A small 3D segmenter
# of the brain (`medddpm/sample/utility.py`) is trained on synthetic scans sampled from the training masks, and the same
# segmenter on the real training scans; both are tested on the real validation scans. Mean Dice, v recipe:
# {glue:text}`an_util_synthetic` trained on synthetic scans, against {glue:text}`an_util_real` trained on real ones
# (`scripts/anatomy_measure.sh` with `UTILITY_STEPS`): {glue:text}`an_util_ratio` (the second table).
#
# **The numerics gate.** The gate of {doc}`11_few_step` on a v checkpoint judges numerics, not samplers: FP32 DDPM 250
# over {glue:text}`an_gate_seeds` seeds gives each validation subject's band, and every candidate must lie inside it on
# every subject. Verdicts: {glue:text}`an_gate`. {glue:text}`an_gate_count`. Averaged over the subjects, the 12-step
# chain's in-brain r differs from DDPM 250's by {glue:text}`an_gate_dr` (standard error {glue:text}`an_gate_dr_se`; DDPM
# 250's own seeds lie {glue:text}`an_gate_ref_span` apart in that mean), its background by {glue:text}`an_gate_dbg`:
# against the noise, {glue:text}`an_gate_dr_verdict`. FP32 DDPM 250 against itself (half its seeds inside the band of
# the other half) passes on only {glue:text}`an_self_check` subjects. The gate's own rows tell the numerics from the
# sampler: {glue:text}`an_gate_cause`. The fewest denoiser calls that pass: {glue:text}`an_fewest_pass`. A sampler of
# other noise is judged by the equivalence gate of {doc}`16_equivalence`; `medddpm sample` runs {glue:text}`an_default`
# by default. The checkpoints judged in turn, each one's rows in the third table: {glue:text}`an_gate_checkpoints`; FP8
# sampling (`fast-fp8`, the few-step chain's rows; DDPM 250 under FP8 has not been judged on real brains):
# {glue:text}`an_gate_fp8`.

# %% tags=["hide-input"]
show_table(anatomy.recipes(root, AG, "test"), "IXI test-set results", "scripts/anatomy_measure.sh (MODE test)", digits=3)
show_table(anatomy.utility(root, AG), "segmentation utility (anatomy/anatomy_utility.csv)",
           "UTILITY_STEPS=<steps> scripts/anatomy_measure.sh", digits=3)
show_table(anatomy.gate_history(root, AG), "the sampler gate on IXI (FP32 DDPM 250 in anatomy/)",
           "scripts/anatomy_measure.sh (MODE gate)", digits=3)
