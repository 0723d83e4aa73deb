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
# # The last milliseconds: every norm at its minimal bytes, every convolution at its best
#
# What takes `bf16-graphs` to `fast` ({doc}`06_beyond`): kernel levers past `bf16-graphs`, each a knob
# and a configuration of its own, measured alone and together, then the norms and the
# convolutions shape by shape against what their bytes and their shapes allow. Whole-head model,
# 128³, batch 1.

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # True: time these variants on this machine's GPU first (bench, about 15 minutes)
size = 128  # volume side when measuring
configs = "bf16-graphs,fast-tnorm,fast-p8,fast-tnorm-p8,fast-tconv,fast-tnorm-tconv,fast-dense,fast-tnorm-tconv-dense,fast-tnorm-tconv-dense-fold,fast"  # the kernel variants to time

# %% tags=["remove-cell"]
from IPython.display import display

from medddpm.report import fast_facts, fast_tables, plots, tables
from medddpm.report.measure import prepare
from medddpm.report.notebook import glue_facts
from medddpm.report.present import table

root, G = prepare(results_dir, gpus, measure, "ladder", size, configs)
glue_facts(fast_facts.kernels(root, G))

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
KV = fast_tables.kernel_variants(root, G)
if KV.empty:
    print(plots.no_data_text("bench rows of fast's kernel variants", f"medddpm bench --size 128 --warmup 5 "
                             f"--config {configs} --out data/results/<gpu>/bench.csv"))
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
LY = fast_tables.layer_costs(root, G)
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
TC = fast_tables.thin_convs(root, G)
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
# The levers past `fast` — FP8 in the forward pass, the skip gradients in the norm's backward, the
# upsampling as Triton kernels — and what is left above the bounds are in {doc}`13_stretch`.
