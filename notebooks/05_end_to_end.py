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
# # End to end: step time, and what the paper's window sees
#
# The paper measures kernels, not training steps. Here: the median time of a whole training step
# (forward + L1 loss + backward + Adam, batch 1, 128³; CUDA events after warm-up), its forward
# part and peak memory, per configuration and GPU — how much of such a step the paper's
# 100-kernel ncu window covers, and the paper's second workload, BraTS, end to end.

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # True: measure this machine's GPU through the package first, then render
size = 128  # volume side when measuring (the paper: 128)
configs = "baseline,opt1,opt2,opt12,pytorch-default"  # configurations to measure

# %% tags=["remove-input", "full-width"]
from IPython.display import display
import matplotlib.pyplot as plt

from medddpm.report.measure import prepare
from medddpm.report import plots, tables, workloads
from medddpm.core.config import PAPER_CONFIGS
from medddpm.report import facts
from medddpm.report.notebook import glue_facts
from medddpm.report.present import gpu_name, table

root, G = prepare(results_dir, gpus, measure, "end_to_end", size, configs)
glue_facts(facts.end_to_end(root, G))
B = tables.bench(root, G, list(PAPER_CONFIGS))
if B.empty:
    print(plots.no_data_text("bench rows of the paper's configurations", "bench"))
else:
    display(table(B[["gpu_slug", "config", "step_ms_median", "step_ms_min", "step_ms_max", "fwd_ms_median",
             "peak_mem_gib", "speedup_vs_baseline"]]))

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-step", "caption": "Measured training step (forward + L1 loss + backward + Adam, batch 1, the paper's 128³ whole-head model, CUDA events after warm-up) per configuration of the paper on each GPU in the results store ({glue:text}`bench_gpus`): median step time, forward time and peak allocated memory. The paper reports no step times."}}
if B.empty:
    fig = plots.no_data("bench rows of the paper's configurations", "bench")
else:
    fig, axes = plt.subplots(3, 1, figsize=(8, 10))  # one panel per row
    for ax, (col, label) in zip(axes, [("step_ms_median", "ms per training step"), ("fwd_ms_median", "forward ms"),
                                       ("peak_mem_gib", "peak allocated GiB")]):
        plots.bars(B.assign(series=B["gpu_slug"].map(gpu_name)), "config", col, label, label, ax,
                   order=[c for c in tables.CONFIG_ORDER if c in set(B["config"])])
        ax.tick_params(axis="x", rotation=25)
    fig.suptitle(f"Training step at {', '.join(B['size'].unique())}, batch {', '.join(map(str, B['batch'].unique()))}")
plots.finish(fig)

# %% [markdown]
# On the {glue:text}`ref_gpu` a true-FP32 step takes {glue:text}`ref_baseline_step_ms` ms; TF32
# (`opt1`) makes it {glue:text}`ref_opt1_speedup`× faster ({glue:text}`ref_opt1_step_ms` ms), while
# channels-last alone (`opt2`, {glue:text}`ref_opt2_step_ms` ms) is
# {glue:text}`ref_opt2_vs_baseline` than the baseline, and `opt12` ({glue:text}`ref_opt12_step_ms`
# ms) is {glue:text}`ref_opt12_vs_opt1` than TF32 alone. PyTorch's own defaults
# (`pytorch-default`, {glue:text}`ref_pytorch-default_step_ms` ms) already use TF32 for
# convolutions.
#
# ## How much of a step does the paper's window cover?
#
# ncu's `--launch-skip 10 --launch-count 100` counts kernels from process start, so the window is
# the 11th–110th kernel of the first training step. torch.profiler recorded every kernel of that
# first step and of a steady-state step; coverage = window kernel time / steady-step kernel time.

# %% tags=["hide-input"]
C = tables.coverage(root, G)
if C.empty:
    print(plots.no_data_text("torch.profiler tables of the first and a steady step", "bench"))
else:
    display(table(C[["gpu_slug", "config", "window_kernels", "step_kernels", "window_us", "step_kernel_us", "coverage"]], 3))

# %% [markdown]
# The window covers {glue:text}`cov_ref_baseline_coverage` of a baseline step on the
# {glue:text}`cov_ref_gpu` and {glue:text}`cov_alt_baseline_coverage` on the
# {glue:text}`cov_alt_gpu`: conclusions about "the training step" drawn from it rest on that
# share of the work. Its kernel mix differs from the whole step's:

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-window", "caption": "Share of kernel time per category in the paper's 100-kernel ncu window (the 11th–110th kernel from process start) and in a whole steady-state step (torch.profiler), per GPU ({glue:text}`bench_gpus`) and configuration of the paper."}}
W = tables.window_vs_step(root, G)
if W.empty:
    fig = plots.no_data("torch.profiler tables of the first and a steady step", "bench")
else:
    fig, ax = plt.subplots(figsize=(10, 0.35 * W.groupby(["gpu_slug", "config", "scope"]).ngroups + 1.5))
    plots.stacked_shares(W, ["gpu_slug", "config", "scope"], "category", "Kernel mix: the paper's window vs a whole step", ax=ax)
plots.finish(fig)

# %% [markdown]
# ## One step, two tools
#
# Nsight Compute's step mode (kernel replay of every kernel between cudaProfilerStart/Stop, one
# counter pass) and torch.profiler (no replay) each recorded a whole steady-state step. Their
# kernel counts and summed kernel times should agree; if they did not, one of the two would not
# be seeing the step the other sees.

# %% tags=["hide-input"]
A = tables.step_agreement(root, G)
if A.empty:
    print(plots.no_data_text("ncu step-mode reports beside torch.profiler step tables", "ncu"))
else:
    display(table(tables.agreement_view(A), {"ncu_ms": 1, "torch_ms": 1, "time_ratio": 3}))

# %% [markdown]
# Across every GPU × configuration with both records, summed kernel time differs by at most
# {glue:text}`agree_max_time_dev` and the kernel count by at most {glue:text}`agree_max_count_dev`
# kernel(s): the ncu step reports used by the interventions chapter cover the same work as the
# torch.profiler tables used here.

# %% [markdown]
# ## The second workload: BraTS
#
# The paper's Fig. 1 shows Med-DDPM's other model: four MRI modalities (T1, T1ce, T2, FLAIR)
# generated under a tumour mask of necrotic core, oedema, enhancing tumour and healthy brain, on
# BraTS's 192 × 192 × 144 window with two residual blocks a level — {glue:text}`br_flops_ratio`× the
# whole-head model's FLOPs a step. `medddpm train --data ROOT --model brats` reads a BraTS folder as
# it is distributed (one file per modality, BraTS 2021 or 2023 labels, or the reference repository's
# preprocessed files) and preprocesses it as the reference does; `medddpm sample --masks ROOT`
# writes each subject's four modalities back in its segmentation's space. The table times a
# training step of both workloads on the same GPU ({glue:text}`br_gpus`).

# %% tags=["hide-input"]
BR = workloads.side_by_side(root, G)
if BR.empty:
    print(plots.no_data_text("BraTS bench rows", "brats"))
else:
    display(table(workloads.page_view(BR), {"ms_per_step": 1, "speedup_vs_baseline": 1, "tflops": 0, "peak_gib": 1}))

# %% [markdown]
# On the {glue:text}`br_gpu`, a BraTS step takes {glue:text}`br_baseline_ms` ms in FP32,
# {glue:text}`br_opt1_ms` ms under TF32 (`opt1`, {glue:text}`br_opt1_x`×) and
# {glue:text}`br_fast_ms` ms under `fast` ({glue:text}`br_fast_x`×, {glue:text}`br_fast_tflops`
# TFLOP/s), against {glue:text}`wh_fast_x`× ({glue:text}`wh_fast_tflops` TFLOP/s) for the
# whole-head model on the same GPU: every lever of the fast path applies to the BraTS preset as it
# stands — its four output channels and eight input channels go through the thin convolutions, its
# only attention is the middle block's, and 192 × 192 × 144 halves cleanly four times. The
# recommended sampler generates one BraTS subject, all four modalities, in
# {glue:text}`br_sample_s` s ({glue:text}`br_sample_steps` steps under `fast`).

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-1-brats", "caption": "The paper's Fig. 1 for the BraTS workload, from a run of the brats preset on BraTS-shaped demo data (`medddpm demo-data --layout brats`: MNI152 tissue maps with a random tumour each, on BraTS's 240 × 240 × 155 grid), trained on six subjects with the window resized to 96 × 96 × 64 and sampled by the recommended sampler on the two held out: per subject, the mask (oedema, enhancing rim, necrotic core, healthy brain), the real T1, T2 and FLAIR, and the sampled ones, in orthogonal slices through the oedema. Outside the 192 × 192 × 144 window the writer fills the background."}}
SL, fig_gpu = workloads.fig1_slices(root, G)
if SL.empty:
    fig = plots.no_data("slices of a BraTS run", "brats")
else:
    fig = plots.slices(SL, sorted(SL["subject"].unique()), workloads.FIG1_SOURCES, mask_max=5)
plots.finish(fig)

# %% [markdown]
# The run behind the figure ({glue:text}`br_fig_gpu`, `fast`, batch 1, learning rate 10⁻⁴) took
# {glue:text}`br_fig_ms` ms a step and stopped at its time limit after {glue:text}`br_fig_steps`
# steps; the samples come from the EMA weights of step {glue:text}`br_fig_best_step`, the lowest
# held-out loss ({glue:text}`br_fig_heldout`). The tumour's rings land where the mask puts them, in
# each modality's own contrast, as in the real images beside them, while inside the window the
# background still comes out grey rather than black: a run this short has not learnt it.
