"""Profiling Med-DDPM: Nsight Compute wrapper, ncu CSV tidying, torch.profiler step tables."""
