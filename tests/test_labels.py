"""--mask-labels: a parcellation's integer labels mapped onto the preset's mask channels."""
import nibabel as nib
import numpy as np
import pytest

from medddpm.core.errors import InputError
from medddpm.data.labels import MASK_LABELS, parse
from medddpm.data.nifti import load_mask_tensor, read_labels


def test_ranges_and_the_rest_map_onto_the_presets_labels():
    m = parse(" brain = 1-207 , lesion=250 ", "whole-head")
    assert m.spec == "brain=1-207,lesion=250"
    assert m.apply(np.array([0, 1, 100, 207, 250]), "f").tolist() == [0, 1, 1, 1, 2]
    rest = parse("brain=nonzero,background=24+30-31,lesion=250", "whole-head")
    assert rest.apply(np.array([0, 4, 24, 30, 31, 32, 250]), "f").tolist() == [0, 1, 0, 0, 0, 1, 2]
    # BraTS names map to their preset values (enhancing = 3, healthy = 5)
    assert parse("enhancing=4,healthy=nonzero", "brats").apply(np.array([0, 4, 9]), "f").tolist() == [0, 3, 5]


def test_a_label_no_name_takes_is_refused_with_its_values():
    with pytest.raises(InputError, match=r"seg.nii.gz: .*leaves label values 4, 9 unmapped"):
        parse("brain=1-3", "whole-head").apply(np.array([0, 1, 4, 9]), "seg.nii.gz")


@pytest.mark.parametrize("spec, message", [
    ("tumour=1", "unknown name 'tumour'"), ("brain=1,brain=2", "given twice"),
    ("brain=1-10,lesion=5", "lesion and brain overlap at 5-5"), ("brain=nonzero,lesion=nonzero", "only one name"),
    ("brain=5-1", "runs backwards"), ("brain=x", "not an integer"), ("brain", "not NAME=VALUES"),
    ("brain=0-4", "label 0 is background"), (" , ", "is empty"),
])
def test_bad_maps_get_one_clear_error(spec, message):
    with pytest.raises(InputError, match=message):
        parse(spec, "whole-head")


def test_files_are_read_through_the_map_or_refused_with_a_hint(tmp_path):
    labels = np.zeros((8, 8, 8), np.uint8)
    labels[2:6, 2:6, 2:6] = 23
    labels[3, 3, 3] = 250
    path = tmp_path / "seg.nii.gz"
    nib.save(nib.Nifti1Image(labels, np.eye(4)), str(path))
    with pytest.raises(InputError, match="--mask-labels"):
        read_labels(path, MASK_LABELS["whole-head"])
    mapped = read_labels(path, MASK_LABELS["whole-head"], parse("brain=nonzero,lesion=250", "whole-head"))
    assert (mapped == 1).sum() == 63 and (mapped == 2).sum() == 1
    onehot = load_mask_tensor(path, "whole-head", (8, 8, 8), "brain=nonzero,lesion=250")
    assert onehot.shape == (2, 8, 8, 8) and int((onehot[0] > 0).sum()) == 63 and int((onehot[1] > 0).sum()) == 1
