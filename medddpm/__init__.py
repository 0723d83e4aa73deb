"""medddpm: an executable, reproducible artifact of the ICPE '26 Med-DDPM GPU performance study.

The package is laid out as the paper's flow, each subpackage importing only the ones before it
(``tests/test_imports.py`` checks this from the import statements):

``core`` (configuration, errors, atomic I/O, runtime flags) → ``net`` (the 3D U-Net and its
kernels) → ``diffusion`` (the schedule and the samplers) → ``data`` (NIfTI, BraTS roots, the
input pipeline) → ``run`` (the engine that sets a configuration up, distributed ranks) →
``train`` (the loop, checkpoints, held-out loss, parity) → ``sample`` (sampling masks, sample
quality, the sampler gate) → ``profiling`` (bench, layers, scaling, ncu, torch.profiler) →
``cli`` (the ``medddpm`` command) → ``report`` (what the notebooks draw; their measure mode runs
the command line).
"""
__version__ = "0.1.0"
