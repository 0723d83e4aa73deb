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
# # Med-DDPM on GPUs, reproduced
#
# This book is the executable companion of *Performance Analysis and Optimization of 3D Generative
# Diffusion Models across GPU Architectures* (ICPE '26). The paper profiles Med-DDPM — a
# mask-conditioned 3D DDPM for brain MRI — with Nsight Compute on V100, A100 and H100 GPUs, and
# tests TF32 (OPT1) and a 3D channels-last layout (OPT2). It ships no code; this project does.
#
# ## The results in one table
#
# The paper's value where it states one (its H100), and ours per GPU. "× baseline" compares with
# the true FP32 baseline on the same GPU; the paper's 100-kernel window and a whole training step
# are different scopes, so both are shown.

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # True: measure this machine's GPU through the package first, then render
size = 128  # volume side when measuring (the paper: 128)
configs = "baseline,opt1,opt2,opt12,pytorch-default"  # configurations to measure

# %% tags=["remove-input", "full-width"]
from medddpm.report.measure import prepare
from medddpm.report import headline
from medddpm.report.present import table

root, G = prepare(results_dir, gpus, measure, "end_to_end", size, configs)
table(headline.headline(root, G), 2)

# %% [markdown]
# Each chapter is a notebook in `notebooks/` that reads the results store (`data/results/<gpu>/`)
# and the paper's own numbers (`data/paper/`), executed by Jupyter Book itself each time the book
# is built (`jupyter-book build book/`). Every figure labels its bars: solid bars are our
# measurements, one colour per GPU; hatched grey bars are values the paper states in its text.
# Numbers in the prose are computed by the notebooks.
#
# Chapters follow the paper:
#
# 1. **Set-up and GPUs**: Table 1 next to the GPUs measured here.
# 2. **The model**: Fig. 3 drawn from the model object; parameters and FLOPs per block.
# 3. **Characterization**: Figs. 4–7 and Table 2 from Nsight Compute reports in the paper's mode.
# 4. **Interventions**: Figs. 8–13, kernel mixes of whole steps, counters where reports exist.
# 5. **End to end**: step times, and how much of a step the paper's 100-kernel window covers.
#
# Beyond the paper:
#
# 6. **The fast path**: the ladder (bf16, compile, NDHWC, CUDA graphs, Triton kernels), the real
#    training loop, and training on several GPUs with torchrun.
# 7. **The last milliseconds**: each kernel lever, the norms and convolutions shape by shape.
# 8. **The roofline**: every kernel of a step against its bound.
# 9. **Quality**: the same network, the same model, the same volumes.
# 10. **Sampling**: seconds per volume, and which sampler is right.
# 11. **A dozen steps**: few-step solvers judged inside DDPM 250's band.
# 12. **FP8 sampling** and the paper's Fig. 1 from our own model.
# 13. **Past `fast`**: the stretch target's levers, each against `fast`, and what is left above the bounds.
#
# **Reproduce on your GPU** explains how to add a GPU.
