"""Under torchrun: time an all-reduce of the whole-head model's gradient size (160 MB fp32) and
report NCCL's bus bandwidth; run with NCCL_DEBUG=INFO to see the transport NCCL chose."""
import os
import statistics

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
x = torch.ones(40_226_433, device="cuda")
for _ in range(5):
    dist.all_reduce(x)
times = []
for _ in range(20):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    dist.all_reduce(x)
    b.record()
    b.synchronize()
    times.append(a.elapsed_time(b))
ms = statistics.median(times)
if rank == 0:
    nbytes = x.numel() * 4
    print(f"allreduce {nbytes / 1e6:.0f} MB: {ms:.3f} ms median, bus bandwidth "
          f"{2 * (world - 1) / world * nbytes / ms / 1e6:.1f} GB/s")
dist.destroy_process_group()
