"""What `sample` prints about its time (its ``timing:`` line): no PyTorch, so the report layer reads the phases."""
from __future__ import annotations

# What `sample` times from its start (``sample_masks``' ``started``: the process's start, where the
# command line gives it): the interpreter started and the modules imported, the inputs read and the
# denoiser built, the Triton kernels compiled or loaded from their cache, the first CUDA graph
# captured (where the configuration has them and a shape runs often enough, ``Knobs.capture_after``),
# the first volume sampled, the last, and the last file written; rank 0's, under torchrun
TIMING = ("imports", "ready", "kernels", "captured", "first volume", "last volume", "written")


def timing_line(marks: dict[str, float], started: float) -> str:
    """``timing: imports 1.9 s, ready 2.6 s, …`` (seconds since ``started``, in the order they fell)."""
    return "timing: " + ", ".join(f"{k} {marks[k] - started:.1f} s" for k in sorted((k for k in TIMING if k in marks),
                                                                                     key=marks.__getitem__))
