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
#
# ## Where it stands
#
# Per GPU, `bf16-graphs` against its fastest kernel variant, and that variant against the 50 ms target; then whether
# each variant still computes the same model.

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # True: time these variants on this machine's GPU first (bench, about 15 minutes)
size = 128  # volume side when measuring
configs = "bf16-graphs,fast-tnorm,fast-p8,fast-tnorm-p8,fast-tconv,fast-tnorm-tconv,fast-dense,fast-tnorm-tconv-dense,fast-tnorm-tconv-dense-fold,fast"  # the kernel variants to time

# %% tags=["remove-cell"]
from IPython.display import display

from medddpm.report import fast_tables, plots, tables
from medddpm.report.measure import prepare
from medddpm.report.present import table

root, G = prepare(results_dir, gpus, measure, "ladder", size, configs)
BENCH = f"medddpm bench --size 128 --warmup 5 --config {configs} --out data/results/<gpu>/bench.csv"

# %% tags=["hide-input"]
plots.show_table(fast_tables.kernel_state(root, G), "bench rows of bf16-graphs and its kernel variants", BENCH)
plots.show_table(fast_tables.variant_checks(root, G), "quality/agreement.csv and fast_path/loss_parity.csv rows of "
                 "the kernel variants", "medddpm quality", digits={"worst ε rel. L2 vs FP64": 4, "loss after 50 steps": 4,
                                                                   "band_low": 4, "band_high": 4})

# %% [markdown]
# The ε columns are the denoiser's worst relative L2 over t against an FP64 forward at 64³; the loss is the held-out
# loss after 50 training steps at 64³ (seed 0, the loss-parity runs of {doc}`06_beyond`) against the FP32 baseline's
# band over three seeds. Every variant sits at bf16's rounding level, and one seed of each cannot separate them.
# `fast`, every lever together, is the ladder's last rung; the other variants stay variants, measured beside
# `bf16-graphs`.
#
# ## The levers

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
plots.show_table(KV[["gpu_slug", "config", "step_ms_median", "step_ms_min", "step_ms_max", "peak_mem_gib",
                     "speedup_vs_base"]] if len(KV) else KV, "bench rows of fast's kernel variants", BENCH)

# %% [markdown]
# Each lever alone and the levers together, every variant's step beside `bf16-graphs`'s (`speedup_vs_base`): the norm
# kernels (`fast-tnorm`), the padding (`fast-p8`), the thin-convolution kernels (`fast-tconv`), both Triton levers,
# then dense skip gradients, the folded bias and graph-owned gradients on top, the last being `fast`.
#
# **The norms, shape by shape** (`python -m medddpm.profiling.layers --norms`): each GroupNorm shape of the 128³ step
# with at least 4 M elements, bf16 NDHWC, replayed as a CUDA graph in both implementations, beside the minimal bytes
# (megabytes for all layers of the shape), then their sums per GPU:

# %% tags=["hide-input"]
NM = tables.fast_path_csv(root, G, "norms")  # python -m medddpm.profiling.layers --norms
if NM.empty:
    print(plots.no_data_text("GroupNorm timings (fast_path/norms.csv)",
                             "python -m medddpm.profiling.layers --norms --out data/results/<gpu>/fast_path/norms.csv"))
else:
    display(table(NM[["gpu_slug", "signature", "count", "min_step_mb", "inductor_forward_ms", "triton_forward_ms",
                      "inductor_step_ms", "triton_step_ms", "inductor_step_tbs", "triton_step_tbs"]], 2))
plots.show_table(fast_tables.norm_totals(root, G), "fast_path/norms.csv",
                 "python -m medddpm.profiling.layers --norms", digits=2)
plots.show_table(fast_tables.norm_tiles_largest(root, G), "fast_path/norm_tiles.csv",
                 "python scripts/probes/norm_tiles.py --out data/results/<gpu>/fast_path/norm_tiles.csv", digits=2)

# %% [markdown]
# The last table takes the largest norm kernel by kernel: the TB/s each Triton pass reaches on its necessary bytes
# with its default launch shape (`fast_path/norm_tiles.csv` times six). The slower of these passes, and the smaller
# shapes above, are where the norms still lose time against the memory's speed.
#
# **The convolutions, layer by layer** (`python -m medddpm.profiling.layers --profile --config CONFIG`): every
# convolution kernel of one step (profiled without its CUDA graph), attributed to its shape and pass,
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

# %% tags=["hide-input"]
plots.show_table(fast_tables.layer_totals(root, G), "fast_path/layers.csv",
                 "python -m medddpm.profiling.layers --profile", digits=2)

# %% [markdown]
# Summed per GPU: the step's convolution passes against the same shapes on their own at cuDNN's best, how many
# shape-and-pass rows run slower in the step than alone, the two thin convolutions (3 channels in, 1 out) here and in
# `bf16-graphs`'s step, and the kernels that compute no pass. Where hardly a row runs slower in the step, no
# convolution loses time to its place in it: what is left is the shapes themselves. The milliseconds still between
# `fast` and the 40 ms goal are in the 64-channel 128³ convolutions, already at cuDNN's best for their shape, in the
# norms' reductions, and in the Triton elementwise kernels around them.
#
# **The thin convolutions on their own** (`scripts/probes/thin_conv_probe.py`):
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
# A `speedup` below 1 is a pass where cuDNN stays ahead. The training step keeps cuDNN for the stem in any case (its
# input arrives NCDHW).

# %% [markdown]
# The levers past `fast` — FP8 in the forward pass, the skip gradients in the norm's backward, the
# upsampling as Triton kernels — and what is left above the bounds are in {doc}`13_stretch`.
