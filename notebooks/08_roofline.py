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
# matmuls of known size (`scripts/probes/roofline_probe.py`, `roofline_probe.csv`:
# {glue:text}`probe_ratio`× the 2n³ FLOPs).
#
# The points of a whole step come from ncu's roofline mode (`medddpm profile --mode roofline`):
# every kernel of one steady training step with its time, its DRAM bytes and the FLOP counter of
# the one pipe its configuration computes on: bf16 tensor ops for `bf16-graphs`, TF32 tensor ops for
# `opt1`, the FP32 pipes for `baseline`. One pipe per run keeps the run at
# {glue:text}`passes_tensor` counter pass a kernel for the tensor paths
# ({glue:text}`passes_fp32` for the SASS-instrumented FP32 counters; `fast_path/ncu_passes.csv`):
# with more passes ncu replays each kernel and restores the device memory before every pass, and
# the {glue:text}`fast_step_kernels` kernels of a `bf16-graphs` step no longer fit a 10-minute run. A
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

from medddpm.report import fast_facts, fast_tables, plots
from medddpm.report.measure import render_only
from medddpm.report.notebook import glue_facts
from medddpm.report.present import table

root, G = render_only(results_dir, gpus, measure, "03_characterization (ncu, with measure) and `medddpm profile --mode roofline`")
glue_facts(fast_facts.roofline(root, G))

# %% tags=["remove-cell"]
RR = fast_tables.ceilings(root, G)
RW = fast_tables.roofline(root, G, "roofline")

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-roofline-step", "caption": "Roofline of a whole training step (ncu roofline mode: every kernel of one steady step, 128³, batch 1) for `baseline`, `opt1` and `bf16-graphs`, per GPU ({glue:text}`roof_step_gpus`): every kernel with counted FLOPs at its arithmetic intensity (FLOP per DRAM byte) and achieved TFLOP/s, area = share of the step's kernel time, colour = category; lines: the GPU's measured roofs (bf16, TF32 and FP32 dense matmul ceilings, DRAM bandwidth of a device copy)."}}
plots.finish(plots.roofline_figure(RW, RR, ["baseline", "opt1", "bf16-graphs"],
                                   "ncu roofline-mode reports and the GPU's peaks.json", "roofline"))

# %% tags=["remove-cell"]
RWS = fast_tables.roofline_summary(RW, RR)
GAP = fast_tables.roofline_gap(RW, RR)

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
        "gap_share": "share of the gap"}), 2))

# %% [markdown]
# On the {glue:text}`step_ref_gpu` the `bf16-graphs` step spends {glue:text}`step_ref_fast_time_ms` ms in
# kernels, against {glue:text}`step_ref_fast_bound_ms` ms if every kernel ran at its roofline bound
# with the DRAM traffic and FLOPs it has now, so the 50 ms target is
# {glue:text}`step_ref_fast_target_reach` the hardware for this traffic. (ncu flushes the caches
# before each kernel, so these bytes are what a kernel moves from a cold L2: an upper bound on its
# traffic inside a step, and the bound an upper bound too.) What stands between is
# {glue:text}`step_ref_fast_gap_ms` ms above the bounds, and
# {glue:text}`step_ref_fast_convolution_gap_pct` of it
# ({glue:text}`step_ref_fast_convolution_gap_ms` ms) lies in the convolutions. The Triton kernels
# of the fused NDHWC GroupNorm and the elementwise tails run at
# {glue:text}`step_ref_fast_Triton_pointwise_bound_pct` (pointwise) and
# {glue:text}`step_ref_fast_Triton_reduction_bound_pct` (reductions) of their bandwidth bound:
# they gain from moving fewer bytes (fusing the normalization into the convolutions' prologues and
# epilogues) more than from better kernels. The longest convolution kernel of the step is a
# {glue:text}`step_ref_bf16-graphs_conv_kind` at {glue:text}`step_ref_bf16-graphs_conv_tflops` TFLOP/s,
# {glue:text}`step_ref_bf16-graphs_conv_compute_pct` of the bf16 roof
# ({glue:text}`step_ref_bf16-graphs_conv_share` of the step). In the FP32 baseline the longest kernel is a
# {glue:text}`step_ref_baseline_conv_kind` too, at {glue:text}`step_ref_baseline_conv_tflops`
# TFLOP/s ({glue:text}`step_ref_baseline_conv_compute_pct` of the FP32 roof,
# {glue:text}`step_ref_baseline_conv_share` of the step). The paper's 100-kernel window (below)
# holds {glue:text}`window_grad_kernels` gradient convolutions, so it cannot see these. On the
# {glue:text}`step_alt_gpu` `bf16-graphs` is {glue:text}`step_alt_fast_time_ms` ms of kernels against a
# bound of {glue:text}`step_alt_fast_bound_ms` ms.
#
# With every kernel lever of {doc}`07_kernels` (`fast`) the {glue:text}`step_ref_gpu`'s step
# spends {glue:text}`step_ref_all_time_ms` ms in kernels against a bound of
# {glue:text}`step_ref_all_bound_ms` ms: {glue:text}`step_ref_all_gap_ms` ms above it, of which
# {glue:text}`step_ref_all_convolution_gap_ms` ms are in the convolutions. Its GroupNorm kernels
# (the Triton ones, {glue:text}`step_ref_all_normalization_ms` ms) run at
# {glue:text}`step_ref_all_normalization_bound_pct` of their bandwidth bound. On the
# {glue:text}`step_alt_gpu` the same step spends {glue:text}`step_alt_all_time_ms` ms in kernels
# against {glue:text}`step_alt_all_bound_ms` ms ({glue:text}`step_alt_all_convolution_gap_ms` ms of
# the gap in the convolutions; norms at {glue:text}`step_alt_all_normalization_bound_pct` of
# their bound).
#
# Most of that gap is in cuDNN's convolution kernels, so one more knob lets cuDNN's autotuner time
# every algorithm it offers for each convolution instead of PyTorch's first ten
# (`cudnn_benchmark_limit=0`, configuration `bf16-graphs-cudnn-all`). Timed on one machine, the {glue:text}`ref_gpu`,
# beside `bf16-graphs` before and after it, it takes {glue:text}`cudnn_all_ms` ms a step against
# {glue:text}`cudnn_all_fast_ms` ms: the algorithms cuDNN has do not close the gap.
#
# **`bf16-graphs` in the paper's metrics.** Profiled like the paper's configurations over a whole step
# (ncu step mode, the one-pass `core` set), `bf16-graphs` on the {glue:text}`ncu_ref_gpu` executes
# {glue:text}`ncu_ref_fast_instructions`× the FP32 baseline's instructions in
# {glue:text}`ncu_ref_fast_cycles`× its cycles, at {glue:text}`ncu_ref_fast_ipc`× its
# geometric-mean IPC ({glue:text}`ncu_alt_gpu`: {glue:text}`ncu_alt_fast_instructions`×,
# {glue:text}`ncu_alt_fast_cycles`×, {glue:text}`ncu_alt_fast_ipc`×). The
# §6.1 figure of {doc}`04_interventions` draws these beside `opt1`, `opt2` and `opt12`.
#
# **The paper's window.** The paper-mode reports (its 100-kernel window with `--set full`, which
# records the same counters) give the same view for the paper's configurations, `opt12` included:

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-roofline", "caption": "Roofline of the paper's 100-kernel window (ncu, full set) for `baseline`, `opt1` and `opt12`, per GPU ({glue:text}`roof_gpus`): every kernel with counted FLOPs at its arithmetic intensity (FLOP per DRAM byte) and achieved TFLOP/s, area = share of the window's kernel time, colour = category; lines: the GPU's measured roofs (bf16, TF32 and FP32 dense matmul ceilings, DRAM bandwidth of a device copy)."}}
RP = fast_tables.roofline(root, G, "paper")
plots.finish(plots.roofline_figure(RP, RR, ["baseline", "opt1", "opt12"],
                                   "ncu reports with DRAM counters and the GPU's peaks.json", "ncu"))

# %% tags=["remove-cell"]
RS = fast_tables.roofline_summary(RP, RR)

# %% tags=["hide-input"]
if not RS.empty:
    display(table(RS.rename(columns={"kernels": "kernels in window", "no_flops_share": "time with no FLOPs",
                             "half_bound_share": "time at ≥ half the bound", "window_tflops": "window TFLOP/s"}), 2))

# %% [markdown]
# The counters check out on the model too: the longest convolution of the window counts
# {glue:text}`roof_conv_tflop` TFLOP, and a 64→64-channel 3³ convolution over 128³ voxels is
# 2 · 128³ · 64 · 64 · 27 = {glue:text}`conv_formula_tflop` TFLOP. On the {glue:text}`win_ref_gpu`,
# in the FP32 baseline, that convolution reaches {glue:text}`win_baseline_conv_tflops` TFLOP/s,
# {glue:text}`win_baseline_conv_compute_pct` of the FP32 roof: the paper's baseline is
# compute-bound on the FP32 pipes. TF32 (`opt1`) moves it to the tensor cores at
# {glue:text}`win_opt1_conv_tflops` TFLOP/s, {glue:text}`win_opt1_conv_compute_pct` of the TF32
# roof ({glue:text}`win_opt1_conv_roof`). The normalization statistics kernel
# (`RowwiseMomentsCUDAKernel`), at a few FLOP per byte, moves {glue:text}`win_opt1_norm_tbps` TB/s
# of DRAM traffic, {glue:text}`win_opt1_norm_bw_pct` of the bandwidth: far under both roofs, so
# neither DRAM nor the FP32 pipes limit it. That gap is the room the fused NDHWC GroupNorm kernels
# of the ladder take. In `opt12`, {glue:text}`win_opt12_no_flops_share` of the
# window's time goes to kernels with no FLOPs at all: the layout copies channels-last
# pays for, which run at {glue:text}`win_opt12_copy_bw_pct` of the DRAM bandwidth.
#
