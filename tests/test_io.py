import errno
import os
import stat

import pytest

from medddpm.core.io import atomic_path, write_text_atomic
from medddpm.data.nifti import list_nifti, write_phantoms


def test_an_atomic_write_gets_the_umasks_permissions_and_a_failed_one_leaves_the_old_file(tmp_path):
    """Issue 77 items 4 and 8: the file a write renames into place has the mode the umask gives a new file (mkstemp's
    would be -rw-------), and a write that fails half-way leaves the previous file whole and no temporary file."""
    write_text_atomic(tmp_path / "a.csv", "x\n1\n")
    mode = stat.S_IMODE((tmp_path / "a.csv").stat().st_mode)
    assert mode == 0o666 & ~_process_umask() and (mode != 0o600 or _process_umask() & 0o066 == 0o066)
    with pytest.raises(OSError, match="No space left"):
        with atomic_path(tmp_path / "a.csv") as tmp:
            tmp.write_text("x\n2")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert (tmp_path / "a.csv").read_text() == "x\n1\n" and sorted(p.name for p in tmp_path.iterdir()) == ["a.csv"]


def _process_umask() -> int:
    from medddpm.core import io

    return io._UMASK  # read once at import: the umask the process started with


def test_inputs_skip_dot_files(tmp_path):
    """A temporary file of an interrupted writer (`.name.nii.gz.…tmp.nii.gz`) is never read as an input."""
    write_phantoms(tmp_path, n=2, size=8, seed=0)
    masks = tmp_path / "masks"
    first = sorted(masks.iterdir())[0]
    (masks / f".{first.name}.abc.tmp.nii.gz").write_bytes(first.read_bytes())
    assert [p.name for p in list_nifti(masks, "masks")] == sorted(p.name for p in masks.iterdir()
                                                                  if not p.name.startswith("."))


def test_a_nifti_is_written_whole_or_not_at_all_and_its_temporary_name_is_no_nifti(tmp_path, monkeypatch):
    """Issue 77 item 8: a sample or prepared volume reads back as written; a write that fails half-way (a full disk)
    leaves the previous file and no temporary file; while it is written, its temporary name ends in no NIfTI suffix."""
    import nibabel as nib
    import numpy as np
    from pathlib import Path

    from medddpm.data.nifti import NIFTI_SUFFIXES, save_atomic

    arr = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    path = tmp_path / "s.nii.gz"
    save_atomic(nib.Nifti1Image(arr, np.eye(4)), path)
    np.testing.assert_array_equal(np.asarray(nib.load(path).dataobj), arr)
    before = path.read_bytes()
    names = []

    def half(self, data):
        names.append(self.name)
        with open(self, "wb") as f:
            f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(Path, "write_bytes", half)
    with pytest.raises(OSError, match="No space left"):
        save_atomic(nib.Nifti1Image(arr + 1, np.eye(4)), path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["s.nii.gz"]
    assert names and names[0].startswith(".") and not names[0].lower().endswith(NIFTI_SUFFIXES)
