import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # Triton's interpreter runs medddpm.net.kernels on CPU tensors (read at import)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from medddpm.core.config import MODEL_PRESETS
from medddpm.data.nifti import write_phantoms

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def phantoms(tmp_path_factory) -> Path:
    """Three seeded 16³ phantom pairs: DIR/images, DIR/masks."""
    out = tmp_path_factory.mktemp("phantoms")
    write_phantoms(out, n=3, size=16, seed=1)
    return out


@pytest.fixture
def tiny():
    return MODEL_PRESETS["tiny"]


@pytest.fixture(scope="session")
def tiny_checkpoint(phantoms, tmp_path_factory) -> Path:
    """One tiny 16³ checkpoint (1 training step on the phantoms), shared by the tests that sample."""
    from medddpm.cli import main

    run = tmp_path_factory.mktemp("tiny-run")
    assert main(["train", "--images", str(phantoms / "images"), "--masks", str(phantoms / "masks"), "--model", "tiny",
                 "--steps", "1", "--size", "16", "--out", str(run), "--quiet", "--device", "cpu"]) == 0
    return run / "checkpoint.pt"
