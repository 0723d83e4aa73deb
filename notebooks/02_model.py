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
# # The model (Fig. 3)
#
# Med-DDPM's denoiser is a guided-diffusion style 3D U-Net conditioned on a one-hot mask that is
# concatenated with the noisy volume (§2.1). The diagram below is drawn from the model object in
# `medddpm.net.model`, not by hand; parameter and FLOP counts come from `torch.utils.flop_counter` on
# PyTorch's meta device.

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # True: measure this machine's GPU through the package first, then render
size = 128  # volume side when measuring (the paper: 128)
configs = "baseline,opt1,opt2,opt12,pytorch-default"  # configurations to measure

# %% tags=["remove-input"]
import matplotlib.pyplot as plt
import pandas as pd

from medddpm.core.config import MODEL_PRESETS
from medddpm.report import plots
from medddpm.report.present import table
from medddpm.net.summary import summarize

s = summarize(MODEL_PRESETS["whole-head"], (size, size, size))

# %% [markdown]
# At the paper's size: the whole-head model's parameters and the FLOPs of one forward pass, counted from the model.

# %% tags=["hide-input"]
table(pd.DataFrame([{"input": str(s["input_shape"]), "parameters": s["parameters"],
                     "forward TFLOP": s["forward_flops"] / 1e12}]), {"forward TFLOP": 2})

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-unet", "caption": "The paper's Fig. 3, drawn from our model: every block of the whole-head Med-DDPM U-Net at its resolution level (encoder left, decoder right), with its layers, channels and output size; parameters and forward FLOPs counted from the model itself at the paper's input size."}}
fig, ax = plt.subplots(figsize=(14, 5.5))
plots.unet_diagram(s, ax)
plots.finish(fig)

# %% [markdown]
# ## Parameters and FLOPs per block

# %% tags=["hide-input"]
blocks = pd.DataFrame(s["blocks"])
blocks["GFLOP"] = blocks["flops"] / 1e9
blocks["share of FLOPs (%)"] = 100 * blocks["flops"] / s["forward_flops"]
table(blocks[["block", "layers", "out_shape", "params", "GFLOP", "share of FLOPs (%)"]])

# %% tags=["hide-input", "full-width"] mystnb={"figure": {"name": "fig-flops", "caption": "Forward FLOPs of each block of the whole-head model at the paper's input size, counted from the model (convolutions, attention and linear layers)."}}
fig, ax = plt.subplots(figsize=(12, 3.5))
ax.bar(blocks["block"], blocks["GFLOP"], color="#4c72b0")
ax.set_ylabel("forward GFLOP")
ax.set_title(f"Forward FLOPs per block at {size}³")
ax.tick_params(axis="x", rotation=90, labelsize=7)
plots.finish(fig)

# %% [markdown]
# The share column: the full-resolution levels dominate the forward FLOPs, which is why 3D convolutions at 128³ set
# the step time.
