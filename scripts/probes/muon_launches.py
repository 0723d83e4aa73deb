"""How many operations one Muon step launches on the paper's U-Net (issue 75: Muon's 6.5 ms a step at 64³ on an H200,
data/results/h200/recipe/muon-64-2026-11-28). Runs on the CPU: torch.profiler counts the top-level ATen operations of
``Muon.step`` over the whole-head model's hidden matrices (channels-last, as `fast` holds them), views and kernels
apart; inside the training step's CUDA graph each kernel-launching operation is one replayed kernel or more.
    python scripts/probes/muon_launches.py
"""
import collections

import torch
from torch.profiler import ProfilerActivity, profile

from medddpm.core.config import model_preset, run_config
from medddpm.net.model import UNet3D
from medddpm.run.optim import make_optimizer

VIEWS = {"aten::reshape", "aten::view", "aten::mT", "aten::permute", "aten::unbind", "aten::transpose",
         "aten::_unsafe_view", "aten::as_strided", "aten::select", "aten::t"}  # no kernel of their own here

model = UNet3D(model_preset("whole-head")).to(memory_format=torch.channels_last_3d)
opt = make_optimizer(model, 2e-4, run_config("baseline"), torch.device("cpu"), kind="muon")
for p in model.parameters():
    p.grad = torch.randn_like(p)
opt.step()  # the momentum buffers exist from here on, as in every captured step
with profile(activities=[ProfilerActivity.CPU]) as prof:
    opt.parts["muon"].step()
top = [e.name for e in prof.events() if e.name.startswith("aten::")
       and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
ops = collections.Counter(n for n in top if n not in VIEWS)
print(f"{len(model.hidden_matrices())} matrices; {sum(ops.values())} kernel-launching operations a step "
      f"({len(top) - sum(ops.values())} views)")
print(", ".join(f"{n.removeprefix('aten::')} {k}" for n, k in ops.most_common()))
