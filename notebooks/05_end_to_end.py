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
from medddpm.report.present import gpu_name, table

root, G = prepare(results_dir, gpus, measure, "end_to_end", size, configs)
B = tables.bench(root, G, list(PAPER_CONFIGS))
if B.empty:
    print(plots.no_data_text("bench rows of the paper's configurations", "bench"))
else:
    display(table(tables.lever_ratios(B), {"ms": 1, "against ms": 1, "× faster": 2}))

# %% [markdown]
# Where it stands, per GPU: each of the paper's configurations against the one it changes (TF32 against FP32,
# channels-last against FP32, both against TF32 alone, PyTorch's own defaults against FP32), median step times; above
# 1, the change is faster. Every row of the paper's configurations:

# %% tags=["hide-input", "full-width"]
if not B.empty:
    display(table(B[["gpu_slug", "config", "step_ms_median", "step_ms_min", "step_ms_max", "fwd_ms_median",
                     "peak_mem_gib", "speedup_vs_baseline"]]))

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-step", "caption": "Measured training step (forward + L1 loss + backward + Adam, batch 1, the paper's 128³ whole-head model, CUDA events after warm-up) per configuration of the paper on each GPU in the results store: median step time, forward time and peak allocated memory. The paper reports no step times."}}
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
# TF32 (`opt1`) is the lever that moves a step; channels-last (`opt2`, `opt12`) is read off the state table's
# `× faster` against FP32 and against TF32 alone. PyTorch's own defaults (`pytorch-default`) already use TF32 for
# convolutions, so they land next to `opt1`.
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
# The `coverage` column is the share of a step's kernel time the window holds: conclusions about "the training
# step" drawn from the window rest on that share of the work. Its kernel mix differs from the whole step's:

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-window", "caption": "Share of kernel time per category in the paper's 100-kernel ncu window (the 11th–110th kernel from process start) and in a whole steady-state step (torch.profiler), per GPU and configuration of the paper."}}
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
# `kernels` gives both counts (ncu / torch.profiler) and `time_ratio` ncu's summed kernel time over torch.profiler's:
# where the counts match and the ratio is near 1, the ncu step reports used by the interventions chapter cover the
# same work as the torch.profiler tables used here.

# %% [markdown]
# ## The second workload: BraTS
#
# The paper's Fig. 1 shows Med-DDPM's other model: four MRI modalities (T1, T1ce, T2, FLAIR)
# generated under a tumour mask of necrotic core, oedema, enhancing tumour and healthy brain, on
# BraTS's 192 × 192 × 144 window with two residual blocks a level (the table's `TFLOP` a step against the
# whole-head model's). `medddpm train --data ROOT --model brats` reads a BraTS folder as
# it is distributed (one file per modality, BraTS 2021 or 2023 labels, or the reference repository's
# preprocessed files) and preprocesses it as the reference does; `medddpm sample --masks ROOT`
# writes each subject's four modalities back in its segmentation's space. The table times a
# training step of both workloads on the same GPU.

# %% tags=["hide-input"]
BR = workloads.side_by_side(root, G)
if BR.empty:
    print(plots.no_data_text("BraTS bench rows", "brats"))
else:
    display(table(workloads.page_view(BR), {"ms": 1, "× FP32": 1, "TFLOP": 1, "TFLOP/s": 0, "GiB": 1}))
SB = workloads.sampling(root, G)
if not SB.empty:
    display(table(SB[["gpu_slug", "config", "sampler", "steps", "batch", "s_per_volume_median"]]
                  .rename(columns={"s_per_volume_median": "s a subject"}), 2))

# %% [markdown]
# The `× FP32` and `TFLOP/s` columns put `fast` on BraTS beside `fast` on the whole-head model: every
# lever of the fast path applies to the BraTS preset as it stands — its four output channels and eight input channels
# go through the thin convolutions, its only attention is the middle block's, and 192 × 192 × 144 halves cleanly four
# times. The second table gives the seconds to sample one BraTS subject, all four modalities.

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-1-brats", "caption": "The paper's Fig. 1 for the BraTS workload, from a run of the brats preset on BraTS-shaped demo data (`medddpm demo-data --layout brats`: MNI152 tissue maps with a random tumour each, on BraTS's 240 × 240 × 155 grid), trained on six subjects with the window resized to 96 × 96 × 64 and sampled by the recommended sampler on the two held out: per subject, the mask (oedema, enhancing rim, necrotic core, healthy brain), the real T1, T2 and FLAIR, and the sampled ones, in orthogonal slices through the oedema. Outside the 192 × 192 × 144 window the writer fills the background."}}
SL, fig_gpu = workloads.fig1_slices(root, G)
if SL.empty:
    fig = plots.no_data("slices of a BraTS run", "brats")
else:
    fig = plots.slices(SL, sorted(SL["subject"].unique()), workloads.FIG1_SOURCES, mask_max=5)
plots.finish(fig)

# %% [markdown]
# The run behind the figure (`fast`, batch 1, learning rate 10⁻⁴) stopped at its time limit; the samples come from the
# EMA weights of its lowest held-out loss:

# %% tags=["hide-input"]
table(workloads.fig1_run(root, G), {"ms a step": 1, "held-out loss": 4})

# %% [markdown]
# The tumour's rings land where the mask puts them, in
# each modality's own contrast, as in the real images beside them, while inside the window the
# background still comes out grey rather than black: a run this short has not learnt it.
