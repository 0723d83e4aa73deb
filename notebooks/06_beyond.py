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
# # Beyond the paper: the fast path
#
# The paper stops at TF32 (OPT1) and a channels-last layout that makes things slower (OPT2). This
# chapter climbs a ladder of configurations (`medddpm/core/config.py`, `LADDER`), each rung adding one
# thing to the one before: bf16 autocast, `torch.compile`, cuDNN's autotuner, NDHWC end to end
# (layout-preserving GroupNorm+SiLU and ×2 upsampling, `medddpm/net/ndhwc.py`), SDPA attention with
# the fused Adam, the whole training step as one CUDA graph with the data on the GPU
# (`bf16-graphs`), and last `fast`: `bf16-graphs` with every kernel lever below (Triton
# GroupNorm and thin-convolution kernels, dense skip gradients, the folded bias, graph-owned
# gradients; each measured on its own).
# Whole-head model, 128³, batch 1, forward + L1 loss + backward + Adam; CUDA events.

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # True: time every rung on this machine's GPU first (about 10 minutes)
size = 128  # volume side when measuring
configs = "baseline,opt1,bf16,bf16-compile,bf16-compile-tuned,bf16-ndhwc,bf16-ndhwc-sdpa,bf16-graphs,fast"  # rungs (and the best kernel variant) to measure

# %% tags=["remove-cell"]
import matplotlib.pyplot as plt

from medddpm.profiling import metrics as M
from medddpm.report import plots, tables
from medddpm.report.measure import prepare
from IPython.display import display

from medddpm.report import facts
from medddpm.report.notebook import glue_facts
from medddpm.report.present import table

root, G = prepare(results_dir, gpus, measure, "ladder", size, configs)
glue_facts(facts.beyond(root, G))
L = tables.ladder(root, G)

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-ladder", "caption": "The fast-path ladder: median training step (forward + L1 loss + backward + Adam, 128³, batch 1, CUDA events) for each rung, per GPU ({glue:text}`ladder_gpus`); each bar labelled with its speed-up over the previous rung and over the FP32 baseline. The paper's best (OPT1) is the second rung."}}
if L.empty:
    fig = plots.no_data("bench rows of the ladder's configurations", "ladder")
else:
    fig, ax = plt.subplots(figsize=(11, 4.8))
    plots.ladder(L, ax)
    ax.set_title("Training step per rung, 128³, batch 1 (×previous rung, (×baseline))")
plots.finish(fig)

# %% tags=["hide-input"]
if not L.empty:
    display(table(L[["gpu_slug", "config", "step_ms_median", "fwd_ms_median", "peak_mem_gib", "speedup_vs_previous",
             "speedup_vs_baseline", "tflops", "peak_fraction"]], 3))

# %% [markdown]
# Larger batches for `bf16-graphs` (the same step, N volumes at once):

# %% tags=["hide-input"]
FB = tables.bench(root, G, ["bf16-graphs"], batch=None)
if not FB.empty:
    display(table(FB[["gpu_slug", "batch", "step_ms_median", "volumes_per_s", "peak_mem_gib"]], 3))

# %% [markdown]
# On the {glue:text}`ref_gpu` `fast` takes {glue:text}`ref_fast_ms` ms a step:
# {glue:text}`ref_fast_x`× the FP32 baseline and {glue:text}`ref_fast_vs_opt1`× the paper's best
# (OPT1, {glue:text}`ref_opt1_ms` ms). It {glue:text}`ref_target_verdict` the 50 ms target. It
# reaches {glue:text}`ref_fast_tflops` TFLOP/s of model arithmetic,
# {glue:text}`ref_fast_peak_pct` of the bf16 matmul peak measured on the same GPU (`peaks.json`).
# `bf16-graphs`, the rung before it, takes {glue:text}`ref_bf16-graphs_ms` ms. The
# {glue:text}`alt_gpu` gives {glue:text}`alt_fast_ms` ms (`bf16-graphs`:
# {glue:text}`alt_bf16-graphs_ms`). The biggest single steps are bf16
# ({glue:text}`ref_bf16_ms` ms) and `torch.compile` ({glue:text}`ref_bf16-compile_ms` ms), which
# fuses GroupNorm, SiLU and the elementwise tails into Triton kernels.
#
# **What the paper's OPT2 would have needed.** Channels-last only pays once nothing converts back:
# with PyTorch's own GroupNorm and upsampling, cuDNN inserts `nchwToNhwc`/`nhwcToNchw` transposes
# around every convolution (see the kernel mix below). Written layout-preserving, NDHWC is the
# fastest layout ({glue:text}`ref_bf16-ndhwc_ms` ms against {glue:text}`ref_bf16-compile-tuned_ms`
# ms for the same knobs in NCDHW).

# %% [markdown]
# ## Where the time goes
#
# Every kernel of one steady step (torch.profiler), grouped by the book's categories, for the best
# NCDHW rung and for `bf16-graphs`. Inductor names its fused kernels after the operations in them,
# so a fused GroupNorm kernel that contains a `permute` is counted under "layout transform" here.

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-fast-mix", "caption": "Share of kernel time per category in every kernel of one steady training step (torch.profiler, whole step) of `baseline`, `opt1`, the best NCDHW rung (`bf16-compile-tuned`) and `bf16-graphs`, per GPU with tables for them."}}
T = tables.torch_kernels(root, G, "step", ["baseline", "opt1", "bf16-compile-tuned", "bf16-graphs"])
if not T.empty:
    mix = tables.ordered(M.kernel_mix(T, duration="duration_us", group=["gpu_slug", "config"]), ["gpu_slug", "config"])
    fig, ax = plt.subplots(figsize=(10, 0.45 * mix.groupby(["gpu_slug", "config"], observed=True).ngroups + 1.5))
    plots.stacked_shares(mix, ["gpu_slug", "config"], "category", "Kernel mix of one step", ax=ax)
else:
    fig = plots.no_data("torch.profiler step tables of the ladder", "ladder")
plots.finish(fig)

# %% [markdown]
# In `bf16-graphs` on the {glue:text}`ref_gpu` the convolutions (cuDNN implicit GEMMs, forward,
# data-gradient and weight-gradient) take {glue:text}`ref_fast_conv_ms` of
# {glue:text}`ref_fast_kernel_ms` ms of kernel time; the remaining {glue:text}`ref_fast_other_ms` ms are Triton kernels of the normalizations and their
# backward, and elementwise work. The FLOP floor of a whole step (3 × forward FLOPs at the
# measured bf16 matmul peak) is {glue:text}`ref_floor_ms` ms, so the convolutions alone sit well
# above it, and the normalization kernels are further still from their bandwidth bound: both are
# where the rest of the gap to 50 ms lies.

# %% [markdown]
# ## The last milliseconds: every norm at its minimal bytes, every convolution at its best
#
# Two levers past `bf16-graphs`, each a knob and its own configuration (`medddpm/core/config.py`,
# `KERNEL_VARIANTS`): `fast-tnorm` runs GroupNorm + SiLU, and the time-embedding add in front of a
# ResBlock's second norm, through hand-written Triton kernels (`medddpm/net/kernels.py`) that move
# the fewest bytes the operation allows (forward: one read for the statistics, one read and one
# write for the apply; backward: one read of x and dy for the reductions, one read of each and one
# write of dx), where Inductor's generated kernels move more. `fast-p8` zero-pads the stem (3
# channels in) and the output convolution (1 channel out) to 8 channels, the same sums and the
# same parameters; `fast-tnorm-p8` has both. `fast-tconv` runs those two thin convolutions through
# Triton kernels of their own instead (`kernels.conv3d_thin`), each pass a matrix product per
# tile of voxels that streams the 64-channel side once: a thin input's 27 neighbours gathered
# into one row per voxel; a thin output as every voxel's products with all 27 taps, then their
# shifted sum; the weight gradient as gathered thin side × wide side, summed per program. The
# engine hands the denoiser its input (image + mask) in the model's layout, so the stem takes them
# in training as in sampling. `fast-tnorm-tconv` has both Triton levers.
#
# Three more levers go on top of it, one knob each. `fast-tnorm-tconv-dense`
# (`dense_skip_grads`): the gradient of a decoder skip concatenation's input is a channel slice
# of the concatenation's gradient, strided in NDHWC, and cuDNN's backward of the convolution that
# produced the input copied it with PyTorch's generic strided kernel first; handed over dense, the
# copies go (the same numbers). `fast-tnorm-tconv-dense-fold` (`fold_conv_bias`): each ResBlock's
# first convolution runs without its bias, which joins the timestep embedding's per-channel add
# inside the second norm's Triton kernels, so no kernel reads and writes the convolution's output
# just to add it, and no reduction computes its gradient. `fast` (`graph_owned_grads`): the
# captured step leaves each parameter's gradient where autograd writes it, instead of adding it
# into a zeroed static `.grad` (one add kernel per parameter) as PyTorch's whole-network capture
# example does.

# %% tags=["hide-input"]
KV = tables.kernel_variants(root, G)
if KV.empty:
    print(plots.no_data_text("bench rows of fast's kernel variants", "medddpm bench --size 128 --warmup 5 "
                             "--config bf16-graphs,fast-tnorm,fast-p8,fast-tnorm-p8,fast-tconv,fast-tnorm-tconv,"
                             "fast-dense,fast-tnorm-tconv-dense,fast-tnorm-tconv-dense-fold,fast "
                             "--out data/results/<gpu>/bench.csv"))
else:
    display(table(KV[["gpu_slug", "config", "step_ms_median", "step_ms_min", "step_ms_max", "peak_mem_gib",
                      "speedup_vs_base"]], 2))

# %% [markdown]
# On the {glue:text}`kv_ref_gpu` the best variant, {glue:text}`kv_ref_best`, takes
# {glue:text}`kv_ref_best_ms` ms a step against `bf16-graphs`'s {glue:text}`kv_ref_base_ms` ms
# ({glue:text}`kv_ref_best_x`×, {glue:text}`kv_ref_best_gain_ms` ms less): it
# {glue:text}`kv_ref_best_vs_target`.
# The norm kernels alone give {glue:text}`kv_ref_fast-tnorm_ms` ms, the padding alone
# {glue:text}`kv_ref_fast-p8_ms` ms and the thin-convolution kernels alone
# {glue:text}`kv_ref_fast-tconv_ms` ms; both Triton levers {glue:text}`kv_ref_fast-tnorm-tconv_ms` ms,
# with dense skip gradients {glue:text}`kv_ref_fast-tnorm-tconv-dense_ms` ms, with the folded bias
# {glue:text}`kv_ref_fast-tnorm-tconv-dense-fold_ms` ms and with graph-owned gradients (`fast`)
# {glue:text}`kv_ref_fast_ms` ms. On the {glue:text}`kv_alt_gpu`, {glue:text}`kv_alt_best`
# takes {glue:text}`kv_alt_best_ms` ms against {glue:text}`kv_alt_base_ms` ms
# ({glue:text}`kv_alt_best_x`×).
#
# **Is it still right?** The denoiser's ε of {glue:text}`kv_ref_best` is {glue:text}`kv_best_rel`
# from the FP64 one (relative L2, worst over t, 64³), `bf16-graphs`'s {glue:text}`kv_fast_rel`
# and `fast-tnorm`'s {glue:text}`kv_fast-tnorm_rel`: the same bf16 rounding level. After 50
# training steps at 64³ (seed 0, the quality chapter's loss-parity runs) its held-out loss is
# {glue:text}`kv_best_lp` ({glue:text}`kv_best_lp_verdict` the FP32 baseline's seed band
# {glue:text}`kv_lp_band`), `bf16-graphs`'s {glue:text}`kv_fast_lp` ({glue:text}`kv_fast_lp_verdict`).
# One seed of each cannot separate them from each other. `fast`, every lever together, is the
# ladder's last rung (the quality chapter also checks the sampling variants' ε from trained
# weights against FP32); the other variants stay variants, measured beside `bf16-graphs`.
#
# **The norms, shape by shape** ({glue:text}`nm_gpu`; `python -m medddpm.profiling.layers --norms`): each
# GroupNorm shape of the 128³ step with at least 4 M elements ({glue:text}`nm_shapes` shapes,
# {glue:text}`nm_layers` of the model's 39 norms), bf16 NDHWC, replayed as a CUDA graph in both
# implementations, beside the minimal bytes (megabytes for all layers of the shape):

# %% tags=["hide-input"]
NM = tables.fast_path_csv(root, G, "norms")  # python -m medddpm.profiling.layers --norms
if NM.empty:
    print(plots.no_data_text("GroupNorm timings (fast_path/norms.csv)",
                             "python -m medddpm.profiling.layers --norms --out data/results/<gpu>/fast_path/norms.csv"))
else:
    display(table(NM[["gpu_slug", "signature", "count", "min_step_mb", "inductor_forward_ms", "triton_forward_ms",
                      "inductor_step_ms", "triton_step_ms", "inductor_step_tbs", "triton_step_tbs"]], 2))

# %% [markdown]
# Forward and backward together these norms must move {glue:text}`nm_min_step_gb` GB. Inductor's
# kernels take {glue:text}`nm_inductor_step_ms` ms for them ({glue:text}`nm_inductor_step_tbs`
# TB/s of necessary traffic), the Triton kernels {glue:text}`nm_triton_step_ms` ms
# ({glue:text}`nm_triton_step_tbs` TB/s); forward only, {glue:text}`nm_inductor_forward_ms`
# against {glue:text}`nm_triton_forward_ms` ms. Kernel by kernel, on the largest norm
# ({glue:text}`nt_shape`), the Triton kernels move their necessary bytes at
# {glue:text}`nt_apply_tbs` TB/s (forward apply), {glue:text}`nt_stats_tbs` (statistics),
# {glue:text}`nt_reduce_tbs` (backward reductions) and {glue:text}`nt_dx_tbs` (dx)
# (`fast_path/norm_tiles.csv`, six launch shapes); the slower of these, and the smaller shapes in
# the table above, are where the norms still lose time against the memory's speed.
#
# **The convolutions, layer by layer** ({glue:text}`ly_gpu`; `python -m medddpm.profiling.layers --profile
# --config` {glue:text}`ly_config`): every convolution kernel of one step of
# {glue:text}`ly_config` (profiled without its CUDA graph), attributed to its shape and pass,
# beside cuDNN's autotuned time for that shape on its own (× the layers of that shape). The
# largest first; kernels of a convolution op that compute no pass (bias gradients, copies) at the
# end:

# %% tags=["hide-input"]
LY = tables.layer_costs(root, G)
if LY.empty:
    print(plots.no_data_text("per-layer convolution accounting (fast_path/layers.csv)",
                             "python -m medddpm.profiling.layers --profile --out data/results/<gpu>/fast_path/layers.csv"))
else:
    display(table(LY[["gpu_slug", "config", "signature", "pass", "count", "ms", "tflops", "isolated_ms",
                      "lost_ms"]].head(16),
                  {"ms": 2, "tflops": 0, "isolated_ms": 2, "lost_ms": 2}))

# %% [markdown]
# The step's convolution passes take {glue:text}`ly_conv_ms` ms; the same shapes on their own,
# each at cuDNN's best algorithm, take {glue:text}`ly_isolated_ms` ms, and
# {glue:text}`ly_above` of {glue:text}`ly_rows` shape-and-pass rows run slower in the step than
# alone. So no convolution loses time to its place in the step: what is left is the shapes
# themselves. The largest is {glue:text}`ly_top` at {glue:text}`ly_top_tflops` TFLOP/s
# ({glue:text}`ly_top_ms` ms), the slowest {glue:text}`ly_slow` at {glue:text}`ly_slow_tflops`
# TFLOP/s ({glue:text}`ly_slow_ms` ms). The two thin convolutions (3 channels in, 1 out) took
# {glue:text}`ly_thin_fast_ms` ms of `bf16-graphs`'s step with cuDNN and take {glue:text}`ly_thin_ms` ms
# here. Kernels that compute no pass add {glue:text}`ly_other_ms` ms. On the
# {glue:text}`ly_alt_gpu` ({glue:text}`ly_alt_config`) the convolution passes take
# {glue:text}`ly_alt_conv_ms` ms against {glue:text}`ly_alt_isolated_ms` ms on their own, with
# {glue:text}`ly_alt_above` of {glue:text}`ly_alt_rows` rows slower in the step. The milliseconds still
# between `fast` and the 40 ms stretch are in the 64-channel 128³ convolutions, already at cuDNN's
# best for their shape, in the norms' reductions, and in the Triton elementwise kernels around
# them.
#
# **The thin convolutions on their own** ({glue:text}`tc_gpu`; `scripts/probes/thin_conv_probe.py`):
# each pass a training step runs, cuDNN (autotuned) against the Triton kernels with the package's
# launch shapes, replayed as CUDA graphs, and the bandwidth the Triton pass reaches on its minimal
# bytes (the 64-channel side once, the thin side once):

# %% tags=["hide-input"]
TC = tables.thin_convs(root, G)
if TC.empty:
    print(plots.no_data_text("thin-convolution timings (fast_path/thin_convs.csv)",
                             "python scripts/probes/thin_conv_probe.py --out data/results/<gpu>/fast_path/thin_convs.csv"))
else:
    display(table(TC[["gpu_slug", "shape", "pass", "ms_cudnn", "ms_triton", "speedup", "triton_tbs"]],
                  {"ms_cudnn": 3, "ms_triton": 3, "speedup": 1, "triton_tbs": 2}))

# %% [markdown]
# Together these passes take {glue:text}`tc_cudnn_ms` ms with cuDNN and {glue:text}`tc_triton_ms`
# ms with the Triton kernels. Passes where cuDNN stays ahead: {glue:text}`tc_cudnn_ahead`. The
# training step keeps cuDNN for the stem in any case (its input arrives NCDHW).

# %% [markdown]
# ## The roofline
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

# %% tags=["remove-cell"]
RR = tables.ceilings(root, G)
RW = tables.roofline(root, G, "roofline")

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-roofline-step", "caption": "Roofline of a whole training step (ncu roofline mode: every kernel of one steady step, 128³, batch 1) for `baseline`, `opt1` and `bf16-graphs`, per GPU ({glue:text}`roof_step_gpus`): every kernel with counted FLOPs at its arithmetic intensity (FLOP per DRAM byte) and achieved TFLOP/s, area = share of the step's kernel time, colour = category; lines: the GPU's measured roofs (bf16, TF32 and FP32 dense matmul ceilings, DRAM bandwidth of a device copy)."}}
if RW.empty or RR.empty:
    fig = plots.no_data("ncu roofline-mode reports and the GPU's peaks.json", "roofline")
else:
    fig = plots.roofline(RW, RR, ["baseline", "opt1", "bf16-graphs"])
plots.finish(fig)

# %% tags=["remove-cell"]
RWS = tables.roofline_summary(RW, RR)
GAP = tables.roofline_gap(RW, RR)

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
# With every kernel lever of the next section (`fast`) the {glue:text}`step_ref_gpu`'s step
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
# (`cudnn_benchmark_limit=0`, configuration `bf16-graphs-cudnn-all`). Timed in one session on the {glue:text}`ref_gpu`,
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
RP = tables.roofline(root, G, "paper")
if RP.empty or RR.empty:
    fig = plots.no_data("ncu reports with DRAM counters and the GPU's peaks.json", "ncu")
else:
    fig = plots.roofline(RP, RR, ["baseline", "opt1", "opt12"])
plots.finish(fig)

# %% tags=["remove-cell"]
RS = tables.roofline_summary(RP, RR)

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
# ## Does the fast path compute the same model?
#
# ε-prediction of seeded weights on fixed (x_t, mask, t) inputs at 128³, each rung against the FP32
# baseline on the same GPU (`medddpm/train/parity.py`). bf16 keeps 8 bits of mantissa, so a relative
# error near 10⁻² is what rounding alone gives; TF32 (10 bits) near 10⁻³.

# %% tags=["hide-input"]
A = tables.fast_path_csv(root, G, "agreement")
if not A.empty:
    display(table(A.pivot_table(index=["gpu_slug", "config"], columns="t", values="rel_l2"), 4, index=True))

# %% [markdown]
# **Loss after short training.** The same seeded phantoms, weights and data order, 50 Adam steps
# (batch 1, learning rate 10⁻⁴) per configuration at 64³, then the held-out denoising loss of the trained
# weights at fixed (x0, t, ε) triples, computed by the same FP32 forward for every configuration
# (`medddpm.train.parity.short_training`). Baseline with three seeds gives the seed-to-seed band.

# %% tags=["hide-input"]
LP = tables.loss_parity(root, G)
if not LP.empty:
    display(table(LP.assign(size=LP["size"].astype(str) + "³")[["gpu_slug", "config", "seed", "size", "steps", "loss"]]
                  .rename(columns={"loss": "held-out L1 loss"}), 4))

# %% [markdown]
# On the {glue:text}`lp_ref_gpu` the baseline's held-out loss after 50 steps spans
# {glue:text}`lp_band` over {glue:text}`lp_seeds` seeds; `bf16-graphs` (seed 0) ends at
# {glue:text}`lp_fast`, **{glue:text}`lp_fast_verdict`** that band. Three seeds make a narrow band and 50 steps a
# short run; the training parity of {doc}`07_quality` (1,000 steps on MNI152-based subjects,
# held-out subjects, a prediction band from the seeds) is the longer test.

# %% [markdown]
# ## The real training loop
#
# `medddpm train` feeds each step through its input pipeline (`medddpm/data/pipeline.py`, the knob
# `data_cache`): decoded volumes stacked on the GPU, in pinned host memory with the next
# micro-batch copied on a side stream, or decoded ahead by loader worker processes; `auto` (every
# configuration's default) takes the fastest whose memory rule holds, and the checkpoint and
# `log.csv` record the choice. Below, the loop on 128³ phantom NIfTI files (steady state between
# its read-backs, per micro-batch) against `medddpm bench --grad-accum` of the same configuration in
# the same device run (`scripts/loop_measure.sh`, table `loop/loop_vs_bench.csv`).

# %% tags=["remove-cell"]
LB = tables.loop_vs_bench(root, G)
SC, PR = tables.scaling(root)
SC_EARLIER = tables.scaling_earlier(root)

# %% tags=["hide-input"]
if LB.empty:
    print(plots.no_data_text("training-loop runs (loop/loop_vs_bench.csv)", "loop"))
else:
    display(table(LB[["gpu_slug", "config", "grad_accum", "data", "loop_ms_per_micro_batch", "bench_ms", "ratio"]],
                  {"loop_ms_per_micro_batch": 1, "bench_ms": 1, "ratio": 3}))

# %% [markdown]
# {glue:text}`loop_within` rows keep the loop within 3 % of its benchmark per micro-batch; the
# largest ratio is {glue:text}`loop_worst`. The pipeline every run chose: {glue:text}`loop_data`.
# Before this pipeline, configurations without a data cache (`opt1` among them) decoded a NIfTI
# file on the critical path of every step and copied it from pageable memory, a copy that waits
# for the GPU to finish the step before it: `opt1` took {glue:text}`opt1_earlier_ms` ms/step on one
# → two GPUs of the earlier run (`h200-x2/ddp-2026-11-22/`), against {glue:text}`opt1_a1_ms` now.

# %% [markdown]
# ## Several GPUs: torchrun, one all-reduce, one CUDA graph
#
# `medddpm train --nproc N` (or `torchrun --standalone --nproc-per-node N -m medddpm train …`)
# keeps every GPU's micro-batch (weak scaling); the scaling efficiency is T(1 GPU) / T(N GPUs) of
# the same configuration, micro-batch and grad-accum. Gradients are averaged as the knob
# `grad_sync` says: by default (`flat`) every parameter's gradient is a view into one flat buffer,
# divided by the world size and all-reduced once after the last micro-batch's backward pass — the
# same sums as `DistributedDataParallel`, tested bit-exact on CPU — so `bf16-graphs` keeps its whole step,
# all-reduce included, as one CUDA graph on several GPUs. `opt1-ddp` and `bf16-graphs-ddp` keep PyTorch's
# DDP buckets. Measured with the real loop on 128³ phantom NIfTI files (`scripts/ddp_scaling.sh`).

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-scaling", "caption": "Training throughput of the real training loop (`medddpm train`, 128³ phantom NIfTI files, micro-batch 1 per GPU) on one and on two GPUs (torchrun, weak scaling), for `opt1` and `bf16-graphs` with one and two micro-batches per step; bars labelled with the step time and the scaling efficiency T(1 GPU) / T(N GPUs)."}}
plots.finish(plots.scaling(SC) if not SC.empty else plots.no_data("multi-GPU scaling runs (<machine>/scaling.csv)", "scaling"))

# %% tags=["hide-input"]
if not SC.empty:
    display(table(SC[["machine", "config", "grad_accum", "world_size", "step_ms_median", "volumes_per_s",
                      "scaling_efficiency", "nccl"]], 3))

# %% [markdown]
# {glue:text}`scaling_within` two-GPU rows reach 97 % ({glue:text}`scaling_range`): `bf16-graphs`
# {glue:text}`bf16-graphs_a1_eff` ({glue:text}`bf16-graphs_a1_ms` ms/step) and {glue:text}`bf16-graphs_a2_eff` with two
# micro-batches; `opt1` {glue:text}`opt1_a1_eff` ({glue:text}`opt1_a1_ms` ms/step) and
# {glue:text}`opt1_a2_eff`. The earlier run used DDP's buckets, no CUDA graph on two ranks, and
# (for `opt1`) NIfTI decoding on the critical path; it kept {glue:text}`opt1_earlier_eff` for
# `opt1` and {glue:text}`bf16-graphs_earlier_eff` for `bf16-graphs` ({glue:text}`bf16-graphs_earlier_ms` ms/step). Its
# `opt1` NCCL kernels spanned {glue:text}`opt1_earlier_nccl` ms a step, while the same all-reduce
# alone takes under a millisecond on this NVLink pair (`ddp-2026-11-22/allreduce_probe.txt`). Our
# reading, which the new runs bear out but no trace of both ranks proves: the NCCL kernels waited
# for the other rank's decoding, whose length varies from file to file. With the volumes on the GPU
# both ranks run the same kernels in step. What `bf16-graphs` still pays on two GPUs is its all-reduce, which the flat scheme runs after the
# backward pass instead of overlapping it (the price of keeping the step one CUDA graph).

# %% tags=["hide-input"]
if not SC_EARLIER.empty:
    display(table(SC_EARLIER[["machine", "run", "config", "world_size", "step_ms_median", "scaling_efficiency",
                              "allreduce_ms"]], 3))
