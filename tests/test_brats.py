"""BraTS roots as distributed: layouts, label conventions, the reference's preprocessing, samples
written back in each subject's space, and the CLI's refusals (one line, exit 2, nothing written)."""
import shutil

import nibabel as nib
import numpy as np
import pytest
import torch

from medddpm.data import brats
from medddpm.data.brats import ET, ED, HEALTHY, NCR, crop_window, detect_labels, find_cases, prepare
from medddpm.cli import main
from medddpm.core.config import MODEL_PRESETS
from medddpm.core.errors import InputError

SIZE = 40  # the demo's BraTS grid scaled to 40 × 40 × 26: larger than brats-tiny's 32 × 32 × 24 window in I, J, K
WINDOW = MODEL_PRESETS["brats-tiny"].native_size


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    """Two subjects per (label convention, layout), written by ``medddpm demo-data``."""
    base = tmp_path_factory.mktemp("brats")
    out = {}
    for labels in brats.LABELS:
        for layout in ("brats", "brats-per-modality"):
            root = base / f"{labels}-{layout}"
            assert main(["demo-data", "--layout", layout, "--labels", labels, "--out", str(root), "--n", "2",
                         "--size", str(SIZE)]) == 0
            out[labels, layout] = root
    return out


def _canonical(path):
    return np.asanyarray(nib.as_closest_canonical(nib.load(str(path))).dataobj)


def copy(root, tmp_path):
    dst = tmp_path / root.name
    shutil.copytree(root, dst)
    return dst


@pytest.mark.parametrize("labels", sorted(brats.LABELS))
@pytest.mark.parametrize("layout", ["brats", "brats-per-modality"])
def test_both_layouts_and_all_conventions_give_the_same_channels(roots, labels, layout):
    """Each convention is detected and mapped to NCR, ED, ET, healthy brain; the four channels
    equal the segmentation's regions (healthy brain = brain and unlabelled) inside the window."""
    cases, why = find_cases(roots[labels, layout])
    assert [c.labels for c in cases] == [labels, labels] and f"labels {labels}" in why
    assert ("per-modality" if layout.endswith("modality") else "per-subject") in why
    case = cases[0]
    assert [p.name.split("_")[-1].split("-")[-1].split(".")[0] for p in case.modalities] == (
        ["t1n", "t1c", "t2w", "t2f"] if labels == "brats2023" else list(brats.MODALITIES))
    image, mask = case.load("brats-tiny", 4, WINDOW)
    assert image.shape == mask.shape == (4, *WINDOW)
    assert image.min() == -1 and image.max() <= 1 and set(mask.unique().tolist()) == {-1.0, 1.0}
    seg = _canonical(case.mask).astype(int)
    _, label_map, window = prepare(case, WINDOW)
    code = {v: k for k, v in brats.LABELS[labels].items()}
    for channel, region in enumerate((NCR, ED, ET)):
        expect = window.take(seg == code[region], False)
        assert torch.equal(mask[channel] > 0, torch.from_numpy(expect)), (labels, region)
    brain = window.take(_canonical(case.modalities[0]) > 0, False)
    healthy = window.take(seg == code[HEALTHY], False) if labels == "reference" else brain & (label_map != NCR) & (
        label_map != ED) & (label_map != ET)
    assert torch.equal(mask[3] > 0, torch.from_numpy(healthy))
    assert (mask > 0).sum(0).max() == 1  # the channels never overlap


def test_the_same_subject_reads_the_same_in_every_convention(roots):
    """The demo writes one set of tumours per seed: every convention and layout gives one tensor."""
    loaded = [find_cases(root)[0][0].load("brats-tiny", 4, WINDOW) for root in roots.values()]
    for image, mask in loaded[1:]:
        assert torch.equal(image, loaded[0][0]) and torch.equal(mask, loaded[0][1])


def test_detect_labels_rules():
    assert detect_labels({"a": {0: 9, 1: 1, 3: 2, 4: 50}})[0] == "reference"
    assert detect_labels({"a": {0: 9, 1: 1, 3: 2}, "b": {0: 9}})[0] == "brats2023"
    assert detect_labels({"a": {0: 9, 1: 5, 2: 5, 4: 3}})[0] == "brats2021"
    # the reference's healthy brain without an ET label: label 4 dwarfs the tumour
    assert detect_labels({"a": {0: 9, 1: 5, 2: 5, 4: 300}})[0] == "reference"
    rule, why = detect_labels({"a": {0: 9, 1: 5, 2: 5}})
    assert rule == "brats2021" and "alike" in why
    with pytest.raises(InputError, match="mix label 3"):
        detect_labels({"a": {0: 9, 3: 2}, "b": {0: 9, 4: 2}})


def test_labels_given_override_detection_and_unknown_labels_are_refused(roots):
    root = roots["brats2021", "brats"]
    assert find_cases(root, "brats2021")[1].endswith("(given by --labels)")
    with pytest.raises(InputError, match=r"unknown label values \[4\]; brats2023 labels are \[0, 1, 2, 3\]"):
        find_cases(root, "brats2023")


def test_crop_window_centres_the_brain_shifts_inside_and_pads_evenly():
    brain = np.zeros((40, 30, 10), bool)
    brain[2:12, 10:20, 3:7] = True
    w = crop_window(brain, (16, 20, 14))
    # I: centre 7 - 8 = -1 → shifted inside to 0; J: centre 15 - 10 = 5; K: shorter than the window → (10 - 14) // 2
    assert w.start == (0, 5, -2) and w.full == (40, 30, 10)
    brain[30:38, 10:20, 3:7] = True  # a bounding box from 2 to 38: centred at 20
    assert crop_window(brain, (16, 20, 14)).start[0] == 12
    vol = np.arange(40 * 30 * 10, dtype=np.float32).reshape(40, 30, 10)
    taken = w.take(vol, -1.0)
    assert taken.shape == (16, 20, 14) and (taken[:, :, :2] == -1).all() and (taken[:, :, 12:] == -1).all()
    back = w.put(taken, -1.0)
    inside = np.zeros_like(vol, bool)
    inside[0:16, 5:25, :] = True
    assert np.array_equal(back[inside], vol[inside]) and (back[~inside] == -1).all()
    with pytest.raises(InputError, match="no brain"):
        crop_window(np.zeros((4, 4, 4), bool), (2, 2, 2))


@pytest.mark.parametrize("one_file", [False, True])
def test_a_sample_goes_back_into_the_segmentations_space(roots, tmp_path, one_file):
    """Writing a case's own preprocessed images back gives files on the segmentation's grid and
    affine whose voxels are the input's, scaled to [-1, 1], inside the window and -1 outside it."""
    case = find_cases(roots["brats2023", "brats"])[0][0]
    image, _, window = prepare(case, WINDOW)
    target = brats.targets(tmp_path, case.subject, one_file)
    brats.write_case(image, window, case.mask, target)
    seg = nib.load(str(case.mask))
    files = [target] if one_file else [target / f"{case.subject}_{m}.nii.gz" for m in brats.MODALITIES]
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]
    written = [nib.load(str(f)) for f in files]
    arrays = [w.get_fdata() for w in written]
    arrays = list(np.moveaxis(arrays[0], 3, 0)) if one_file else arrays
    for w in written:
        assert np.allclose(w.affine, seg.affine)
    inside = window.put(np.ones(window.shape, bool), False)  # canonical
    for arr, source in zip(arrays, case.modalities):
        src = nib.load(str(source))
        assert arr.shape == seg.shape
        orig = src.get_fdata()
        scaled = (orig - orig.min()) / (orig.max() - orig.min()) * 2 - 1
        canon = nib.as_closest_canonical(nib.Nifti1Image(arr, seg.affine)).get_fdata()
        scaled_canon = nib.as_closest_canonical(nib.Nifti1Image(scaled, src.affine)).get_fdata()
        np.testing.assert_allclose(canon[inside], scaled_canon[inside], atol=1e-5)
        assert (canon[~inside] == -1).all()


def test_demo_refuses_a_folder_that_holds_files(roots, capsys):
    code = main(["demo-data", "--layout", "brats", "--out", str(roots["brats2021", "brats"]), "--n", "1"])
    assert code == 2 and "already holds files" in capsys.readouterr().err
    code = main(["demo-data", "--labels", "brats2023", "--out", "x", "--n", "1"])
    assert code == 2 and "--labels applies to --layout brats" in capsys.readouterr().err


def _break(root, how):
    subject = sorted(p for p in root.iterdir() if p.is_dir())[0]
    files = {p.name.split("_")[-1].split(".")[0]: p for p in subject.iterdir()}
    if how == "missing modality":
        files["t2"].unlink()
        return "lacks t2"
    if how == "no seg":
        files["seg"].unlink()
        return "lacks seg"
    if how == "shapes disagree":
        img = nib.load(str(files["flair"]))
        nib.save(nib.Nifti1Image(img.get_fdata()[:-2], img.affine), str(files["flair"]))
        return "differ in voxel grid"
    if how == "unknown labels":
        img = nib.load(str(files["seg"]))
        arr = np.asanyarray(img.dataobj).copy()
        arr[0, 0, 0] = 7
        nib.save(nib.Nifti1Image(arr, img.affine), str(files["seg"]))
        return "unknown label values [7]"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["missing modality", "no seg", "shapes disagree", "unknown labels"])
def test_bad_roots_give_one_line_exit_2_and_write_nothing(roots, tmp_path, capsys, how):
    root = copy(roots["brats2021", "brats"], tmp_path)
    needle = _break(root, how)
    out = tmp_path / "run"
    code = main(["train", "--data", str(root), "--model", "brats-tiny", "--steps", "1", "--out", str(out), "--quiet",
                 "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0], err
    assert not out.exists()


def test_train_refuses_mixed_or_misplaced_inputs(roots, capsys, tmp_path):
    root = str(roots["brats2021", "brats"])
    cases = [(["--data", root, "--model", "tiny"], "--data reads a BraTS root"),
             (["--data", root, "--model", "brats-tiny", "--images", root], "not both"),
             (["--model", "tiny"], "give --images and --masks"),
             (["--data", str(tmp_path), "--model", "brats-tiny"], "is not a BraTS root")]
    for argv, needle in cases:
        code = main(["train", *argv, "--steps", "1", "--out", str(tmp_path / "run"), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and needle in err, (argv, err)
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def brats_checkpoint(roots, tmp_path_factory):
    """One brats-tiny checkpoint trained a step on a BraTS root through the CLI."""
    run = tmp_path_factory.mktemp("brats-run")
    assert main(["train", "--data", str(roots["brats2023", "brats-per-modality"]), "--model", "brats-tiny",
                 "--steps", "1", "--out", str(run), "--quiet", "--device", "cpu"]) == 0
    return run / "checkpoint.pt"


def test_train_records_the_data_and_sample_writes_each_subject(roots, brats_checkpoint, tmp_path, capsys):
    ckpt = torch.load(brats_checkpoint, map_location="cpu", weights_only=False)
    assert "per-modality layout; labels brats2023" in ckpt["config"]["source"]
    assert ckpt["config"]["size"] == list(WINDOW)
    out = tmp_path / "samples"
    argv = ["sample", "--checkpoint", str(brats_checkpoint), "--masks", str(roots["brats2021", "brats"]), "--out",
            str(out), "--sampler", "dpm2m-sde", "--steps", "2", "--quiet", "--device", "cpu"]
    capsys.readouterr()
    assert main(argv) == 0
    assert "masks: 2 subjects, per-subject layout; labels brats2021 (label 4 present: 4 = ET)" in capsys.readouterr().err
    subjects = sorted(p.name for p in out.iterdir())
    assert subjects == ["BraTS2021_00000", "BraTS2021_00001"]
    seg = nib.load(str(roots["brats2021", "brats"] / subjects[0] / f"{subjects[0]}_seg.nii.gz"))
    for m in brats.MODALITIES:
        img = nib.load(str(out / subjects[0] / f"{subjects[0]}_{m}.nii.gz"))
        assert img.shape == seg.shape and np.allclose(img.affine, seg.affine)
    capsys.readouterr()
    assert main(argv) == 2  # the targets exist: refused, nothing replaced
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds" in err[0]
    assert main([*argv[:5], "--out", str(tmp_path / "one"), "--sampler", "dpm2m-sde", "--steps", "2", "--quiet", "--device", "cpu",
                 "--one-file"]) == 0
    assert nib.load(str(tmp_path / "one" / "BraTS2021_00000.nii.gz")).shape == (*seg.shape, 4)


def test_sampling_from_segmentations_alone(roots, brats_checkpoint, tmp_path, capsys):
    """The reference's segmentations hold the healthy brain: they sample without modalities;
    BraTS 2021's do not, and are refused."""
    for labels, ok in (("reference", True), ("brats2021", False)):
        root = copy(roots[labels, "brats-per-modality"], tmp_path)
        for m in brats.MODALITIES:
            shutil.rmtree(root / m)
        out = tmp_path / f"out-{labels}"
        code = main(["sample", "--checkpoint", str(brats_checkpoint), "--masks", str(root), "--out", str(out),
                     "--sampler", "dpm2m-sde", "--steps", "2", "--quiet", "--device", "cpu"])
        err = capsys.readouterr().err
        assert (code == 0) == ok, err
        assert ok or ("hold no healthy brain" in err and not out.exists())


def test_native_size_is_ijk_with_the_reference_flops():
    """brats's window is 192 × 192 × 144 in (I, J, K), the reference's depth-first 144 × 192 × 192
    transposed: the same FLOPs (test_model checks those against the reference)."""
    from medddpm.net.summary import summarize

    cfg = MODEL_PRESETS["brats"]
    assert cfg.native_size == (192, 192, 144)
    assert summarize(cfg, (192, 192, 144))["forward_flops"] == summarize(cfg, (144, 192, 192))["forward_flops"]
