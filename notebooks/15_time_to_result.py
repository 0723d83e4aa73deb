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
# Per GPU, today's rows: each from the newest run of current rows in the store that has it, of the GPU's newest date
# (manifest kind `sample-rows`; the run column names its folder), against the targets, process start to the last file
# written. `sample`'s default is DDPM 250 since the 12-call chain was not confirmed ({doc}`16_equivalence`); the
# chain's rows stay, one option away. Changes measured since as A/B
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
# cache, and {glue:text}`tr_small` below that: `fast`'s sampler with nothing for `torch.compile` to do.
# The rule reads the command alone, never the state of a cache, so the same command always
# runs the same configuration and writes the same files. The compiled work is kept under
# `MEDDDPM_CACHE` (default `~/.cache/medddpm`), keyed by torch, Triton, CUDA, the GPU, the
# configuration and the volume size, and `medddpm warmup --checkpoint …` fills it ahead of time.
# A *cold* row starts from an empty cache; a *warm* row runs the same command again. Without
# `--config`, `warmup` compiles every configuration `sample` may pick (`fast-eager` for small jobs,
# `fast` for large ones), so the first `sample` after it starts warm whatever its size (the history below has
# what that bought on each machine).
#
# **The sampler.** A row without `--sampler` ran the default of its day; the first rows of the history ran
# {glue:text}`tr_sampler`. Today's default ({doc}`16_equivalence`): {glue:text}`tr_default_sampler`.
#
# A run's own timing line splits its wall time from the process's start: `imports`, `ready` (every mask read and
# checked, so a bad mask stops the run before any file is written), `kernels` (the first shape's Triton kernels
# compiled or loaded), `captured` (the first CUDA graph), the first and last volume, and the files written. The first
# table's `where` quotes a row's ready and first volume; for `train`, how long its first step took (compilation,
# autotuning, the CUDA graph's capture).

# %% [markdown]
# ## History
#
# Every change this chapter measured, oldest first, per GPU: what changed, what it measured (before → after where it
# was an A/B, on one machine), and its run folder, whose `run.json` says how it ran. Each row was computed once, when
# its run was judged, into the GPU's `time_to_result/history.json` (`medddpm/report/history.py`).

# %% tags=["hide-input"]
show_table(waiting.history(root, G), "what moved the time to result (time_to_result/history.json)",
           "scripts/time_to_result.sh, scripts/probes/")

# %% [markdown]
# ## Every row measured
#
# Every command timed for this chapter, the superseded states too (an ε checkpoint's DDPM 250 default,
# eager `bf16` small jobs), each with the rule, sampler and configuration of its day.

# %% tags=["hide-input"]
show_table(waiting.table(root, G), "time-to-result rows (time_to_result/time_to_result.csv)",
           "scripts/time_to_result.sh", digits={"wall s": 1})

# %% [markdown]
# ## The same command, the same files
#
# {glue:text}`tr_same`. An earlier measurement on an H200 (main 078595a) found `fast`'s files
# differing between two runs: cuDNN's autotuner may pick other convolution algorithms in another process. The
# `-pinned` rung of `fast`'s sampler (cuDNN's heuristics instead of the autotuner) is the fallback
# where that happens; the rows above did not reach it.
