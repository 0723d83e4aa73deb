import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from medddpm.data.nifti import (
    label_values, one_hot, pair_files, phantom, read_image, read_labels, subject_id,
    write_like_mask, write_mni_demo, write_phantoms,
)
from medddpm.data.labels import MASK_LABELS
from medddpm.data.volumes import VolumeDataset
from medddpm.core.errors import InputError


def _save(path: Path, arr, affine=None, dtype=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    img = nib.Nifti1Image(np.asarray(arr, dtype=dtype or np.asarray(arr).dtype), np.eye(4) if affine is None else affine)
    nib.save(img, str(path))
    return path


@pytest.mark.parametrize("name,sid", [
    ("sub-03_T1w.nii.gz", "sub_03"), ("sub-03_seg.nii.gz", "sub_03"), ("img_007.nii", "007"),
    ("msk_007.nii.gz", "007"), ("BraTS2021_01306_flair.nii.gz", "BraTS2021_01306"), ("case7.nii.gz", "case7"),
])
def test_subject_id(name, sid):
    assert subject_id(Path(name)) == sid


def test_pairing_is_by_id_not_order(tmp_path):
    vol = np.zeros((4, 4, 4), np.uint8)
    for n in ("img_2", "img_10", "img_1"):
        _save(tmp_path / "i" / f"{n}.nii.gz", vol)
    for n in ("msk_10", "msk_1", "msk_2"):
        _save(tmp_path / "m" / f"{n}.nii.gz", vol)
    pairs = pair_files(tmp_path / "i", tmp_path / "m")
    assert [(p.image.name, p.mask.name) for p in pairs] == [
        ("img_1.nii.gz", "msk_1.nii.gz"), ("img_10.nii.gz", "msk_10.nii.gz"), ("img_2.nii.gz", "msk_2.nii.gz")]


def test_every_unmatched_file_is_reported(tmp_path):
    vol = np.zeros((4, 4, 4), np.uint8)
    for n in ("a_img", "b_img", "c_img"):
        _save(tmp_path / "i" / f"{n}.nii.gz", vol)
    for n in ("a_seg", "d_seg"):
        _save(tmp_path / "m" / f"{n}.nii.gz", vol)
    with pytest.raises(InputError) as e:
        pair_files(tmp_path / "i", tmp_path / "m")
    msg = str(e.value)
    assert "b_img.nii.gz" in msg and "c_img.nii.gz" in msg and "d_seg.nii.gz" in msg and "a_img" not in msg


def test_missing_and_empty_folders(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        pair_files(tmp_path / "nope", tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no .nii"):
        pair_files(tmp_path / "empty", tmp_path)


def test_image_scaling_and_bad_images(tmp_path):
    arr = np.arange(64, dtype=np.float32).reshape(4, 4, 4)
    img = read_image(_save(tmp_path / "a.nii.gz", arr))
    assert img.shape == (1, 4, 4, 4) and img.min() == -1 and img.max() == 1
    with pytest.raises(InputError, match="3-D volume"):
        read_image(_save(tmp_path / "b.nii.gz", np.zeros((4, 4), np.float32)))
    with pytest.raises(InputError, match="3-D volume"):
        read_image(_save(tmp_path / "c.nii.gz", np.zeros((4, 4, 4, 2), np.float32)))
    with pytest.raises(InputError, match="constant"):
        read_image(_save(tmp_path / "d.nii.gz", np.ones((4, 4, 4), np.float32)))
    (tmp_path / "e.nii.gz").write_bytes(b"not a nifti at all")
    with pytest.raises(InputError, match="cannot read"):
        read_image(tmp_path / "e.nii.gz")


def test_labels_and_one_hot(tmp_path):
    lab = np.zeros((4, 4, 4), np.uint8)
    lab[1:3, 1:3, 1:3] = 1
    lab[2, 2, 2] = 2
    labels = read_labels(_save(tmp_path / "m.nii.gz", lab), MASK_LABELS["whole-head"])
    oh = one_hot(labels, MASK_LABELS["whole-head"])
    assert oh.shape == (2, 4, 4, 4) and set(np.unique(oh)) == {-1.0, 1.0}
    assert (oh[0] == 1).sum() == 7 and (oh[1] == 1).sum() == 1
    with pytest.raises(InputError, match=r"unknown label values \[3\]"):
        lab[0, 0, 0] = 3
        read_labels(_save(tmp_path / "m3.nii.gz", lab), MASK_LABELS["whole-head"])
    with pytest.raises(InputError, match="non-integer"):
        read_labels(_save(tmp_path / "mf.nii.gz", np.full((4, 4, 4), 0.5, np.float32)), MASK_LABELS["whole-head"])


@pytest.mark.parametrize("low, high", [(0, 6), (0, 300), (-2, 6), (0, 70_000)])
def test_label_values_and_one_hot_agree_with_sorting_and_isin(low, high):
    """The counted values and the table one-hot equal np.unique and np.isin, for small labels (tables),
    negative or large ones (the general path), and a transposed (Fortran-ordered) array."""
    rng = np.random.default_rng(high)
    lab = rng.integers(low, high, size=(9, 7, 5)).astype(np.int64)
    lab.flat[::11] = 0
    groups = ((1,), (2,), (3, 4), (5, 69_999), (-1,))
    for arr in (lab, np.asfortranarray(lab), lab.transpose(2, 0, 1)):
        assert np.array_equal(label_values(arr), np.unique(arr))
        want = np.stack([np.isin(arr, g) for g in groups]).astype(np.float32) * 2 - 1
        got = one_hot(arr, groups)
        assert got.dtype == np.float32 and got.shape == want.shape and np.array_equal(got, want)
        small = one_hot(arr, groups, np.int8)  # what `sample` reads its masks as
        assert small.dtype == np.int8 and np.array_equal(small, want)


@pytest.mark.parametrize("stored, read", [(np.uint8, np.uint8), (np.int16, np.int16), (np.uint16, np.int64),
                                          (np.float32, np.int64)])
def test_labels_keep_their_stored_integer_type_where_torch_has_it(tmp_path, stored, read):
    """A uint8 mask is copied and indexed as uint8, not widened to int64; a type torch lacks
    (uint16) or a float map of integers becomes int64. The values and the one-hot are the same."""
    lab = np.zeros((6, 5, 4), stored)
    lab[1:4, 1:4, 1:3] = 1
    lab[2, 2, 1] = 2
    got = read_labels(_save(tmp_path / "m.nii.gz", lab), MASK_LABELS["whole-head"])
    assert got.dtype == read and got.flags.c_contiguous and np.array_equal(got, lab.astype(np.int64))
    assert np.array_equal(one_hot(got, MASK_LABELS["whole-head"]), one_hot(lab.astype(np.int64), MASK_LABELS["whole-head"]))


def test_masks_come_from_dataobj_not_scaled_floats(tmp_path):
    """A label map stored with a scale factor still reads as its stored integers' meaning."""
    lab = np.zeros((4, 4, 4), np.int16)
    lab[0] = 2
    img = nib.Nifti1Image(lab, np.eye(4))
    nib.save(img, str(tmp_path / "m.nii.gz"))
    assert set(np.unique(read_labels(tmp_path / "m.nii.gz", MASK_LABELS["whole-head"]))) == {0, 2}


def test_dataset_resizes(phantoms):
    ds = VolumeDataset(pair_files(phantoms / "images", phantoms / "masks"), "whole-head", 1, (8, 8, 8))
    image, mask = ds[0]
    assert image.shape == (1, 8, 8, 8) and mask.shape == (2, 8, 8, 8)
    assert image.min() >= -1 and image.max() <= 1
    assert set(torch.unique(mask).tolist()) <= {-1.0, 1.0}


def test_write_back_in_mask_space_with_reorientation(tmp_path):
    """A non-RAS mask: output has its shape, affine and orientation (voxel-for-voxel)."""
    affine = np.array([[-2.0, 0, 0, 10], [0, 0, 1.5, -5], [0, -1.0, 0, 3], [0, 0, 0, 1]])
    shape = (6, 4, 8)
    lab = np.zeros(shape, np.uint8)
    lab[1, 2, 3] = 1
    mask_path = _save(tmp_path / "m.nii.gz", lab, affine)
    canon = nib.as_closest_canonical(nib.load(str(mask_path)))
    labels = np.asarray(canon.dataobj)
    out = tmp_path / "out" / "s.nii.gz"
    # write the canonical label map itself as "the sample": it must land back on the original
    write_like_mask(labels[None].astype(np.float32), mask_path, out)
    img = nib.load(str(out))
    assert img.shape == shape and np.allclose(img.affine, affine) and img.get_data_dtype() == np.float32
    np.testing.assert_allclose(img.get_fdata(), lab)
    # a model that ran at another size is resampled back to the mask's shape
    write_like_mask(np.zeros((1, 8, 8, 8), np.float32), mask_path, tmp_path / "out2.nii.gz")
    assert nib.load(str(tmp_path / "out2.nii.gz")).shape == shape
    assert not list(tmp_path.glob("**/*.tmp*"))


def test_phantoms_are_seeded(tmp_path):
    a, la = phantom(16, np.random.default_rng(5))
    b, lb = phantom(16, np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(la, lb)
    assert set(np.unique(la)) == {0, 1, 2}
    names = write_phantoms(tmp_path / "p", 2, 16, seed=0)
    assert names == ["phantom_000", "phantom_001"]
    with pytest.raises(InputError, match="already holds files"):
        write_phantoms(tmp_path / "p", 2, 16)


def test_mni_demo_has_real_anatomy(tmp_path):
    write_mni_demo(tmp_path, 1, 24, seed=0)
    img = nib.load(str(tmp_path / "images" / "mni_000.nii.gz"))
    lab = np.asarray(nib.load(str(tmp_path / "masks" / "mni_000.nii.gz")).dataobj)
    assert img.shape == (24, 24, 24)
    assert (lab == 1).sum() > 0.1 * lab.size and (lab == 2).sum() > 0
    data = img.get_fdata()
    assert data[lab >= 1].mean() > 3 * data[lab == 0].mean()  # brain brighter than background


def test_mni_demo_without_nilearn_is_one_clear_error_and_writes_nothing(tmp_path, monkeypatch, capsys):
    from medddpm.cli import main

    monkeypatch.setitem(sys.modules, "nilearn", None)  # as on a machine where nilearn is missing
    for layout in ("pairs", "brats"):
        assert main(["demo-data", "--out", str(tmp_path / layout), "--n", "1", "--size", "16", "--layout", layout]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "needs nilearn" in err[0] and not (tmp_path / layout).exists(), err


def test_singleton_fourth_axis_is_squeezed_real_4d_refused(tmp_path):
    arr = np.arange(64, dtype=np.float32).reshape(4, 4, 4)
    img = read_image(_save(tmp_path / "a.nii.gz", arr[..., None]))
    np.testing.assert_array_equal(img, read_image(_save(tmp_path / "b.nii.gz", arr)))
    lab = np.zeros((4, 4, 4, 1), np.uint8)
    lab[1, 1, 1, 0] = 2
    assert read_labels(_save(tmp_path / "m.nii.gz", lab), MASK_LABELS["whole-head"]).shape == (4, 4, 4)
    with pytest.raises(InputError, match=r"got shape \(4, 4, 4, 2\)"):
        read_labels(_save(tmp_path / "m2.nii.gz", np.zeros((4, 4, 4, 2), np.uint8)), MASK_LABELS["whole-head"])


def _pair_with_affines(root: Path, image_affine, mask_affine, mask_shape=(8, 8, 8)):
    rng = np.random.default_rng(0)
    _save(root / "images" / "s1.nii.gz", rng.random((8, 8, 8)).astype(np.float32), image_affine)
    lab = np.zeros(mask_shape, np.uint8)
    lab[2:5, 2:5, 2:5] = 1
    _save(root / "masks" / "s1.nii.gz", lab, mask_affine)
    return VolumeDataset(pair_files(root / "images", root / "masks"), "whole-head", 1, (8, 8, 8))


def test_image_and_mask_in_different_spaces_are_refused(tmp_path):
    ras = np.eye(4)
    lps = np.diag([-1.0, -1.0, 1.0, 1.0])  # the same voxel array, read as LPS
    with pytest.raises(InputError) as e:
        _pair_with_affines(tmp_path / "a", lps, ras).validate()
    msg = str(e.value)
    assert "s1.nii.gz" in msg and "not in the same space" in msg and "LPS" in msg and "RAS" in msg
    with pytest.raises(InputError, match=r"image shape \(8, 8, 8\), mask shape \(8, 8, 6\)"):
        _pair_with_affines(tmp_path / "b", ras, ras, (8, 8, 6)).validate()
    # header round-off below the tolerance is the same space
    nearly = ras.copy()
    nearly[0, 3] += 1e-5
    image, mask = _pair_with_affines(tmp_path / "c", ras, nearly)[0]
    assert image.shape == (1, 8, 8, 8) and mask.shape == (2, 8, 8, 8)
