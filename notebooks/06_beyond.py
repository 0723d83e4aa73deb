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
# Today's `fast` step per GPU against the 50 ms target and the 40 ms goal, and against the paper's best (OPT1).

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
from medddpm.report import fast_facts, fast_tables, plots, tables
from medddpm.report.measure import prepare
from medddpm.report.notebook import glue_facts
from medddpm.report.present import table

root, G = prepare(results_dir, gpus, measure, "ladder", size, configs)
glue_facts(fast_facts.beyond(root, G))
L = fast_tables.ladder(root, G)
LB = fast_tables.loop_vs_bench(root, G)
SC, PR = fast_tables.scaling(root)
SC_EARLIER = fast_tables.scaling_earlier(root)

# %% tags=["hide-input"]
plots.show_table(fast_tables.state(root, G), "bench rows of baseline, opt1 and fast", "ladder", digits=1)

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

FB = tables.bench(root, G, ["bf16-graphs"], batch=None)
if not FB.empty:
    display(table(FB[["gpu_slug", "batch", "step_ms_median", "volumes_per_s", "peak_mem_gib"]], 3))

# %% [markdown]
# The tables: every rung; then `bf16-graphs` at larger batches (the same step, N volumes at once).
#
# On the {glue:text}`ref_gpu` `fast` takes {glue:text}`ref_fast_ms` ms a step: {glue:text}`ref_fast_x`× the FP32
# baseline and {glue:text}`ref_fast_vs_opt1`× the paper's best (OPT1, {glue:text}`ref_opt1_ms` ms). It
# {glue:text}`ref_target_verdict` the 50 ms target. It reaches {glue:text}`ref_fast_tflops` TFLOP/s of model
# arithmetic, {glue:text}`ref_fast_peak_pct` of the bf16 matmul peak measured on the same GPU (`peaks.json`).
# `bf16-graphs`, the rung before it, takes {glue:text}`ref_bf16-graphs_ms` ms. The {glue:text}`alt_gpu` gives
# {glue:text}`alt_fast_ms` ms (`bf16-graphs`: {glue:text}`alt_bf16-graphs_ms`). The biggest single steps are bf16
# ({glue:text}`ref_bf16_ms` ms) and `torch.compile` ({glue:text}`ref_bf16-compile_ms` ms), which fuses GroupNorm, SiLU
# and the elementwise tails into Triton kernels.
#
# **What the paper's OPT2 would have needed.** Channels-last pays only once nothing converts back: with PyTorch's own
# GroupNorm and upsampling, cuDNN transposes around every convolution (the kernel mix below). Written
# layout-preserving, NDHWC is the fastest layout ({glue:text}`ref_bf16-ndhwc_ms` ms against
# {glue:text}`ref_bf16-compile-tuned_ms` ms for the same knobs in NCDHW).

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
# In `bf16-graphs` on the {glue:text}`ref_gpu` the convolutions (cuDNN implicit GEMMs, forward, data-gradient and
# weight-gradient) take {glue:text}`ref_fast_conv_ms` of {glue:text}`ref_fast_kernel_ms` ms of kernel time; the
# remaining {glue:text}`ref_fast_other_ms` ms are Triton kernels of the normalizations and their backward, and
# elementwise work. The FLOP floor of a whole step (3 × forward FLOPs at the measured bf16 matmul peak) is
# {glue:text}`ref_floor_ms` ms: the convolutions sit well above it and the normalizations further from their bandwidth
# bound. {doc}`07_kernels` takes that gap kernel by kernel, {doc}`08_roofline` against each bound.
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
# with three seeds gives the seed-to-seed band. On the {glue:text}`lp_ref_gpu` the baseline's held-out loss after 50 steps spans {glue:text}`lp_band` over
# {glue:text}`lp_seeds` seeds; `bf16-graphs` (seed 0) ends at {glue:text}`lp_fast`, **{glue:text}`lp_fast_verdict`**
# that band; {doc}`09_quality`'s training parity (1,000 steps, held-out subjects, a prediction band from the seeds) is
# the longer test.

# %% tags=["hide-input"]
LP = fast_tables.loss_parity(root, G)
if not LP.empty:
    display(table(LP.assign(size=LP["size"].astype(str) + "³")[["gpu_slug", "config", "seed", "size", "steps", "loss"]]
                  .rename(columns={"loss": "held-out L1 loss"}), 4))

# %% [markdown]
# ## The real training loop
#
# `medddpm train` feeds each step through its input pipeline (`medddpm/data/pipeline.py`, knob `data_cache`): volumes
# on the GPU, in pinned host memory (the next one copied on a side stream), or decoded ahead by loader workers; `auto`
# takes the fastest whose memory rule holds. Below, the loop on 128³ phantom NIfTI files (steady state per
# micro-batch) against `medddpm bench --grad-accum` in the same device run (`scripts/loop_measure.sh`):
# {glue:text}`loop_within` rows keep the loop within 3 % of its benchmark per micro-batch; the largest ratio is
# {glue:text}`loop_worst`. The pipeline every run chose: {glue:text}`loop_data`.

# %% tags=["hide-input"]
if LB.empty:
    print(plots.no_data_text("training-loop runs (loop/loop_vs_bench.csv)", "loop"))
else:
    display(table(LB[["gpu_slug", "config", "grad_accum", "data", "loop_ms_per_micro_batch", "bench_ms", "ratio"]],
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
                      "scaling_efficiency", "nccl"]], 3))

# %% [markdown]
# {glue:text}`scaling_within` rows on several GPUs reach 97 % ({glue:text}`scaling_range`). On
# {glue:text}`bf16-graphs_machine`, `bf16-graphs` {glue:text}`bf16-graphs_a1_eff` ({glue:text}`bf16-graphs_a1_ms`
# ms/step) and {glue:text}`bf16-graphs_a2_eff` with two micro-batches; on {glue:text}`opt1_machine`, `opt1`
# {glue:text}`opt1_a1_eff` ({glue:text}`opt1_a1_ms` ms/step) and {glue:text}`opt1_a2_eff`.
#
# `fast` on several ranks runs the network whole and after the backward all-reduces one flat buffer (`grad_buckets`
# {glue:text}`config_fast_buckets`) in {glue:text}`config_fast_reduce` (`grad_reduce`): the gradients rounded in by
# one copy, averaged by NCCL, copied back into the fp32 gradients Adam reads. `fast` now: {glue:text}`fast_scaling`;
# {glue:text}`fast_within` of its rows reach 97 %.
#
# ### History
#
# What was tried on the way, oldest first (`fast-b3`, three fp32 buckets overlapped with the backward, is called
# `fast` in the earlier runs); then the first runs' rows and the per-rank profiles.

# %% tags=["hide-input"]
plots.show_table(fast_facts.scaling_history(root), "multi-GPU runs (<machine>/history.json)", "scaling")
if not SC_EARLIER.empty:
    display(table(SC_EARLIER[["machine", "run", "config", "world_size", "step_ms_median", "scaling_efficiency",
                              "allreduce_ms"]], 3))
RP = fast_tables.rank_profiles(root)
if not RP.empty:
    display(table(RP, 2))
