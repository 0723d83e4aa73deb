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
# # Interventions: TF32 and channels-last (Figs. 8–13)
#
# `opt1` turns TF32 on for matmul and cuDNN convolutions (Alg. 1), `opt2` puts model and inputs in
# `torch.channels_last_3d` (Alg. 2), `opt12` does both. Kernel mixes of whole steps come from torch.profiler for every
# configuration; the counter-based figures (9–13) need Nsight Compute reports, and are shown for the GPU ×
# configuration pairs we have reports for — the tables say which.

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # True: measure this machine's GPU through the package first, then render
size = 128  # volume side when measuring (the paper: 128)
configs = "baseline,opt1,opt2,opt12,pytorch-default"  # configurations to measure

# %% tags=["remove-input"]
from IPython.display import display
import matplotlib.pyplot as plt
import pandas as pd

from medddpm.profiling import metrics as M
from medddpm.profiling import store
from medddpm.report.measure import prepare
from medddpm.report import paper, plots, tables
from medddpm.report.present import table

root, G = prepare(results_dir, gpus, measure, "ncu", size, configs)
T = tables.torch_kernels(root, G, "step")
S = tables.ncu_summaries(root, G, "paper")
if S.empty:
    print(plots.no_data_text("ncu reports in paper mode", "ncu"))
else:
    display(table(S[["gpu", "config"]].drop_duplicates().sort_values(["gpu", "config"])))

# %% [markdown]
# The GPU × configuration pairs with Nsight Compute reports in paper mode.
#
# ## Fig. 8 — kernel mix per configuration (whole step)

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-8", "caption": "The paper's Fig. 8, measured: share of kernel time per category in every kernel of one steady-state training step (torch.profiler, whole step), per GPU and configuration. Below: each kernel share the paper reports (§6.1), the same subject measured on our whole steps beside it, the paper's value hatched and labelled as the paper states it (its scope is its 100-kernel window)."}}
m8 = (tables.ordered(M.kernel_mix(T, "category", "duration_us", ["gpu_slug", "config"]), ["gpu_slug", "config"])
      if not T.empty else pd.DataFrame())
if m8.empty:
    fig = plots.no_data("torch.profiler step tables", "bench")
else:
    rows8 = m8.groupby(["gpu_slug", "config"], observed=True).ngroups
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 0.45 * rows8 + 6), gridspec_kw={"height_ratios": [0.45 * rows8 + 1, 4]})
    plots.stacked_shares(m8, ["gpu_slug", "config"], "category", "Kernel mix of a whole training step", ax=ax)
    shares8 = tables.kernel_shares_vs_paper(T, "Fig 8", "duration_us")
    plots.bars(shares8, "x", "value", "The paper's kernel shares and ours (whole step)", "share of kernel time (%)", ax2)
    plots.rotate_ticks(ax2, 30)
plots.finish(fig)

# %% [markdown]
# The paper reports that channels-last (OPT2) collapses the convolution share and leaves the step to elementwise
# kernels (its hatched bar below). Our whole steps show each configuration's convolution share in the upper panel:
# TF32 (`opt1`) is what shrinks it. With both (`opt12`), layout copies (category *copy*: elementwise kernels that copy between memory formats) take a
# large share. The paper's 100-kernel windows may simply not contain the step's convolutions — see the end-to-end
# chapter.
#
# ## Normalized cycles, instructions and IPC (§6.1)
#
# Sums over the kernels of an ncu report, divided by `baseline` on the same GPU; IPC is the geometric mean of
# per-kernel IPC (§3.2). Two scopes: the paper's window (paper mode: the 11th–110th kernel from process start, `--set
# full`) and a whole steady-state training step (step mode: every kernel between cudaProfilerStart/Stop, the one-pass
# `core` metric set).

# %% tags=["hide-input"]
norm = tables.normalized_scopes(root, G)
ref61 = paper.values(figure="§6.1")
if norm.empty:
    print(plots.no_data_text("ncu reports in paper or step mode", "ncu"))
else:
    display(table(tables.scope_pivot(norm), index=True))

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-norm", "caption": "The paper's §6.1, measured: summed cycles, summed instructions and the geometric-mean IPC of each configuration divided by the baseline's on the same GPU, for the paper's 100-kernel window and for a whole step (ncu), beside the paper's ratios (hatched, §6.1). The line marks 1×."}}
fig = plots.normalized_bars(norm, ref61, tables.CONFIG_ORDER) if not norm.empty else plots.no_data("ncu reports", "ncu")
plots.finish(fig)

# %% [markdown]
# **TF32 (`opt1`).** The table's `opt1` rows give, per GPU and scope, the cycles, instructions and IPC against the
# baseline; the figure sets the paper's H100 and A100 values (hatched) beside them. Convolutions, which TF32 moves
# to tensor cores, take a smaller share of the window's kernel time than of a whole step's (end-to-end chapter), so
# the window understates what TF32 saves. PyTorch's own default (`pytorch-default`: TF32 for cuDNN convolutions, not
# for matmuls) lands next to `opt1` in both scopes (its rows). A run that forgets to switch TF32 off measures a TF32 run: a baseline that keeps
# PyTorch's defaults already has TF32 convolutions.
#
# **Channels-last (`opt2`, `opt12`).** The paper reports cycles and instructions falling under `opt2` on A100/H100
# (hatched). Our `opt2` rows give its cycles against the baseline in the window and over a whole step (its step time
# is in the end-to-end chapter's state table), and the `opt12` rows against `opt1`'s. Where channels-last adds cycles,
# it adds layout copies rather than removing the convolutions' work.
#
# ## Fig. 9 — instruction mix per configuration

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-9", "caption": "The paper's Fig. 9, measured: instruction classes (sass__inst_executed_per_opcode_category) of all kernels of the paper's 100-kernel window, per GPU and configuration (ncu, paper mode). Below: the class shares the paper reports for the dominant convolution (§6.1, hatched) beside the same classes of the longest convolution in our windows."}}
I = store.load_table("ncu_paper_instructions", root, G)
K = tables.ncu_kernels(root, G, "paper")
if I.empty:
    fig = plots.no_data("instruction classes of ncu reports in paper mode", "ncu")
else:
    im = tables.ordered(M.instruction_mix(I, group=["gpu_slug", "config"]), ["gpu_slug", "config"])
    rows9 = im.groupby(["gpu_slug", "config"], observed=True).ngroups
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 0.45 * rows9 + 5), gridspec_kw={"height_ratios": [0.45 * rows9 + 1, 3.2]})
    plots.stacked_shares(im, ["gpu_slug", "config"], "class", "Instruction mix of the ncu window", ax=ax,
                         xlabel="share of instructions (%)")
    plots.bars(tables.instruction_shares_vs_paper(K, I, ["Fig 9"], only_paper=True), "x", "value",
               "Instruction classes of the dominant convolution: the paper's and ours", "share of instructions (%)", ax2)
    plots.rotate_ticks(ax2)
plots.finish(fig)

# %% [markdown]
# ## Figs. 10–13 — utilization, memory, warps, stalls
#
# Kernel-duration-weighted means over the report's kernels (pipe utilizations, SM throughput, hit rates, DRAM
# throughput, active warps), totals for stalls; relative values divide by baseline.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-10", "caption": "The paper's Fig. 10, measured: tensor, FMA and ALU pipe utilization and SM throughput (% of peak), kernel-duration-weighted over the paper's 100-kernel window (ncu, paper mode), per GPU and configuration, beside the paper's values (hatched, §6.2)."}}
t10 = plots.paper_metrics(S, ["tensor_pipe_pct", "fma_pipe_pct", "alu_pipe_pct", "sm_throughput_pct"], "Fig 10",
                            "Fig. 10 — pipe utilization and SM throughput", "% of peak")

# %% tags=["hide-input"]
plots.show_table(t10, "ncu reports in paper mode", "ncu", digits=3)

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-11", "caption": "The paper's Fig. 11, measured: L1 and L2 hit rates and DRAM throughput (%), kernel-duration-weighted over the paper's 100-kernel window (ncu, paper mode), per GPU and configuration, beside the paper's values (hatched, §6.3)."}}
t11 = plots.paper_metrics(S, ["l1_hit_pct", "l2_hit_pct", "dram_throughput_pct"], "Fig 11",
                            "Fig. 11 — L1/L2 hit rate and DRAM throughput", "%")

# %% tags=["hide-input"]
plots.show_table(t11, "ncu reports in paper mode", "ncu", digits=3)

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-12", "caption": "The paper's Fig. 12, measured: active warps per cycle, kernel-duration-weighted over the paper's 100-kernel window and divided by the baseline's on the same GPU, beside the paper's ratios (hatched, §6.4)."}}
t12 = plots.paper_metrics(S, ["rel_warps_active"], "Fig 12", "Fig. 12 — active warps per cycle relative to baseline",
                            "× baseline")

# %% tags=["hide-input"]
plots.show_table(t12, "ncu reports in paper mode", "ncu", digits=3)

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-13", "caption": "The paper's Fig. 13, measured: long-scoreboard, math-pipe-throttle and branch-resolving warp stalls summed over the paper's 100-kernel window, divided by the baseline's on the same GPU, beside the paper's ratios (hatched, §6.5)."}}
t13 = plots.paper_metrics(S, ["rel_stall_long_scoreboard", "rel_stall_math_pipe_throttle", "rel_stall_branch_resolving"],
                            "Fig 13", "Fig. 13 — warp stalls relative to baseline", "× baseline")

# %% tags=["hide-input"]
plots.show_table(t13, "ncu reports in paper mode", "ncu", digits=3)

# %% [markdown]
# Figs. 10, 11 and 13 need counters that only paper mode collects (step mode keeps to one counter pass so a whole 128³
# step profiles in about a minute), so they show the paper's window. What could not be compared: the paper's V100 and
# A100 values (we had neither GPU). `pytorch-default` has no counterpart in the paper; its bars are ours. GPUs the
# paper did not run (the H200 among them) have no paper bars beside theirs.
