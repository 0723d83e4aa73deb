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
# chapter climbs a ladder of configurations (`medddpm/config.py`, `LADDER`), each rung adding one
# thing to the one before: bf16 autocast, `torch.compile`, cuDNN's autotuner, NDHWC end to end
# (layout-preserving GroupNorm+SiLU and ×2 upsampling, `medddpm/ndhwc.py`), SDPA attention with
# the fused Adam, and finally the whole training step as one CUDA graph with the data on the GPU
# (`fast`). Whole-head model, 128³, batch 1, forward + L1 loss + backward + Adam; CUDA events.

# %% tags=["parameters"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # True: time every rung on this machine's GPU first (about 10 minutes)
size = 128  # volume side when measuring
configs = "baseline,opt1,bf16,bf16-compile,bf16-compile-tuned,bf16-ndhwc,bf16-ndhwc-sdpa,fast"  # rungs to measure

# %% tags=["remove-cell"]
import matplotlib.pyplot as plt

from medddpm.profiling import metrics as M
from medddpm.report import plots, tables
from medddpm.report.measure import prepare
from medddpm.report.notebook import glue

root, G = prepare(results_dir, gpus, measure, "end_to_end", size, configs)
L = tables.ladder(root, G)

# %% tags=["hide-input"]
fig, ax = plt.subplots(figsize=(11, 4.8))
plots.ladder(L, ax)
ax.set_title("Training step per rung, 128³, batch 1 (×previous rung, (×baseline))")
plots.finish(fig)

# %% tags=["hide-input"]
L[["gpu_slug", "config", "step_ms_median", "fwd_ms_median", "peak_mem_gib", "speedup_vs_previous",
   "speedup_vs_baseline", "tflops", "peak_fraction"]].round(3)

# %% tags=["remove-cell"]
ms = L.set_index(["gpu_slug", "config"])
for (g, c), r in ms.iterrows():
    glue(f"{g}_{c}_ms", f"{r['step_ms_median']:.1f}")
    glue(f"{g}_{c}_x", f"{r['speedup_vs_baseline']:.1f}")
    glue(f"{g}_{c}_tflops", f"{r['tflops']:.0f}")
if ("h200", "fast") in ms.index:
    f = ms.loc[("h200", "fast")]
    glue("h200_fast_vs_opt1", f"{ms.loc[('h200', 'opt1'), 'step_ms_median'] / f['step_ms_median']:.1f}")
    glue("h200_fast_peak_pct", f"{100 * f['peak_fraction']:.0f} %")
    glue("h200_target_verdict", "meets" if f["step_ms_median"] <= 50 else "misses")
    glue("h200_floor_ms", f"{f['step_ms_median'] * f['peak_fraction']:.0f}")

# %% [markdown]
# On the H200 `fast` takes {glue:text}`h200_fast_ms` ms a step: {glue:text}`h200_fast_x`× the FP32
# baseline and {glue:text}`h200_fast_vs_opt1`× the paper's best (OPT1, {glue:text}`h200_opt1_ms`
# ms). It {glue:text}`h200_target_verdict` the 50 ms target. It reaches
# {glue:text}`h200_fast_tflops` TFLOP/s of model arithmetic, {glue:text}`h200_fast_peak_pct` of the
# bf16 matmul peak measured on the same GPU (`peaks.json`). The H100 gives
# {glue:text}`h100-80gb-hbm3_fast_ms` ms. The biggest single steps are bf16
# ({glue:text}`h200_bf16_ms` ms) and `torch.compile` ({glue:text}`h200_bf16-compile_ms` ms), which
# fuses GroupNorm, SiLU and the elementwise tails into Triton kernels.
#
# **What the paper's OPT2 would have needed.** Channels-last only pays once nothing converts back:
# with PyTorch's own GroupNorm and upsampling, cuDNN inserts `nchwToNhwc`/`nhwcToNchw` transposes
# around every convolution (see the kernel mix below). Written layout-preserving, NDHWC is the
# fastest layout ({glue:text}`h200_bf16-ndhwc_ms` ms against {glue:text}`h200_bf16-compile-tuned_ms`
# ms for the same knobs in NCDHW).

# %% [markdown]
# ## Where the time goes
#
# Every kernel of one steady step (torch.profiler), grouped by the book's categories, for the best
# NCDHW rung and for `fast` (H200). Inductor names its fused kernels after the operations in them,
# so a fused GroupNorm kernel that contains a `permute` is counted under "layout transform" here.

# %% tags=["hide-input"]
T = tables.torch_kernels(root, G, "step", ["bf16-compile-tuned", "fast"])
if not T.empty:
    mix = M.kernel_mix(T, duration="duration_us", group=["gpu_slug", "config"])
    fig, ax = plt.subplots(figsize=(10, 2.6))
    plots.stacked_shares(mix, ["gpu_slug", "config"], "category", "Kernel mix of one step", ax=ax)
    plots.finish(fig)
    conv = T[T["category"] == "convolution/GEMM"].groupby(["gpu_slug", "config"])["duration_us"].sum() / 1e3
    total = T.groupby(["gpu_slug", "config"])["duration_us"].sum() / 1e3
    for (g, c), v in conv.items():
        glue(f"{g}_{c}_conv_ms", f"{v:.1f}")
        glue(f"{g}_{c}_kernel_ms", f"{total[g, c]:.1f}")
        glue(f"{g}_{c}_other_ms", f"{total[g, c] - v:.1f}")

# %% [markdown]
# In `fast` the convolutions (cuDNN implicit GEMMs, forward, data-gradient and weight-gradient)
# take {glue:text}`h200_fast_conv_ms` of {glue:text}`h200_fast_kernel_ms` ms of kernel time; the
# remaining {glue:text}`h200_fast_other_ms` ms are Triton kernels of the normalizations and their
# backward, and elementwise work. The FLOP floor of a whole step (3 × forward FLOPs at the
# measured bf16 matmul peak) is {glue:text}`h200_floor_ms` ms, so the convolutions alone sit well
# above it, and the normalization kernels are further still from their bandwidth bound: both are
# where the rest of the gap to 50 ms lies.

# %% [markdown]
# ## Does the fast path compute the same model?
#
# ε-prediction of seeded weights on fixed (x_t, mask, t) inputs at 128³, each rung against the FP32
# baseline on the same GPU (`medddpm/quality.py`). bf16 keeps 8 bits of mantissa, so a relative
# error near 1e-2 is what rounding alone gives; TF32 (10 bits) near 1e-3.

# %% tags=["hide-input"]
A = tables.fast_path_csv(root, G, "agreement")
if not A.empty:
    A.pivot_table(index=["gpu_slug", "config"], columns="t", values="rel_l2").round(4)

# %% [markdown]
# ## The real training loop
#
# `medddpm train --config fast` on 128³ phantom NIfTI files (volumes decoded once and kept on the
# GPU, no host synchronisation inside a step, losses read back every 25 steps), timed between
# read-backs, beside `bench`:

# %% tags=["hide-input"]
TT = tables.fast_path_csv(root, G, "train_timing")
if not TT.empty:
    steady = TT[TT["step_from"] > 0].groupby("gpu_slug")["ms_per_step"].median().rename("train ms/step")
    bench_fast = L[L["config"] == "fast"].set_index("gpu_slug")["step_ms_median"].rename("bench ms/step")
    steady.to_frame().join(bench_fast).round(1)
