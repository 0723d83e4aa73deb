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

Modules that lived flat in ``medddpm/`` before this layout are still importable under their old
names (``medddpm.config``, ``medddpm.engine``, …): ``MOVED`` maps each to its new place, and the old
name is the same module object. ``python -m`` takes the new name (``python -m
medddpm.profiling.layers``); the old one says so.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

MOVED = {  # old flat module → where it lives now (the four whose old name is now a subpackage re-export it there)
    "config": "core.config", "errors": "core.errors", "io": "core.io", "runtime": "core.runtime",
    "model": "net.model", "kernels": "net.kernels", "fp8": "net.fp8", "ndhwc": "net.ndhwc", "summary": "net.summary",
    "solvers": "diffusion.solvers", "brats": "data.brats", "pipeline": "data.pipeline",
    "engine": "run.engine", "distributed": "run.distributed",
    "loop": "train.loop", "heldout": "train.heldout", "quality": "train.parity",
    "sample_quality": "sample.quality", "sampler_gate": "sample.gate",
    "bench": "profiling.bench", "workload": "profiling.workload", "layers": "profiling.layers",
    "scaling": "profiling.scaling", "sample_bench": "profiling.sample_bench",
}


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``medddpm.<old>`` → the module ``MOVED`` names (one object under both names)."""

    @staticmethod
    def _target(fullname: str) -> str | None:
        prefix = __name__ + "."
        old = fullname[len(prefix):] if fullname.startswith(prefix) else None
        return f"{prefix}{MOVED[old]}" if old in MOVED else None

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if self._target(fullname) else None

    def create_module(self, spec):
        return importlib.import_module(self._target(spec.name))

    def exec_module(self, module) -> None:  # the module ran when it was imported under its new name
        pass

    def get_code(self, fullname):  # what ``python -m`` asks for
        raise ImportError(f"{fullname} moved to {self._target(fullname)}: run python -m {self._target(fullname)}")


if not any(isinstance(f, _Moved) for f in sys.meta_path):
    sys.meta_path.insert(0, _Moved())
