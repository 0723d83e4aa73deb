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
