"""medddpm prepare-ixi: NiChart's IXI folder as image/mask pairs at a cubic size, split by IXI ID."""
from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd
import pytest

from medddpm.cli import main, parser
from medddpm.core.errors import InputError
from medddpm.data.ixi import TEST_FROM, prepare, split_of
from medddpm.data.nifti import canonical


def names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_the_split_keeps_the_test_ids_apart(ixi16):
    split = pd.read_csv(ixi16 / "split.csv")
    assert split.set_index("id")["split"].to_dict() == {12: "train", 13: "train", 14: "train", 15: "val",
                                                       501: "test", 502: "test"}
    assert names(ixi16 / "test" / "images") == ["IXI501.nii.gz", "IXI502.nii.gz"]
    dev = names(ixi16 / "dev" / "images")
    assert dev == ["IXI012.nii.gz", "IXI013.nii.gz", "IXI014.nii.gz", "IXI015.nii.gz"]  # val last: --held-out 1
    assert names(ixi16 / "val" / "masks") == ["IXI015.nii.gz"]
    assert not any(int(n[3:6]) >= TEST_FROM for n in dev)
    assert split_of([3, 1, 2, 600], 1) == {1: "train", 2: "train", 3: "val", 600: "test"}
    with pytest.raises(InputError, match="--val"):
        split_of([1, 2, 600], 2)


def test_volumes_keep_their_intensities_labels_and_place(fake_ixi, ixi16):
    src = canonical(nib.load(str(next((fake_ixi / "Nifti" / "T1").glob("IXI012*")))))
    img = nib.load(str(ixi16 / "dev" / "images" / "IXI012.nii.gz"))
    assert img.shape == (16, 16, 16) and img.get_data_dtype() == np.uint8
    vals = img.get_fdata()
    assert 0 <= vals.min() and abs(vals.max() - src.get_fdata().max()) < src.get_fdata().max() / 40  # trilinear, 1/255 steps
    seg = np.asarray(nib.load(str(ixi16 / "dev" / "masks" / "IXI012.nii.gz")).dataobj)
    assert set(np.unique(seg)) <= {0, 4, 11, 23, 207} and (seg > 0).any()
    # the cube's centre sits at the padded scan's centre: a 24 mm cube of 1.5 mm voxels around the 12 × 12 × 9
    # canonical scan, padded by 1 before and 2 after along its 9-voxel axis
    padded_centre = np.array([(12 - 1) / 2 - (12 - s) // 2 for s in src.shape] + [1.0])
    assert np.allclose(img.affine @ np.array([7.5, 7.5, 7.5, 1.0]), src.affine @ padded_centre, atol=1e-6)
    assert np.allclose(np.abs(img.affine[:3, :3]).sum(axis=0), 1.5)


def test_prepare_refuses_what_it_cannot_do(fake_ixi, tmp_path):
    with pytest.raises(InputError, match="multiple of 16"):
        prepare(fake_ixi, tmp_path / "a", size=24)
    with pytest.raises(InputError, match="Nifti/T1"):
        prepare(tmp_path, tmp_path / "b")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x").write_text("x")
    with pytest.raises(InputError, match="already holds files"):
        prepare(fake_ixi, tmp_path / "c", size=16)


def test_cli_prepares_and_says_how_to_train(capsys, fake_ixi, tmp_path):
    assert main(["prepare-ixi", "--root", str(fake_ixi), "--out", str(tmp_path / "o"), "--size", "16", "--val", "1"]) == 0
    out = capsys.readouterr().out
    assert "train 3, val 1, test 2" in out and "--held-out 1 --mask-labels brain=nonzero" in out
    command = out.split("`")[1].split()  # the printed train command parses as train's, its data where it says
    assert command[:2] == ["medddpm", "train"]
    a = parser().parse_args(command[1:])
    assert a.steps == 6000 and a.size == [16] and Path(a.images) == tmp_path / "o" / "dev" / "images" and a.held_out == 1
    assert main(["prepare-ixi", "--root", str(tmp_path / "none"), "--out", str(tmp_path / "p")]) == 2
    assert not (tmp_path / "p").exists()
