import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # Triton's interpreter runs medddpm.net.kernels on CPU tensors (read at import)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from medddpm.core.config import MODEL_PRESETS
from medddpm.data.nifti import write_phantoms

# two cores: a worker each under pytest-xdist (`make test` runs `pytest -n 2`), both for one process
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


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
    """One tiny 16³ checkpoint (1 training step on the phantoms) of the paper's reference recipe
    (ε-prediction, one flag away from the default), shared by the tests that sample."""
    from medddpm.cli import main

    run = tmp_path_factory.mktemp("tiny-run")
    assert main(["train", "--images", str(phantoms / "images"), "--masks", str(phantoms / "masks"), "--model", "tiny",
                 "--steps", "1", "--size", "16", "--out", str(run), "--quiet", "--device", "cpu", "--prediction", "eps"]) == 0
    return run / "checkpoint.pt"


IXI_IDS = (12, 13, 14, 15, 501, 502)  # 4 development subjects, 2 of the external test set


@pytest.fixture(scope="session")
def fake_ixi(tmp_path_factory) -> Path:
    """A folder shaped as NiChart's IXI test data (Nifti/T1/IXI<ID>-HH-<n>_T1.nii.gz and
    DLMUSE/…_T1_DLMUSE.nii.gz), 12 × 12 × 9 voxels of 2 mm, seeded: a bright head, a parcellated brain."""
    import nibabel as nib
    import numpy as np

    root = tmp_path_factory.mktemp("ixi") / "IXI"
    (root / "Nifti" / "T1").mkdir(parents=True)
    (root / "DLMUSE").mkdir()
    rng = np.random.default_rng(0)
    affine = np.array([[0, 0, 2.0, -9], [-2.0, 0, 0, 12], [0, 2.0, 0, -12], [0, 0, 0, 1]])  # PSR, as the scans
    for n, i in enumerate(IXI_IDS):
        image = rng.uniform(0, 20, (12, 12, 9)).astype(np.float32)
        image[2:10, 2:10, 1:8] += 800 + 100 * n
        labels = np.zeros((12, 12, 9), np.uint8)
        labels[4:8, 4:8, 3:6] = rng.choice([4, 11, 23, 207], size=(4, 4, 3))
        image[labels > 0] += 400
        stem = f"IXI{i:03d}-HH-{1000 + n}_T1"
        nib.save(nib.Nifti1Image(image, affine), str(root / "Nifti" / "T1" / f"{stem}.nii.gz"))
        nib.save(nib.Nifti1Image(labels, affine), str(root / "DLMUSE" / f"{stem}_DLMUSE.nii.gz"))
    return root


@pytest.fixture(scope="session")
def ixi16(fake_ixi, tmp_path_factory) -> Path:
    """``fake_ixi`` prepared at 16³ with 1 validation subject (``medddpm prepare-ixi``)."""
    from medddpm.data.ixi import prepare

    out = tmp_path_factory.mktemp("ixi16") / "ixi"
    prepare(fake_ixi, out, size=16, val=1)
    return out


def train_ixi(ixi16: Path, run: Path, size: int) -> Path:
    """A tiny ``size``³ v-prediction checkpoint of ``ixi16`` (2 steps, the val subject held out), its
    DLMUSE labels mapped with --mask-labels, percentile scaling and offset noise."""
    from medddpm.cli import main

    assert main(["train", "--images", str(ixi16 / "dev" / "images"), "--masks", str(ixi16 / "dev" / "masks"),
                 "--model", "tiny", "--steps", "2", "--size", str(size), "--out", str(run), "--quiet", "--device", "cpu",
                 "--held-out", "1", "--mask-labels", "brain=nonzero", "--prediction", "v", "--intensity", "percentile",
                 "--offset-noise", "0.1"]) == 0
    return run / "checkpoint.pt"


@pytest.fixture(scope="session")
def ixi_checkpoint(ixi16, tmp_path_factory) -> Path:
    """``train_ixi`` at 16³."""
    return train_ixi(ixi16, tmp_path_factory.mktemp("ixi-run"), 16)


@pytest.fixture(scope="session")
def ixi_checkpoint8(ixi16, tmp_path_factory) -> Path:
    """``train_ixi`` at 8³: one mask's DDPM 250 takes 3 s on a CPU (16³: 20 s)."""
    return train_ixi(ixi16, tmp_path_factory.mktemp("ixi-run8"), 8)
