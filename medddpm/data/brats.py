"""BraTS as it is distributed: the paper's second workload (Fig. 1: T1, T1ce, T2, FLAIR under a
tumour mask) read straight from a BraTS root, preprocessed as the reference Med-DDPM does, and
samples written back in each subject's own space.

Layouts (``find_cases`` tells them apart from the folder):

* **per-subject** (BraTS 2021 and 2023 as downloaded): ``ROOT/<subject>/<subject>_<role>.nii.gz``
  with roles ``t1, t1ce, t2, flair, seg``, or BraTS 2023's ``-t1n, -t1c, -t2w, -t2f, -seg``;
* **per-modality** (the reference repository's): ``ROOT/<role>/<subject>_<role>.nii.gz``.

The paper's Fig. 1 from a sampled BraTS run: ``sample.quality.brats_fig1_slices``.

Preprocessing (``BratsCase.load``), in canonical RAS voxel order like every volume of the package:

1. *brain* = voxels where any modality is above its background (its minimum; BraTS is skull
   stripped, background 0), together with every labelled voxel;
2. *crop or pad* each axis to the model's native window (192 × 192 × 144 for ``brats``): the
   window is centred on the brain's bounding box and shifted inside the volume where the volume is
   larger than the window; an axis shorter than the window is padded evenly on both sides with
   background (``crop_window``);
3. each modality scaled to [−1, 1] on its own (its minimum and maximum over the whole volume, so
   background and padding read −1);
4. labels mapped to the preset's four channels — necrotic core (NCR), oedema (ED), enhancing
   tumour (ET), healthy brain — by one of ``LABELS`` (``detect_labels`` picks it when not given),
   healthy brain = brain and unlabelled, unless the segmentation already holds it.

Samples go back through the same window: placed into the segmentation's full grid (−1 outside the
window), reoriented to its orientation and saved with its affine and header (``write_case``).
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import nibabel as nib
import numpy as np

from .labels import MASK_LABELS
from .nifti import (NIFTI_SUFFIXES, check_same_space, canonical, load_nifti, nilearn_datasets, one_hot,
                    save_like, squeeze_singleton, strip_nifti_suffix, to_file_space, unit_range)
from ..core.config import DataConfig
from ..core.errors import InputError

if TYPE_CHECKING:
    import torch


MODALITIES = ("t1", "t1ce", "t2", "flair")  # the image channels of the ``brats`` preset, in order
ROLES = (*MODALITIES, "seg")
# The names a role goes by: BraTS 2021 and the reference repository first, then BraTS 2023's.
ALIASES = {"t1": ("t1", "t1n"), "t1ce": ("t1ce", "t1c"), "t2": ("t2", "t2w"), "flair": ("flair", "t2f"),
           "seg": ("seg",)}
ROLE_OF = {name: role for role, names in ALIASES.items() for name in names}
BRATS_MODELS = frozenset(name for name, groups in MASK_LABELS.items() if groups == MASK_LABELS["brats"])

# The preset's label map (``MASK_LABELS['brats']``): 1 NCR, 2 ED, 3 ET, 5 healthy brain.
NCR, ED, ET, HEALTHY = 1, 2, 3, 5
# Segmentation label → the preset's label, per convention (``--labels``).
LABELS: dict[str, dict[int, int]] = {
    "brats2021": {1: NCR, 2: ED, 4: ET},  # BraTS 2021: 1 NCR, 2 ED, 4 ET; no healthy brain
    "brats2023": {1: NCR, 2: ED, 3: ET},  # BraTS 2023: ET is 3
    "reference": {1: NCR, 2: ED, 3: ET, 4: HEALTHY},  # the reference's files: 4 = healthy brain, added
}
# Label 4 is the reference's healthy brain, not BraTS 2021's ET, when it outnumbers labels 1 and 2
# together by this factor in every file that has it (a whole brain against a tumour's core).
HEALTHY_RATIO = 3.0


@dataclass(frozen=True)
class BratsCase:
    """One subject: its four modalities (``MODALITIES`` order; empty when only its segmentation is
    there, which sampling with ``reference`` labels allows) and its segmentation ``mask``."""

    subject: str
    modalities: tuple[Path, ...]
    mask: Path
    labels: str = "brats2021"  # a key of LABELS

    def load(self, preset: str, channels: int, size: Sequence[int],
             data: DataConfig = DataConfig()) -> tuple[torch.Tensor, torch.Tensor]:
        """(image (4, *size), one-hot mask (4, *size)): the module's preprocessing, then resized
        to ``size`` when it is not the preset's window. BraTS has its own scaling and labels:
        ``data`` must be the default."""
        if data != DataConfig():
            raise InputError("--intensity and --mask-labels apply to --images/--masks folders; a BraTS root "
                             "uses its own preprocessing and labels")
        if channels != len(MODALITIES) or not self.modalities:
            raise InputError(f"{self.subject}: training needs the {len(MODALITIES)} modalities {', '.join(MODALITIES)}")
        image, labels, _ = prepare(self, window_of(preset))
        from .resample import resized  # the network's tensors

        return resized(image, size, "trilinear"), encode(labels, size)


@dataclass(frozen=True)
class Window:
    """Where a model's window sits in a canonical volume: ``start`` per axis (negative = padding
    before the volume), the window's ``shape`` and the volume's ``full`` shape."""

    start: tuple[int, int, int]
    shape: tuple[int, int, int]
    full: tuple[int, int, int]

    def take(self, volume: np.ndarray, fill: float) -> np.ndarray:
        """The window of a (…, I, J, K) volume; voxels outside the volume are ``fill``."""
        out = np.full(volume.shape[:-3] + self.shape, fill, dtype=volume.dtype)
        src, dst = self._overlap()
        out[(...,) + dst] = volume[(...,) + src]
        return out

    def put(self, window: np.ndarray, fill: float) -> np.ndarray:
        """The inverse of ``take``: a (…, *shape) window placed into a ``fill``-ed full volume."""
        out = np.full(window.shape[:-3] + self.full, fill, dtype=window.dtype)
        src, dst = self._overlap()
        out[(...,) + src] = window[(...,) + dst]
        return out

    def _overlap(self) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
        src, dst = [], []
        for s, w, n in zip(self.start, self.shape, self.full):
            lo, hi = max(s, 0), min(s + w, n)
            src.append(slice(lo, hi))
            dst.append(slice(lo - s, hi - s))
        return tuple(src), tuple(dst)


def window_of(preset: str) -> tuple[int, int, int]:
    """The preset's native (I, J, K), the window its data is cropped or padded to."""
    from ..core.config import model_preset

    return model_preset(preset).native_size


def crop_window(brain: np.ndarray, shape: Sequence[int]) -> Window:
    """The ``shape`` window over the boolean (I, J, K) ``brain``: centred on the brain's bounding
    box, shifted inside the volume on an axis the volume is longer than the window, centred on the
    volume (even padding) on an axis it is shorter."""
    if not brain.any():
        raise InputError("no brain: every modality is constant background and nothing is labelled")
    start = []
    for axis, (w, n) in enumerate(zip(shape, brain.shape)):
        if n <= w:
            start.append((n - w) // 2)
            continue
        hits = np.flatnonzero(brain.any(axis=tuple(a for a in range(3) if a != axis)))
        centre = (int(hits[0]) + int(hits[-1]) + 1) // 2
        start.append(min(max(centre - w // 2, 0), n - w))
    return Window(tuple(start), tuple(int(s) for s in shape), tuple(brain.shape))  # type: ignore[arg-type]


# ---- finding the files ------------------------------------------------------------------------

def _role(stem: str) -> str | None:
    """The role a file's name ends in (``BraTS2021_00000_t1ce`` → t1ce, ``…-t2f`` → flair)."""
    last = re.split(r"[_\-.]", stem)[-1].lower()
    return ROLE_OF.get(last)


def _subject_of(stem: str) -> str:
    """A per-modality file's subject: its name minus the trailing role."""
    return re.sub(r"[_\-.][A-Za-z0-9]+$", "", stem) if _role(stem) else stem


def _nifti(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.lower().endswith(NIFTI_SUFFIXES))


def layout_of(root: str | Path) -> str:
    """``per-modality`` when ``root`` has a folder named for a role, ``per-subject`` when its
    folders hold NIfTI files; anything else is not a BraTS root."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"BraTS root {str(root)!r} does not exist or is not a folder")
    folders = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    if any(p.name.lower() in ROLE_OF for p in folders):
        return "per-modality"
    if any(_nifti(p) for p in folders):
        return "per-subject"
    raise InputError(f"{root} is not a BraTS root: expected ROOT/<subject>/<subject>_<t1|t1ce|t2|flair|seg>.nii.gz "
                     "or ROOT/<t1|t1ce|t2|flair|seg>/<subject>_<role>.nii.gz")


def is_brats_root(path: str | Path) -> bool:
    """True when ``path`` is a folder laid out as BraTS (``layout_of``)."""
    try:
        layout_of(path)
    except InputError:
        return False
    return True


def _files(root: Path, layout: str) -> dict[str, dict[str, Path]]:
    """subject → role → file, refusing a role given twice."""
    found: dict[str, dict[str, Path]] = {}

    def add(subject: str, role: str, path: Path) -> None:
        roles = found.setdefault(subject, {})
        if role in roles:
            raise InputError(f"subject {subject}: two {role} files, {roles[role].name} and {path.name}")
        roles[role] = path

    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if layout == "per-modality":
            role = ROLE_OF.get(folder.name.lower())
            for f in _nifti(folder) if role else []:
                add(_subject_of(strip_nifti_suffix(f.name)), role, f)
        else:
            for f in _nifti(folder):
                role = _role(strip_nifti_suffix(f.name))
                if role:
                    add(folder.name, role, f)
    return found


def find_cases(root: str | Path, labels: str = "auto", need_images: bool = True) -> tuple[list[BratsCase], str]:
    """Every subject of a BraTS root, checked (each file there, one grid per subject, known labels),
    and a sentence saying what was read and which label rule applies. ``need_images``: every subject
    needs its four modalities (training); without it (sampling) a segmentation suffices where the
    healthy brain is in it, and modalities that are there give the brain."""
    if labels != "auto" and labels not in LABELS:
        raise InputError(f"--labels must be auto or one of {', '.join(LABELS)}, got {labels!r}")
    root = Path(root)
    layout = layout_of(root)
    found = _files(root, layout)
    problems = []
    for subject, roles in sorted(found.items()):
        missing = [r for r in ROLES if r not in roles and (need_images or r == "seg")]
        partial = not need_images and "seg" in roles and 0 < sum(m in roles for m in MODALITIES) < len(MODALITIES)
        if missing:
            problems.append(f"{subject} lacks {', '.join(missing)}")
        elif partial:
            problems.append(f"{subject} has only some of {', '.join(MODALITIES)} (all or none)")
    if problems:
        raise InputError(f"{root} ({layout} layout): " + "; ".join(problems))
    if not found:
        raise InputError(f"{root} ({layout} layout) holds no subject files")
    for subject, roles in found.items():
        for role in MODALITIES:
            if role in roles:
                check_same_space(roles[role], roles["seg"])
    values = {s: _label_counts(roles["seg"]) for s, roles in found.items()}
    rule, why = detect_labels(values) if labels == "auto" else (labels, "given by --labels")
    known = {0, *LABELS[rule]}
    for s, counts in values.items():
        unknown = sorted(set(counts) - known)
        if unknown:
            raise InputError(f"{found[s]['seg'].name}: unknown label values {unknown}; {rule} labels are {sorted(known)}")
    cases = [BratsCase(s, tuple(roles[m] for m in MODALITIES if m in roles), roles["seg"], rule)
             for s, roles in sorted(found.items())]
    if rule != "reference" and any(not c.modalities for c in cases):
        raise InputError(f"{rule} segmentations hold no healthy brain, which is taken from the modalities; "
                         f"{', '.join(c.subject for c in cases if not c.modalities)} have none")
    return cases, f"{len(cases)} subjects, {layout} layout; labels {rule} ({why})"


def _label_counts(seg: Path) -> dict[int, int]:
    arr = read_volume(seg, "label")
    if not np.issubdtype(arr.dtype, np.integer) and np.any(arr != np.round(arr)):
        raise InputError(f"{seg.name}: label map has non-integer values")
    values, counts = np.unique(arr.astype(np.int64), return_counts=True)
    return dict(zip(values.tolist(), counts.tolist()))


def detect_labels(counts: dict[str, dict[int, int]]) -> tuple[str, str]:
    """(convention, the rule that chose it) from each subject's label counts: 3 and 4 in one file
    → ``reference``; 3 → ``brats2023``; 4 → ``brats2021``, unless label 4 outnumbers 1 and 2
    together ``HEALTHY_RATIO`` times in every file that has it (the reference's healthy brain)."""
    with3 = [s for s, c in counts.items() if 3 in c]
    with4 = [s for s, c in counts.items() if 4 in c]
    if any(3 in counts[s] for s in with4):
        return "reference", "labels 3 and 4 in one file: 3 = ET, 4 = healthy brain"
    if with3 and with4:
        raise InputError(f"segmentations mix label 3 ({with3[0]}) and label 4 ({with4[0]}) in different files; "
                         f"pass --labels {' or '.join(LABELS)}")
    if with3:
        return "brats2023", "label 3 present: 3 = ET"
    if with4:
        if all(c[4] > HEALTHY_RATIO * (c.get(1, 0) + c.get(2, 0)) for c in (counts[s] for s in with4)):
            return "reference", f"label 4 outnumbers labels 1 + 2 by more than {HEALTHY_RATIO:g}×: healthy brain"
        return "brats2021", "label 4 present: 4 = ET"
    return "brats2021", "no label 3 or 4: BraTS 2021 and 2023 read alike"


# ---- preprocessing ----------------------------------------------------------------------------

def read_volume(path: Path, what: str) -> np.ndarray:
    """A 3-D canonical array: floats for images (``what`` 'image'), the stored type for labels."""
    img = canonical(load_nifti(path))
    try:
        arr = img.get_fdata(dtype=np.float32) if what == "image" else np.asanyarray(img.dataobj)
    except Exception as exc:
        raise InputError(f"cannot read {what} data of {path}: {exc}") from None
    arr = squeeze_singleton(np.asarray(arr))
    if arr.ndim != 3:
        raise InputError(f"{path.name}: expected a 3-D {what} volume, got shape {arr.shape}")
    if what == "image" and not np.isfinite(arr).all():
        raise InputError(f"{path.name}: image holds NaN or infinite values")
    if what != "image" and not np.issubdtype(arr.dtype, np.integer) and not np.isfinite(arr).all():
        raise InputError(f"{path.name}: label map has non-integer values")
    return arr


def mapped_labels(seg: np.ndarray, rule: str, brain: np.ndarray | None) -> np.ndarray:
    """A segmentation in the preset's labels (``NCR ED ET HEALTHY``): ``rule``'s mapping, then
    healthy brain = ``brain`` and unlabelled where the rule holds none."""
    out = np.zeros(seg.shape, np.uint8)
    for src, dst in LABELS[rule].items():
        out[seg == src] = dst
    if HEALTHY not in LABELS[rule].values():
        if brain is None:
            raise InputError(f"{rule} labels hold no healthy brain and no modality gives it")
        out[brain & (out == 0)] = HEALTHY
    return out


def full_volumes(case: BratsCase) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """(images (4, I, J, K) in [−1, 1] or None without modalities, labels in the preset's values,
    brain) on the subject's whole canonical grid: steps 1, 3 and 4 of the module's preprocessing."""
    seg = read_volume(case.mask, "label").astype(np.int64)
    images = [read_volume(p, "image") for p in case.modalities]
    brain = np.zeros(seg.shape, bool)
    for p, arr in zip(case.modalities, images):
        if arr.shape != seg.shape:
            raise InputError(f"{p.name} has shape {arr.shape}, its segmentation {case.mask.name} {seg.shape}")
        brain |= arr > arr.min()
    labels = mapped_labels(seg, case.labels, brain if images else None)
    scaled = np.stack([unit_range(a, p.name) for p, a in zip(case.modalities, images)]) if images else None
    return scaled, labels, brain


def prepare(case: BratsCase, shape: Sequence[int]) -> tuple[np.ndarray | None, np.ndarray, Window]:
    """(images (4, *shape) in [−1, 1] or None without modalities, labels (*shape) in the preset's
    values, the window): the module's preprocessing of one subject."""
    images, labels, brain = full_volumes(case)
    window = crop_window(brain | (labels > 0), shape)
    return None if images is None else window.take(images, -1.0), window.take(labels, 0), window


def encode(labels: np.ndarray, size: Sequence[int]) -> torch.Tensor:
    """The preset's one-hot mask (4, *size) in {−1, 1} of a label map in its values."""
    import torch

    from .resample import resized

    lab = resized(labels.astype(np.int64)[None], size, "nearest")[0].numpy()
    return torch.from_numpy(one_hot(lab, MASK_LABELS["brats"]))


# ---- writing samples back ---------------------------------------------------------------------

def targets(out: str | Path, subject: str, one_file: bool) -> Path:
    """A subject's output: ``OUT/<subject>.nii.gz`` (one 4-D file) or the folder ``OUT/<subject>``."""
    return Path(out) / (f"{subject}.nii.gz" if one_file else subject)


def write_case(volume: np.ndarray, window: Window, seg: Path, target: Path) -> None:
    """A (4, *size) sample written in the segmentation's space: resized to the window, placed in
    the full grid (−1 outside it), reoriented; one 4-D file when ``target`` ends in ``.nii.gz``,
    else the folder ``target`` with ``<subject>_<modality>.nii.gz`` files, made whole or not at all."""
    from .resample import resized

    vol = resized(np.ascontiguousarray(volume, dtype=np.float32), window.shape, "trilinear")
    full = window.put(vol.numpy(), -1.0)
    seg_img = load_nifti(seg)
    if target.name.endswith(".nii.gz"):
        save_like(to_file_space(full, seg_img), seg_img, target)
        return
    if target.exists():
        raise InputError(f"{target} already exists")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        for modality, channel in zip(MODALITIES, full):
            save_like(to_file_space(channel[None], seg_img), seg_img, tmp / f"{target.name}_{modality}.nii.gz")
        os.rename(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


# ---- an offline BraTS-shaped set ----------------------------------------------------------------

BRATS_GRID = (240, 240, 155)  # BraTS's 1 mm grid (SRI24 space)
# Demo intensities per tissue and modality (arbitrary units; background 0, as BraTS is skull
# stripped): T1 shows white matter bright, T2 the fluid, FLAIR the oedema, T1ce the enhancing rim.
CONTRAST = {  # modality: (white matter, grey matter, CSF, NCR, ED, ET)
    "t1": (0.85, 0.55, 0.20, 0.25, 0.45, 0.60),
    "t1ce": (0.85, 0.55, 0.20, 0.20, 0.45, 1.00),
    "t2": (0.35, 0.55, 1.00, 0.90, 0.80, 0.60),
    "flair": (0.45, 0.60, 0.10, 0.50, 0.95, 0.75),
}
DEMO_NAMES = {"brats2021": "BraTS2021_{:05d}", "brats2023": "BraTS-GLI-{:05d}-000", "reference": "BraTS2021_{:05d}"}


@functools.lru_cache(maxsize=2)
def mni_on_brats_grid(shape: tuple[int, int, int]) -> dict[str, np.ndarray]:
    """nilearn's MNI152 grey, white matter and brain mask (offline), placed on BraTS's 1 mm grid
    (padded in I and J, cut to the brain's 155 axial slices) and resized to ``shape``."""
    from .resample import resized

    datasets = nilearn_datasets()
    maps = {"gm": datasets.load_mni152_gm_template(resolution=1), "wm": datasets.load_mni152_wm_template(resolution=1),
            "brain": datasets.load_mni152_brain_mask(resolution=1)}
    arrays = {k: canonical(v).get_fdata(dtype=np.float32) for k, v in maps.items()}
    brain_k = np.flatnonzero(arrays["brain"].any(axis=(0, 1)))
    k0 = max(0, min((brain_k[0] + brain_k[-1]) // 2 - BRATS_GRID[2] // 2, arrays["brain"].shape[2] - BRATS_GRID[2]))
    out = {}
    for k, arr in arrays.items():
        arr = arr[:, :, k0:k0 + BRATS_GRID[2]]
        pads = [((g - s) // 2, g - s - (g - s) // 2) for g, s in zip(BRATS_GRID[:2], arr.shape[:2])] + [(0, 0)]
        arr = np.pad(arr, pads)
        out[k] = resized(arr[None], shape, "trilinear")[0].numpy()
    return out


def _tumour(rng: np.random.Generator, brain: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(NCR, ED, ET) boolean maps of one random tumour inside ``brain``: an oedema ellipsoid around a
    tumour core whose rim enhances and whose centre is necrotic."""
    inside = np.argwhere(brain)
    centre = inside[rng.integers(len(inside))].astype(np.float32)
    radii = rng.uniform(0.12, 0.2, size=3) * np.array(brain.shape, np.float32)
    grid = np.stack(np.meshgrid(*[np.arange(n, dtype=np.float32) for n in brain.shape], indexing="ij"))
    r = np.sqrt((((grid - centre[:, None, None, None]) / radii[:, None, None, None]) ** 2).sum(0))
    ncr = (r <= 0.35) & brain
    et = (r <= 0.6) & brain & ~ncr
    ed = (r <= 1.0) & brain & ~ncr & ~et
    return ncr, ed, et


def write_brats_demo(out: str | Path, n: int, size: int, seed: int = 0, layout: str = "per-subject",
                     labels: str = "brats2021", tissue: dict[str, np.ndarray] | None = None) -> list[str]:
    """``n`` BraTS-shaped subjects from MNI152 tissue maps with a random tumour each: four contrasts
    (``CONTRAST``) and a segmentation in the ``labels`` convention, on BraTS's grid scaled by
    ``size``/240 (``size`` 240: the real 240 × 240 × 155), stored LPS like BraTS, in ``layout``. ``tissue``: the grey, white matter and brain maps on that
    grid (``mni_on_brats_grid``'s keys; by default made here, which needs nilearn)."""
    if layout not in ("per-subject", "per-modality"):
        raise InputError(f"layout must be per-subject or per-modality, got {layout!r}")
    if labels not in LABELS:
        raise InputError(f"--labels must be one of {', '.join(LABELS)}, got {labels!r}")
    if n < 1:
        raise InputError(f"--n must be >= 1, got {n}")
    if size < 16:
        raise InputError(f"--size must be >= 16 for a BraTS-shaped set, got {size}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out} already holds files; choose an empty --out folder")
    shape = tuple(max(1, round(g * size / BRATS_GRID[0])) for g in BRATS_GRID)
    tissue = mni_on_brats_grid(shape) if tissue is None else tissue  # type: ignore[arg-type]
    if tissue["brain"].shape != shape:
        raise InputError(f"tissue maps of shape {tissue['brain'].shape} for a demo grid of {shape}")
    brain = tissue["brain"] > 0.5
    wm, gm = tissue["wm"] * brain, tissue["gm"] * brain  # new arrays: the cached maps stay as they are
    csf = np.clip(1 - wm - gm, 0, 1) * brain
    mm = BRATS_GRID[0] / shape[0]
    affine = np.diag([-mm, -mm, mm, 1.0])  # LPS storage, as BraTS's files
    affine[:3, 3] = [mm * (shape[0] - 1) / 2, mm * (shape[1] - 1) / 2 + 18, -mm * (shape[2] - 1) / 2]
    code = {v: k for k, v in LABELS[labels].items()}  # preset label → this convention's
    rng = np.random.default_rng(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    names = []
    try:
        for i in range(n):
            ncr, ed, et = _tumour(rng, brain)
            name = DEMO_NAMES[labels].format(i)
            seg = np.zeros(shape, np.uint8)
            for region, label in ((ncr, NCR), (ed, ED), (et, ET)):
                seg[region] = code[label]
            if HEALTHY in code:
                seg[brain & (seg == 0)] = code[HEALTHY]
            volumes = {"seg": seg}
            for m, (w, g, c, t_ncr, t_ed, t_et) in CONTRAST.items():
                img = w * wm + g * gm + c * csf
                for region, value in ((ed, t_ed), (et, t_et), (ncr, t_ncr)):
                    img[region] = value
                img = img + rng.normal(0, 0.02, shape).astype(np.float32)
                volumes[m] = np.where(brain, np.clip(img, 0.01, None), 0).astype(np.float32)
            sep = "-" if labels == "brats2023" else "_"
            for role, arr in volumes.items():
                suffix = ALIASES[role][1] if labels == "brats2023" and role != "seg" else role
                folder = tmp / (name if layout == "per-subject" else role)
                folder.mkdir(parents=True, exist_ok=True)
                nib.save(nib.Nifti1Image(arr[::-1, ::-1].copy(), affine), str(folder / f"{name}{sep}{suffix}.nii.gz"))
            names.append(name)
        out.mkdir(parents=True, exist_ok=True)
        for child in tmp.iterdir():
            os.rename(child, out / child.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return names
