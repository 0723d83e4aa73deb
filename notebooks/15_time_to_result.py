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
# # Time to result: what a user waits for
#
# The earlier chapters time the steady state, after everything is compiled, captured and autotuned. A user
# who types `medddpm sample` waits for Python and PyTorch starting, the checkpoint, every mask read, the
# compilation or its cache, the sampling and every file written. This chapter times that, from process start
# to the last file written (`scripts/time_to_result.sh`, `medddpm/profiling/waiting.py`), on the {glue:text}`tr_gpu`.
#
# ## Where it stands
#
# Per GPU, today's rows: the newest run of current rows in the store (manifest kind `sample-rows`; the run column
# names its folder) against the targets, process start to the last file written. Changes measured since as A/B
# tests (the read-back overlap, below) say what they moved. Every row ever measured is in the history table below.

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # no measurement of its own (scripts/time_to_result.sh); True says so, then renders
size = 128  # not used: this chapter measures nothing (its runs are 128³: scripts/time_to_result.sh)
configs = "fast"  # not used: this chapter measures nothing

# %% tags=["remove-cell"]
from medddpm.report import waiting
from medddpm.report.measure import render_only
from medddpm.report.notebook import glue_facts
from medddpm.report.plots import show_table

root, G = render_only(results_dir, gpus, measure, "scripts/time_to_result.sh OUT WORK [NPROC]")
glue_facts(waiting.facts(root, G))

# %% tags=["hide-input"]
show_table(waiting.state(root, G), "today's time-to-result rows (a sample-rows run's time_to_result.csv)",
           "scripts/probes/default_rows.sh", digits={"today (s)": 1, "target (s)": 0})

# %% [markdown]
# ## How `sample` picks and starts
#
# **The rule `sample` follows without `--config`.** On a GPU it runs `fast` from {glue:text}`tr_fast_from_calls`
# denoiser calls on (masks × calls a mask: {glue:text}`tr_fast_from_ddpm` masks of DDPM 250,
# {glue:text}`tr_fast_from_chain` of the 12-step chain), where its compilation pays for itself even with a cold
# cache, and {glue:text}`tr_small` below that: `fast`'s sampler with nothing for `torch.compile` to do (below).
# The rule reads the command alone, never the state of a cache, so the same command always
# runs the same configuration and writes the same files. The compiled work is kept under
# `MEDDDPM_CACHE` (default `~/.cache/medddpm`), keyed by torch, Triton, CUDA, the GPU, the
# configuration and the volume size, and `medddpm warmup --checkpoint …` fills it ahead of time.
# A *cold* row starts from an empty cache; a *warm* row runs the same command again. Without
# `--config`, `warmup` compiles every configuration `sample` may pick (`fast-eager` for small jobs,
# `fast` for large ones), so the first `sample` after it starts warm whatever its size. On one machine
# (`warmup-every-config/`): {glue:text}`tr_afterwarmup`.
#
# **The sampler.** A row without `--sampler` ran the default of its day; the rows quoted against the targets below
# ran {glue:text}`tr_sampler`. The default follows the checkpoint's recipe ({doc}`16_equivalence`):
# {glue:text}`tr_default_sampler`. These rows' checkpoint is an ε one, so they ran DDPM 250: {glue:text}`tr_default_rows`.
#
# **A v-prediction checkpoint's default.** Since `train` predicts v and `sample` runs the 12-call chain on
# such checkpoints, one H100 of 16 cores (`v-default-chain/`, the 128³ phantom checkpoint
# trained as above, now v) timed it: {glue:text}`tr_v_default`. The chain's own sampling is a fraction
# of a second; what is left is start-up.
#
# **Triton's key.** Every process hashed Triton's whole installation (500 MB of libtriton among it) into its cache
# key before its first kernel, even with every kernel cached: most of the time between `ready` and the first volume
# in a warm 1-mask profile (`start-up-tried/call-a/profile-new-1-warm.txt`). `medddpm` now keeps the key in
# `MEDDDPM_CACHE` under a fingerprint of Triton's files (`medddpm/run/cache.py`); timed afterwards on another host
# (`triton-key-h200-host/`): {glue:text}`tr_triton_key`.

# %% [markdown]
# ## Every row measured
#
# The history: every command timed for this chapter, the superseded states too (an ε checkpoint's DDPM 250 default,
# eager `bf16` small jobs), each with the rule, sampler and configuration of its day.

# %% tags=["hide-input"]
show_table(waiting.table(root, G), "time-to-result rows (time_to_result/time_to_result.csv)",
           "scripts/time_to_result.sh", digits={"wall s": 1})

# %% [markdown]
# ## One mask, eight, a hundred
#
# Each quoted row names its sampler and configuration (eager `bf16` was the small-job pick before {glue:text}`tr_small`).
#
# - **One mask** by default: {glue:text}`tr_one_cold` with a cold cache, {glue:text}`tr_one_warm` warm.
# - **Eight masks**: by default {glue:text}`tr_default8_cold` and {glue:text}`tr_default8_warm`;
#   under `--config fast` {glue:text}`tr_fast8_cold` cold and {glue:text}`tr_fast8_warm` warm.
# - **A hundred masks** by default, cache warm: {glue:text}`tr_hundred_warm`. Against the
#   eight-mask warm `fast` run of the same sampler, each further volume costs {glue:text}`tr_per_volume`; the 12-step chain itself
#   takes {glue:text}`tr_chain` a volume on the GPU (`bench-sample`, {doc}`11_few_step`). Threads read
#   and encode the masks, and others resample and compress the samples into `.nii.gz` files while
#   the GPU samples the next ones (`IO_THREADS` in `medddpm/sample/sampler.py`). What stays is the
#   start-up: the chain's eight-mask warm run less eight chains leaves {glue:text}`tr_fast_fixed` of fixed cost.
# - **Several GPUs** (`--nproc N`: each rank reads its own share of the masks and sees only its own
#   GPU): {glue:text}`tr_nproc`. Every rank pays the start-up again, so a few hundred masks do not fill
#   four GPUs. Until the ranks saw only their own GPU, ranks 1 to 3 compiled `fast` again: torch's
#   compile caches key a graph by its device index (pytorch/pytorch#108971), so what `medddpm warmup`
#   compiled on GPU 0 served rank 0 alone (a cProfile of each rank, `own-gpu-ranks/call-c-d/`).
#   Those runs: {glue:text}`tr_nproc_before`.
#
# ## Where a run's seconds go, phase by phase
#
# `sample` ends with a timing line on rank 0, stored with each row. Until the start-up cut below it
# counted on the command's own clock, which starts once the imports are done (`ready`,
# `first volume`, `last volume`, `written`): {glue:text}`tr_phases`.
#
# Outside the command's clock lie Python's start, PyTorch's import, the exit and, on several ranks, torchrun's
# launcher; `ready` holds every mask read and checked, so a bad mask stops the run before any file is written.
# The line now counts from the process's start (Linux's `/proc`) and adds `imports`, `kernels` (the first shape's
# Triton kernels compiled or loaded) and `captured` (the first CUDA graph): a row splits its whole wall time.
#
# ## The start-up cut
#
# Four calls, each on a fresh H100 of 16 cores, timed main against this code at three stages, the
# codes alternated on one machine (`start-up-cut/`). The stages: {glue:text}`tr_cut_codes`.
# Each command's mean wall time, per call: {glue:text}`tr_cut`.
#
# What each change does:
#
# - **A shape's first call runs eagerly** (`Knobs.capture_after`, 1 by default). A one-volume
#   job of the 12-call chain used to capture the chain as a CUDA graph after two eager runs of it,
#   then replay it once: three chains' work for one volume. Now it runs the chain once; a shape called
#   again is captured then. The files are the same bit for bit: a 3-mask job (eager, captured,
#   replayed) against main's replays and against each mask alone (`same_files.csv` there).
# - **The Triton kernels without PyTorch's dispatcher in eager inference** (`kernels._forward_op`).
#   A custom operator's first call through the dispatcher imports `torch._dynamo`
#   ({glue:text}`tr_cut_dynamo` in a fresh interpreter on that machine). Autograd and `torch.compile` still go
#   through the operators.
# - **The process ends when its files are written** (`cli.run`: `os._exit` after flushing, unless
#   Inductor compiled something). Python's and CUDA's tear-down is skipped.
# - **`precompile` compiles each kind of launch once.** A dry run of a 12-call chain records every
#   kernel launch of its 12 denoiser calls, most of them alike; compiling each kind once shortens the
#   cold start, since threads no longer compile the same kernel side by side. The dry run now keeps one-element stand-ins of its tensors,
#   not the tensors: recording them kept every output of the dry run alive, and `--batch 4` ran out of
#   memory at 128³ (on main too). Each thread also loads its kernel and builds its launcher,
#   which Triton otherwise does at the first launch, one kernel after another.
#
# Call d undoes one change at a time in the kept code: without the dispatcher bypass or the immediate exit a warm run
# takes longer (the import; the exit span). Both are kept.
#
# **Against the targets** (the kept code, the 12-call chain): {glue:text}`tr_cut_targets`. A hundred masks spend
# almost all of their time replaying the chain under `fast-eager`: the replay decides that target. Every kernel of ten warm denoiser calls at 128³ under both
# configurations, on one H100 (`eager-kernels/`, `scripts/probes/eager_kernels.sh`):
# {glue:text}`tr_eager_kernels`. Without Inductor, `fast-eager` runs the residual additions, the
# skip concatenations and the other pointwise work as separate PyTorch kernels, which `fast` fuses into a few Triton
# ones; the convolutions are nearly the same. Those kernels, twelve calls a volume, are the 100-mask time.
#
# **The residual additions fused.** `fast-eager` now writes each ResBlock's output with one Triton kernel
# that adds the convolution's bias, the skip term and that term's bias in fp32 as it rewrites the
# convolution's output (`fused_residual`, `medddpm/net/residual.py`); `fast-eager-unfused` is the same sampler
# without it. Both, on two fresh H100s and an H200 (`fused-residual/`, `scripts/probes/fused_residual.sh`; both arms'
# starts 3–4 s slow, no bytecode kept): {glue:text}`tr_fused_residual`. What still separates it from `fast` is the skip concatenation.
#
# **Between volumes.** `sample` now queues each volume before it reads the one before back (a CUDA stream of its own),
# and reads masks as int8. Against the code before, alternated on two fresh H100s (`sample-overlap/`): {glue:text}`tr_overlap`.
#
# `warmup`, then the first `sample` (stage B, call b): {glue:text}`tr_cut_afterwarmup`.
#
# ## Start-up changes measured earlier and not kept then
#
# Timed against main on one host of four H100s, alternated: the Triton kernels' own functions in eager inference,
# the first kernel compiled alone before at most 16 threads, and a gloo group for the sampling ranks:
# {glue:text}`tr_tried`. None moved a warm DDPM 250 run beyond its spread; the first came back in the cut above.
#
# **Compile workers, tried.** Worker processes compiling a cold cache's kernels, against threads alone on one H100
# (`process-pool-tried/`): {glue:text}`tr_pool_tried`. Each imports PyTorch and opens a CUDA context first: removed.
#
# **Fewer kernels compiled, kept.** The dry run keys an integer as Triton does (`kernels._int_key`). Cold, alternated
# on one H100 (`triton-keys/`, `scripts/probes/triton_keys.sh`): {glue:text}`tr_triton_keys`.
#
# ## A small job: `fast`'s sampler, not compiled
#
# {glue:text}`tr_small` is `fast`'s sampler (bf16 weights, NDHWC, the Triton norm, thin-convolution
# and upsampling kernels of {doc}`07_kernels`, CUDA graphs, cuDNN's heuristics) without `torch.compile`.
# In the steady state (`bench-sample`, 128³, batch 1): {glue:text}`tr_small_bench`. So `fast` saves a few
# milliseconds a denoiser call and pays for it with its compilation; the rule's threshold is where the
# two meet with cold caches. Triton still compiles the kernels themselves,
# {glue:text}`tr_small_kernels` in a cold 1-mask run. Compiled one by one at their first launch, they made
# the cold start long; `kernels.precompile` now records every launch of a new shape in a dry run and compiles
# them all at once in threads. The same command before that, and without the Triton kernels at all
# (`small-job/`): {glue:text}`tr_small_before`.
#
# The first targets, against this chapter's first rows (an ε checkpoint): {glue:text}`tr_targets`.
#
# ## Where the one-mask seconds go
#
# `python -m cProfile -m medddpm sample` of the one-mask default, cache warm (`STAGES=profile`;
# {glue:text}`tr_profile_total` under the profiler, which sees only the main thread):
# {glue:text}`tr_profile_parts`. That torch build registered {glue:text}`tr_profile_ops` custom operators at start.

# ## Training's first 100 steps
#
# `train --config fast --steps 100` on four 128³ phantoms (two micro-batches a step), process start to
# checkpoint written: {glue:text}`tr_train`. A warm cache skips Inductor's code generation, not Dynamo's
# tracing. Under cProfile, warm, before the change below: {glue:text}`tr_train_parts`. AOT autograd's cache
# had bypassed `fast`'s graph ("Unsupported call_function target autograd_function_apply",
# `small-job-precompile/train-cache/`): its skip concatenation with dense gradients
# (`model._DenseGradCat`) is a `torch.autograd.Function`, which PyTorch keeps out of that cache unless
# told to, so every process traced and partitioned the joint graph again. `medddpm/run/cache.py` now
# tells it to; the caches of a warm run since (`scripts/probes/train_cache_log.py`): {glue:text}`tr_train_cache`.
# A warm run under cProfile since (`start-up-tried/call-d/`, another H100 host): {glue:text}`tr_train_now`.
# The first steps still pay Dynamo tracing the step in every process and Inductor loading its kernels.

# ## A training time budget
#
# `train --time-limit T` stops at the first read-back after T seconds and reports where they went. A
# run's own timing line under a limit (its output, kept beside its held-out table): {glue:text}`tr_train_limit`.
# The compile of the first step, the held-out evaluations and the checkpoints are the rest.
#
# At 64³ a short limit is mostly something else. The README's command on IXI 64³ with
# `--time-limit 300` on one H100, with empty compile caches and then again (`train-clock/`,
# the `train-clock` runs in the line above): the first step's compile takes most of the cold run's
# overhead, and with warm caches the held-out evaluations (16 subjects, at the default `--eval-every`)
# are the largest part outside the steps. Each of these steps is two
# micro-batches (`--grad-accum`'s default); the 64³ runs of {doc}`14_anatomy` trained with one. The same machine timed
# `train --config fast --steps 100` at 128³ on phantoms: {glue:text}`tr_first_steps`. The first step
# holds Inductor's cached graphs loaded and the step's CUDA graph captured.
#
# **The evaluations cut.** Three changes shrink what a run spends outside its steps:
# - the held-out loss judges the EMA's weights alone by default, the weights `sample` uses and `best.pt`
#   is chosen by (`--eval-weights both` adds the raw model's, at twice the cost);
# - where `best.pt` and `checkpoint.pt` fall on one step (`--eval-every` and `--save-every` alike by
#   default), the second is a hard link to the first: the weights and Adam's moments are serialized once;
# - the FP32 evaluator is built once a run and given each evaluation's weights on the GPU (`heldout.Evaluator`).
#
# The same warm command on another machine of the same kind (`train-eval-cut/`), against
# the warm run above: {glue:text}`tr_eval_cut`. Each run's full line, and the H200's run of the same
# command, are in the list at the top of this section. A cold run still spends most of a 300 s limit
# compiling its first step.
#
# **Again on fresh machines.** The v-prediction default's rows and the 128³ training steps, after the start-up cut
# (`scripts/probes/default_rows.sh`, `after-cut/` of each GPU, fresh machines of 16 cores; single rows are each
# machine's newest): {glue:text}`tr_after_cut`. With the fused residual (`default-rows/`): {glue:text}`tr_default_rows_now`.

# ## The same command, the same files
#
# {glue:text}`tr_same`. An earlier measurement on an H200 (main 078595a) found `fast`'s files
# differing between two runs: cuDNN's autotuner may pick other convolution algorithms in another process. The
# `-pinned` rung of `fast`'s sampler (cuDNN's heuristics instead of the autotuner) is the fallback
# where that happens; the rows above did not reach it.
