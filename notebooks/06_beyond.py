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
# The paper stops at TF32 (OPT1) and a channels-last layout that makes things slower (OPT2). This chapter climbs a
# ladder of configurations (`LADDER` in `medddpm/core/config.py`), each rung adding one thing: bf16 autocast,
# `torch.compile`, cuDNN's autotuner, NDHWC end to end (`medddpm/net/ndhwc.py`), SDPA attention with the fused Adam,
# the whole step as one CUDA graph (`bf16-graphs`), and last `fast`, with every kernel lever of {doc}`07_kernels`.
# {doc}`08_roofline` sets every kernel against its roofline. Whole-head model, 128³, batch 1, forward + L1 loss +
# backward + Adam; CUDA events.
#
# ## Where it stands
#
# Today's `fast` step per GPU against the 50 ms target and the 40 ms goal, against the paper's best (OPT1), and against
# its FLOP floor: the step's model FLOPs (3 × forward) at the bf16 matmul peak measured on the same GPU (`peaks.json`).

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # True: time every rung on this machine's GPU first (about 10 minutes)
size = 128  # volume side when measuring
configs = "baseline,opt1,bf16,bf16-compile,bf16-compile-tuned,bf16-ndhwc,bf16-ndhwc-sdpa,bf16-graphs,fast"  # rungs (and the best kernel variant) to measure

# %% tags=["remove-cell"]
import matplotlib.pyplot as plt
from IPython.display import display

from medddpm.profiling import metrics as M
from medddpm.report import fast_tables, history, plots, tables
from medddpm.report.measure import prepare
from medddpm.report.present import table

root, G = prepare(results_dir, gpus, measure, "ladder", size, configs)
L = fast_tables.ladder(root, G)
LB = fast_tables.loop_vs_bench(root, G)
SC, PR = fast_tables.scaling(root)
SC_EARLIER = fast_tables.scaling_earlier(root)

# %% tags=["hide-input"]
plots.show_table(fast_tables.state(root, G), "bench rows of baseline, opt1 and fast; peaks.json", "ladder",
                 digits={"of the bf16 peak": 2})

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-ladder", "caption": "The fast-path ladder: median training step (forward + L1 loss + backward + Adam, 128³, batch 1, CUDA events) for each rung, per GPU with bench rows; each bar labelled with its speed-up over the previous rung and over the FP32 baseline. The paper's best (OPT1) is the second rung."}}
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

FB = tables.bench(root, G, ["bf16-graphs"], batch=None)
if not FB.empty:
    display(table(FB[["gpu_slug", "batch", "step_ms_median", "volumes_per_s", "peak_mem_gib"]], 3))

# %% [markdown]
# The tables: every rung (its step, its speed-up over the rung before and over the baseline, its TFLOP/s and their
# share of the bf16 peak); then `bf16-graphs` at larger batches (the same step, N volumes at once). After OPT1, the
# largest single rungs are bf16 and `torch.compile`, which fuses GroupNorm, SiLU and the elementwise tails into Triton
# kernels (`speedup_vs_previous`).
#
# **What the paper's OPT2 would have needed.** Channels-last pays only once nothing converts back: with PyTorch's own
# GroupNorm and upsampling, cuDNN transposes around every convolution (the kernel mix below). Written
# layout-preserving, NDHWC end to end (`bf16-ndhwc`) is faster than the same knobs in NCDHW (`bf16-compile-tuned`).

# %% [markdown]
# ## Where the time goes
#
# Every kernel of one steady step (torch.profiler), grouped by the book's categories, for the best NCDHW rung and for
# `bf16-graphs`. Inductor names its fused kernels after the operations in them, so a fused GroupNorm kernel that
# contains a `permute` is counted under "layout transform" here.

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
# The same steps in milliseconds: the convolutions (cuDNN implicit GEMMs: forward, data-gradient and weight-gradient)
# against everything else (Triton kernels of the normalizations and their backward, elementwise work). Set against the
# FLOP floor in the state table, the convolutions alone sit above it and the rest is time no FLOP needs.
# {doc}`07_kernels` takes that gap kernel by kernel, {doc}`08_roofline` against each bound.

# %% tags=["hide-input"]
plots.show_table(fast_tables.kernel_split(root, G, ["bf16-compile-tuned", "bf16-graphs"]),
                 "torch.profiler step tables (torch_step_kernels.parquet)", "ladder", digits=1)

# %% [markdown]
#
# ## Does the fast path compute the same model?
#
# ε-prediction of seeded weights on fixed (x_t, mask, t) inputs at 128³, each rung against the FP32 baseline on the
# same GPU (`medddpm/train/parity.py`): bf16's rounding alone gives a relative error near 10⁻², TF32's near 10⁻³.

# %% tags=["hide-input"]
A = tables.fast_path_csv(root, G, "agreement")
if not A.empty:
    display(table(A.pivot_table(index=["gpu_slug", "config"], columns="t", values="rel_l2"), 4, index=True))

# %% [markdown]
# **Loss after short training.** The same seeded phantoms, weights and data order, 50 Adam steps (batch 1, learning
# rate 10⁻⁴) per configuration at 64³, then the held-out denoising loss of the trained weights at fixed (x0, t, ε)
# triples, computed by the same FP32 forward for every configuration (`medddpm.train.parity.short_training`). Baseline
# with three seeds gives the seed-to-seed band; the table says where each configuration's loss lies against its GPU's
# band. Three seeds make a narrow band, so a loss just outside it says little; {doc}`09_quality`'s training parity
# (1,000 steps, held-out subjects, a prediction band from the seeds) is the longer test.

# %% tags=["hide-input"]
LP = fast_tables.loss_parity(root, G)
if not LP.empty:
    display(table(LP.assign(size=LP["size"].astype(str) + "³")[["gpu_slug", "config", "seed", "size", "steps", "loss",
                                                                 "band_low", "band_high", "band_seeds", "inside_band"]]
                  .rename(columns={"loss": "held-out L1 loss"}), 4))

# %% [markdown]
# ## The real training loop
#
# `medddpm train` feeds each step through its input pipeline (`medddpm/data/pipeline.py`, knob `data_cache`): volumes
# on the GPU, in pinned host memory (the next one copied on a side stream), or decoded ahead by loader workers; `auto`
# takes the fastest whose memory rule holds. Below, the loop on 128³ phantom NIfTI files (steady state per
# micro-batch) against `medddpm bench --grad-accum` in the same device run (`scripts/loop_measure.sh`); the target:
# the loop within 3 % of its benchmark per micro-batch (`within_3pct`), and the pipeline each run chose (`data`).

# %% tags=["hide-input"]
if LB.empty:
    print(plots.no_data_text("training-loop runs (loop/loop_vs_bench.csv)", "loop"))
else:
    display(table(LB[["gpu_slug", "config", "grad_accum", "data", "loop_ms_per_micro_batch", "bench_ms", "ratio",
                      "within_3pct"]],
                  {"loop_ms_per_micro_batch": 1, "bench_ms": 1, "ratio": 3}))

# %% [markdown]
# ## Several GPUs: torchrun, one all-reduce, one CUDA graph
#
# `medddpm train --nproc N` (or `torchrun --standalone --nproc-per-node N -m medddpm train …`) keeps every GPU's
# micro-batch (weak scaling); the efficiency is T(1 GPU) / T(N GPUs) of the same configuration, micro-batch and
# grad-accum. By default (`grad_sync` `flat`) the gradients autograd writes are gathered into one flat buffer and
# averaged by all-reduces of it (DDP's sums, tested bit-exact on CPU), inside the step's one CUDA graph; `opt1-ddp`
# and `bf16-graphs-ddp` keep PyTorch's DDP buckets. Measured with the real loop on 128³ phantom NIfTI files
# (`scripts/ddp_scaling.sh`).

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-scaling", "caption": "Training throughput of the real training loop (`medddpm train`, 128³ phantom NIfTI files, micro-batch 1 per GPU) on one GPU and on several (torchrun, weak scaling), per machine, configuration and micro-batches per step; bars labelled with the step time and the scaling efficiency T(1 GPU) / T(N GPUs)."}}
plots.finish(plots.scaling(SC) if not SC.empty else plots.no_data("multi-GPU scaling runs (<machine>/scaling.csv)", "scaling"))

# %% tags=["hide-input"]
if not SC.empty:
    display(table(SC[["machine", "config", "grad_accum", "world_size", "step_ms_median", "volumes_per_s",
                      "scaling_efficiency", "reaches_97pct", "nccl"]], 3))

# %% [markdown]
# The target is 97 % (`reaches_97pct`). `fast` on several ranks runs the network whole and after the backward
# all-reduces the gradients as flat buffers: rounded by one copy to `grad_reduce`'s type, averaged by NCCL, copied back
# into the fp32 gradients Adam reads (`grad_buckets` and `grad_reduce` of `CONFIGS["fast"]`, `medddpm/core/config.py`).
#
# ### History
#
# What was tried on the way, oldest first (`fast-b3`, three fp32 buckets overlapped with the backward, is called
# `fast` in the earlier runs); then the first runs' rows and the per-rank profiles.

# %% tags=["hide-input"]
plots.show_table(history.table(root, history.folders(root), ""), "multi-GPU runs (<machine>/history.json)", "scaling")
if not SC_EARLIER.empty:
    display(table(SC_EARLIER[["machine", "run", "config", "world_size", "step_ms_median", "scaling_efficiency",
                              "allreduce_ms"]], 3))
RP = fast_tables.rank_profiles(root)
if not RP.empty:
    display(table(RP, 2))
