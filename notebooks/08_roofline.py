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
# # The roofline
#
# Every kernel as a point: FLOPs over DRAM bytes (arithmetic intensity) against the FLOP/s it
# reached, under the roofs of the same GPU (`peaks.json`: dense matmuls in bf16, TF32 and FP32,
# and a device-to-device copy for the DRAM bandwidth). FLOPs are ncu's tensor-path operation
# counters plus 2 × FFMA + FADD + FMUL thread instructions
# (`medddpm.profiling.metrics.roofline_points`); one tensor-path operation is one FLOP, checked on
# matmuls of known size (`scripts/probes/roofline_probe.py`, `roofline_probe.csv`: the checks table below).
#
# The points of a whole step come from ncu's roofline mode (`medddpm profile --mode roofline`):
# every kernel of one steady training step with its time, its DRAM bytes and the FLOP counter of
# the one pipe its configuration computes on: bf16 tensor ops for `bf16-graphs`, TF32 tensor ops for
# `opt1`, the FP32 pipes for `baseline`. One pipe per run keeps the counter passes a kernel few
# (`fast_path/ncu_passes.csv`, in the checks table): with more passes ncu replays each kernel and restores the device
# memory before every pass, and the thousands of kernels of a `bf16-graphs` step no longer fit a 10-minute run. A
# kernel whose pipe is not the configuration's (an FP32 elementwise kernel in `bf16-graphs`) counts no
# FLOPs and is bound by its bytes.

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # no measurement of its own (ncu: 03_characterization measures it, and `medddpm profile --mode roofline`); True says so, then renders
size = 128  # volume side when measuring
configs = "baseline,opt1"  # not used: this chapter measures nothing

# %% tags=["remove-cell"]
from IPython.display import display

from medddpm.report import fast_tables, plots, tables
from medddpm.report.measure import render_only
from medddpm.report.present import table

root, G = render_only(results_dir, gpus, measure, "03_characterization (ncu, with measure) and `medddpm profile --mode roofline`")
RR = fast_tables.ceilings(root, G)
RW = fast_tables.roofline(root, G, "roofline")
RP = fast_tables.roofline(root, G, "paper")
GAP = fast_tables.roofline_gap(RW, RR)
ROOFLINE = "medddpm profile --mode roofline"

# %% [markdown]
# ## Where it stands
#
# Per GPU, the kernel time of one `bf16-graphs` and one `fast` step against the time the same FLOPs and DRAM bytes
# would take at the roofs (each kernel at its pipe's ceiling or at the DRAM bandwidth, whichever is slower), the gap,
# the convolutions' share of it, and whether the 50 ms target lies within that bound. ncu flushes the caches before
# each kernel, so these bytes are what a kernel moves from a cold L2: an upper bound on its traffic inside a step, and
# the bound an upper bound too.

# %% tags=["hide-input"]
plots.show_table(fast_tables.roofline_state(GAP), "ncu roofline-mode reports of bf16-graphs and fast", ROOFLINE)
plots.show_table(fast_tables.roofline_checks(root, G, RP), "fast_path/roofline_probe.csv, fast_path/ncu_passes.csv "
                 "and the paper-mode reports", "python scripts/probes/roofline_probe.py")

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-roofline-step", "caption": "Roofline of a whole training step (ncu roofline mode: every kernel of one steady step, 128³, batch 1) for `baseline`, `opt1` and `bf16-graphs`, per GPU with such reports: every kernel with counted FLOPs at its arithmetic intensity (FLOP per DRAM byte) and achieved TFLOP/s, area = share of the step's kernel time, colour = category; lines: the GPU's measured roofs (bf16, TF32 and FP32 dense matmul ceilings, DRAM bandwidth of a device copy)."}}
plots.finish(plots.roofline_figure(RW, RR, ["baseline", "opt1", "bf16-graphs"],
                                   "ncu roofline-mode reports and the GPU's peaks.json", "roofline"))

# %% tags=["remove-cell"]
RWS = fast_tables.roofline_summary(RW, RR)

# %% tags=["hide-input"]
if not RWS.empty:
    display(table(RWS.rename(columns={"kernels": "kernels in step", "no_flops_share": "time with no FLOPs",
                              "half_bound_share": "time at ≥ half the bound", "window_tflops": "step TFLOP/s (counted)"}), 2))

# %% [markdown]
# How far each kind of kernel is from its own roofline bound in `bf16-graphs`: the kernel time, the time
# the same FLOPs and DRAM bytes would take at the roofs (each kernel at its pipe's ceiling or at
# the DRAM bandwidth, whichever is slower), and the difference:

# %% tags=["hide-input"]
if not GAP.empty:
    display(table(GAP[GAP["config"].isin(["bf16-graphs", "fast"])].rename(columns={
        "time_ms": "kernel ms", "bound_ms": "at the roofline (ms)", "gap_ms": "above it (ms)",
        "bound_fraction": "bound / time", "gap_share": "share of the gap"}), 2))
HI = fast_tables.roofline_highlights(RW, RR)
plots.show_table(HI[HI["config"].isin(["baseline", "bf16-graphs", "fast"])] if len(HI) else HI,
                 "ncu roofline-mode reports", ROOFLINE, digits=3)

# %% [markdown]
# Most of the gap lies in the convolutions (the state table's share). The Triton kernels of the fused NDHWC GroupNorm
# and the elementwise tails run at a fraction of their bandwidth bound (`bound / time`): they gain from moving fewer
# bytes (fusing the normalization into the convolutions' prologues and epilogues) more than from better kernels. The
# last table names the longest kernel of each kind per configuration, its TFLOP/s against its pipe's roof
# (`compute_fraction`) and its DRAM traffic against the bandwidth (`bandwidth_fraction`); the longest convolutions are
# gradient passes, which the paper's 100-kernel window (below) does not reach (the checks table counts them there).
#
# Since the gap is in cuDNN's convolution kernels, one more knob lets cuDNN's autotuner time every algorithm it offers
# for each convolution instead of PyTorch's first ten (`cudnn_benchmark_limit=0`, configuration
# `bf16-graphs-cudnn-all`), timed on one machine beside `bf16-graphs` before and after it:

# %% tags=["hide-input"]
CA = tables.fast_path_csv(root, G, "cudnn_all_bench")
plots.show_table(CA[["gpu_slug", "config", "step_ms_median", "step_ms_min", "step_ms_max"]] if len(CA) else CA,
                 "fast_path/cudnn_all_bench.csv", "medddpm bench --config bf16-graphs,bf16-graphs-cudnn-all")

# %% [markdown]
# The algorithms cuDNN has do not close the gap: every algorithm timed gives about the step it had.
#
# **`bf16-graphs` in the paper's metrics.** Profiled like the paper's configurations over a whole step
# (ncu step mode, the one-pass `core` set), `bf16-graphs`'s instructions, cycles and geometric-mean IPC as multiples of
# the FP32 baseline's; the §6.1 figure of {doc}`04_interventions` draws these beside `opt1`, `opt2` and `opt12`.

# %% tags=["hide-input"]
NS = tables.normalized_scopes(root, G)
plots.show_table(NS[(NS["config"] == "bf16-graphs") & (NS["mode"] == "step")][["gpu", "config", "metric", "measured"]]
                 if len(NS) else NS, "ncu step-mode reports of baseline and bf16-graphs", "medddpm profile --mode step",
                 digits=3)

# %% [markdown]
#
# **The paper's window.** The paper-mode reports (its 100-kernel window with `--set full`, which
# records the same counters) give the same view for the paper's configurations, `opt12` included:

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-roofline", "caption": "Roofline of the paper's 100-kernel window (ncu, full set) for `baseline`, `opt1` and `opt12`, per GPU with such reports: every kernel with counted FLOPs at its arithmetic intensity (FLOP per DRAM byte) and achieved TFLOP/s, area = share of the window's kernel time, colour = category; lines: the GPU's measured roofs (bf16, TF32 and FP32 dense matmul ceilings, DRAM bandwidth of a device copy)."}}
plots.finish(plots.roofline_figure(RP, RR, ["baseline", "opt1", "opt12"],
                                   "ncu reports with DRAM counters and the GPU's peaks.json", "ncu"))

# %% tags=["remove-cell"]
RS = fast_tables.roofline_summary(RP, RR)

# %% tags=["hide-input"]
if not RS.empty:
    display(table(RS.rename(columns={"kernels": "kernels in window", "no_flops_share": "time with no FLOPs",
                             "half_bound_share": "time at ≥ half the bound", "window_tflops": "window TFLOP/s"}), 2))

# The longest kernel of each kind in the window, per configuration:

# %% tags=["hide-input"]
plots.show_table(fast_tables.roofline_highlights(RP, RR), "ncu paper-mode reports", "ncu", digits=3)

# %% [markdown]
# The counters check out on the model too: the longest convolution of the window counts what the formula gives (the
# checks table above). In the FP32 baseline that forward convolution runs near the FP32 roof (`compute_fraction`):
# the paper's baseline is compute-bound on the FP32 pipes. TF32 (`opt1`) moves it to the tensor cores, far under the
# TF32 roof. The normalization statistics kernel (`RowwiseMomentsCUDAKernel`), at a few FLOP per byte, uses a small
# part of the bandwidth (`bandwidth_fraction`): far under both roofs, so neither DRAM nor the FP32 pipes limit it.
# That gap is the room the fused NDHWC GroupNorm kernels of the ladder take. In `opt12` a large share of the window's
# time goes to kernels with no FLOPs at all (the summary's `time with no FLOPs`): the layout copies channels-last pays
# for, which run near the DRAM bandwidth.
