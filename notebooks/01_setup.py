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
# # Set-up and GPUs (Table 1)
#
# The paper profiled Med-DDPM on a V100, an A100 and an H100 (§3.1, Table 1). This chapter puts
# its Table 1 next to the GPUs whose results are in `data/results/` — every GPU measured with this
# package appears here as a row, and as a series in every later figure.

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # True: measure this machine's GPU through the package first, then render
size = 128  # volume side when measuring (the paper: 128)
configs = "baseline,opt1,opt2,opt12,pytorch-default"  # configurations to measure

# %% tags=["remove-input"]
from IPython.display import display

from medddpm.report.measure import prepare
from medddpm.report import paper, plots, tables
from medddpm.report.present import table

root, G = prepare(results_dir, gpus, measure, "end_to_end", size, configs)

# %% [markdown]
# ## The paper's GPUs (Table 1, as printed)

# %% tags=["hide-input"]
table(paper.table("table1"))

# %% [markdown]
# ## The GPUs measured here
#
# One column per GPU of the results store. Properties come from
# `medddpm info --json` and `nvidia-smi` on the machine that measured them; memory bandwidth was
# not measured (the column says so rather than repeat a datasheet number).

# %% tags=["hide-input"]
props = tables.gpu_properties(root, G)
if props.empty:
    print(plots.no_data_text("GPU in this results store", "bench"))
else:
    display(table(props.set_index("gpu").T, index=True))

# %% [markdown]
# ## Software: the paper's stack and ours
#
# The paper used PyTorch 2.0.1, cuDNN 8.9.2 and Nsight Compute 2025.2.1 (§3.1); the versions we
# ran are in the table above. Newer PyTorch releases turn TF32 on for cuDNN convolutions by
# default, so our `baseline` switches TF32 off explicitly, and `pytorch-default` records what the
# installed PyTorch does on its own.

# %% tags=["hide-input"]
table(paper.table("hyperparameters"))
