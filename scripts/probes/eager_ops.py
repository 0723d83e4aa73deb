"""Which aten op launches the kernels of a sampling configuration (argv[2], default fast-eager; ungraphed, 3 warm
DDPM steps at 128³, seeded weights), by input shapes: self device time per op (torch.profiler key_averages),
written to argv[1]. Run on a GPU machine from the repository root (scripts/probes/fused_residual.sh)."""
import sys
import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile
from medddpm.core.config import model_preset, sampling_config, ungraphed
from medddpm.profiling.sample_bench import first_ddpm_steps, warm_sampler

cfg, dev, steps = model_preset("whole-head"), torch.device("cuda"), 3
knobs = ungraphed(sampling_config(sys.argv[2] if len(sys.argv) > 2 else "fast-eager"))
with warm_sampler(cfg, knobs, (128,) * 3, dev, 1, 0) as (diffusion, masks, gen):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        first_ddpm_steps(diffusion, masks, cfg.out_channels, gen, steps)
        torch.cuda.synchronize(dev)
rows = []
for a in prof.key_averages(group_by_input_shape=True):
    us = getattr(a, "self_device_time_total", None) or getattr(a, "self_cuda_time_total", 0)
    if us <= 0:
        continue
    rows.append({"op": a.key, "shapes": str(a.input_shapes)[:160],
                 "calls_per_step": a.count / steps, "ms_per_step": us / steps / 1e3})
df = pd.DataFrame(rows).sort_values("ms_per_step", ascending=False)
df.to_csv(sys.argv[1], index=False)
print(knobs.name, round(df["ms_per_step"].sum(), 2), "ms a step")
print(df.groupby("op")["ms_per_step"].sum().sort_values(ascending=False).head(15).round(3).to_string())
