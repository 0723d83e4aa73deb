"""NIfTI data for Med-DDPM: pairing by subject ID, loading, scaling, one-hot masks, writing
samples back in the mask's space, and two offline data sets (phantoms and MNI152 demos).

Conventions
-----------
* Volumes are reoriented to canonical RAS (``nibabel.as_closest_canonical``) and become tensors of
  shape (C, I, J, K) in that voxel order; ``size`` is (I, J, K).
* Images are scaled per volume to [-1, 1] (``DataConfig.intensity``: min-max as the reference, or
  between two percentiles); masks are integer label maps read from ``dataobj``, mapped onto the
  preset's labels where ``DataConfig.mask_labels`` says so (``labels``), one-hot encoded per preset
  (``MASK_LABELS``) and scaled to {-1, 1}, as the reference does.
* Resizing is trilinear for images and nearest-neighbour for label maps (``resample``).
* Reading a file needs no PyTorch: the functions that return tensors or resize (``Pair.load``,
  ``load_mask_tensor``, ``like_mask``, ``write_mni_demo``) import it when called, so the report layer
  reads NIfTI files and sample measures without it.
"""
from __future__ import annotations

import gzip

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import nibabel as nib
import numpy as np

from ..core.config import DataConfig
from ..core.errors import InputError
from ..core.io import atomic_path
from .labels import MASK_LABELS, LabelMap, parse

if TYPE_CHECKING:
    import torch

NIFTI_SUFFIXES = (".nii.gz", ".nii")

# Tokens that name a file's role rather than its subject; dropped when deriving subject IDs.
ROLE_TOKENS = frozenset(
    "img image images t1 t1w t1ce t2 t2w flair seg segmentation mask masks msk label labels lbl".split()
)


def strip_nifti_suffix(name: str) -> str:
    for suffix in NIFTI_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def subject_id(path: Path, id_regex: str | None = None) -> str:
    """Subject ID of a file: ``id_regex``'s first group, else the name minus role tokens.

    ``sub-03_T1w.nii.gz`` and ``sub-03_seg.nii.gz`` → ``sub_03``; ``img_007.nii`` and
    ``msk_007.nii`` → ``007``.
    """
    stem = strip_nifti_suffix(path.name)
    if id_regex is not None:
        match = re.search(id_regex, stem)
        if not match:
            raise InputError(f"--id-regex {id_regex!r} does not match file name {path.name!r}")
        return match.group(1) if match.groups() else match.group(0)
    tokens = [t for t in re.split(r"[_\-.\s]+", stem) if t]
    kept = [t for t in tokens if t.lower() not in ROLE_TOKENS]
    return "_".join(kept or tokens)


def list_nifti(folder: str | Path, what: str) -> list[Path]:
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{what} folder {str(folder)!r} does not exist or is not a folder")
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name.lower().endswith(NIFTI_SUFFIXES)
                   and not p.name.startswith("."))  # dot-files: hidden, and a writer's unfinished temporary files
    if not files:
        raise InputError(f"{what} folder {str(folder)!r} holds no .nii or .nii.gz files")
    return files


def _by_id(files: list[Path], what: str, id_regex: str | None) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for f in files:
        sid = subject_id(f, id_regex)
        if sid in out:
            raise InputError(f"{what}: {out[sid].name} and {f.name} share the subject ID {sid!r}")
        out[sid] = f
    return out


@dataclass(frozen=True)
class Pair:
    """One subject's image file (4-D for several modalities) and its label-map mask."""

    subject: str
    image: Path
    mask: Path

    def load(self, preset: str, channels: int, size: Sequence[int],
             data: DataConfig = DataConfig()) -> tuple[torch.Tensor, torch.Tensor]:
        """(image (C, *size) in [-1, 1], one-hot mask (M, *size)), after checking one grid."""
        from .resample import resized

        check_same_space(self.image, self.mask)
        image = resized(read_image(self.image, channels, data), size, "trilinear")
        return image, load_mask_tensor(self.mask, preset, size, data.mask_labels)


def pair_files(images: str | Path, masks: str | Path, id_regex: str | None = None) -> list[Pair]:
    """Pair image and mask files by subject ID; every unmatched file is reported in one error."""
    imgs = _by_id(list_nifti(images, "images"), "images", id_regex)
    msks = _by_id(list_nifti(masks, "masks"), "masks", id_regex)
    lonely = [f"image {imgs[s].name}" for s in sorted(set(imgs) - set(msks))]
    lonely += [f"mask {msks[s].name}" for s in sorted(set(msks) - set(imgs))]
    if lonely:
        raise InputError("unmatched files (no partner with the same subject ID): " + ", ".join(lonely))
    return [Pair(s, imgs[s], msks[s]) for s in sorted(imgs)]


def load_nifti(path: Path) -> nib.Nifti1Image:
    try:
        img = nib.load(str(path))
        img.header.get_data_shape()
    except Exception as exc:  # nibabel raises many types for broken files
        raise InputError(f"cannot read NIfTI file {path}: {exc}") from None
    return img


def canonical(img: nib.Nifti1Image) -> nib.Nifti1Image:
    return nib.as_closest_canonical(img)


def squeeze_singleton(arr: np.ndarray) -> np.ndarray:
    """Drop a 4th axis of length 1, common in real exports ((I, J, K, 1) → (I, J, K)); real 4-D
    data, and every other shape, pass through unchanged for the callers to judge."""
    return arr[..., 0] if arr.ndim == 4 and arr.shape[3] == 1 else arr


def _check_volume(arr: np.ndarray, path: Path, channels: int) -> np.ndarray:
    """Return (C, I, J, K): 3-D for one channel, 4-D with the last axis = channels otherwise."""
    if channels == 1:
        arr = squeeze_singleton(arr)
    if arr.ndim == 3 and channels == 1:
        return arr[None]
    if arr.ndim == 4 and channels > 1 and arr.shape[3] == channels:
        return np.moveaxis(arr, 3, 0)
    want = "a 3-D volume" if channels == 1 else f"a 4-D volume with {channels} modalities on its last axis"
    raise InputError(f"{path.name}: expected {want}, got shape {arr.shape}")


def read_image(path: Path, channels: int = 1, data: DataConfig = DataConfig()) -> np.ndarray:
    """Canonical image as float32 (C, I, J, K), each channel scaled to [-1, 1] (``data.intensity``)."""
    try:
        arr = np.asarray(canonical(load_nifti(path)).get_fdata(dtype=np.float32))
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"cannot read image data of {path}: {exc}") from None
    arr = _check_volume(arr, path, channels)
    if not np.isfinite(arr).all():
        raise InputError(f"{path.name}: image holds NaN or infinite values")
    if data.intensity == "percentile":
        return percentile_range(arr, path.name, data.percentiles)
    return unit_range(arr, path.name, axis=(1, 2, 3))


def unit_range(arr: np.ndarray, name: str, axis: tuple[int, ...] | None = None) -> np.ndarray:
    """``arr`` min-max scaled to [-1, 1] as float32, over ``axis`` (all of it by default: one
    volume; (1, 2, 3): each channel of a (C, I, J, K) stack); a constant volume is refused."""
    lo = arr.min(axis=axis, keepdims=True)
    hi = arr.max(axis=axis, keepdims=True)
    if np.any(hi <= lo):
        raise InputError(f"{name}: image is constant; cannot scale it to [-1, 1]")
    return ((arr - lo) / (hi - lo) * 2 - 1).astype(np.float32)


def percentile_range(arr: np.ndarray, name: str, percentiles: tuple[float, float]) -> np.ndarray:
    """Each channel of (C, I, J, K) mapped from its [low, high] percentiles to [-1, 1] and clipped
    there: one bright voxel (a vessel, an artefact) no longer sets the whole volume's scale."""
    flat = arr.reshape(arr.shape[0], -1)
    lo, hi = (np.percentile(flat, percentiles, axis=1).astype(np.float64)[:, :, None, None, None])
    if np.any(hi <= lo):
        raise InputError(f"{name}: the {percentiles[0]:g} and {percentiles[1]:g} percentiles are equal; "
                         "cannot scale it to [-1, 1] (use --intensity minmax or other --percentiles)")
    return np.clip((arr - lo) / (hi - lo) * 2 - 1, -1, 1).astype(np.float32)


LABEL_DTYPES = (np.uint8, np.int8, np.int16, np.int32, np.int64)  # stored label types read as they are (native order)


def read_labels(path: Path, labels: tuple[tuple[int, ...], ...], label_map: LabelMap | None = None) -> np.ndarray:
    """Canonical integer label map (I, J, K) read from ``dataobj``, as the preset's label values
    (``labels``): mapped by ``label_map`` (a parsed ``--mask-labels``) where given; a value the
    preset does not know, or the map leaves out, is an error."""
    try:
        raw = np.asanyarray(canonical(load_nifti(path)).dataobj)
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"cannot read label data of {path}: {exc}") from None
    raw = squeeze_singleton(raw)
    if raw.ndim != 3:
        raise InputError(f"{path.name}: expected a 3-D label map, got shape {raw.shape}")
    if not np.issubdtype(raw.dtype, np.integer):
        if not np.isfinite(raw).all() or np.any(raw != np.round(raw)):
            raise InputError(f"{path.name}: label map has non-integer values")
    # canonical() views the file's array transposed: one copy, in the stored integer type where torch has it (a uint8
    # mask stays uint8: an eighth of int64's bytes to copy and index), else int64
    lab = np.ascontiguousarray(raw, dtype=raw.dtype if raw.dtype in LABEL_DTYPES else np.int64)
    if label_map is not None:
        return label_map.apply(lab, path.name)
    known = {0, *(v for group in labels for v in group)}
    unknown = sorted(set(label_values(lab).tolist()) - known)
    if unknown:
        shown = str(unknown[:8])[:-1] + (", …]" if len(unknown) > 8 else "]")
        raise InputError(f"{path.name}: unknown label values {shown}; this model knows {sorted(known)} "
                         "(map a parcellation's labels with --mask-labels, e.g. brain=nonzero)")
    return lab


LOOKUP_LABELS = 1 << 16  # label values below this (and >= 0) are counted and one-hot encoded through tables


def _small(labels: np.ndarray) -> bool:
    return labels.size > 0 and labels.min() >= 0 and labels.max() < LOOKUP_LABELS


def label_values(labels: np.ndarray) -> np.ndarray:
    """The distinct values of an integer label map, ascending: counted (``np.bincount``) where they
    are small and non-negative, as a label map's are, else ``np.unique`` (which sorts every voxel:
    about 5× slower at 128³)."""
    return np.flatnonzero(np.bincount(labels.ravel())) if _small(labels) else np.unique(labels)


def one_hot(labels: np.ndarray, groups: tuple[tuple[int, ...], ...], dtype: type = np.float32) -> np.ndarray:
    """(I, J, K) integer labels → (len(groups), I, J, K) of ``dtype`` in {-1, 1}: 1 where a voxel's
    label is in the group. Small non-negative labels index a table of each group's ±1 (``np.take``,
    straight into the output); others go through ``np.isin``. ``load_mask_tensor`` of a 128³ phantom
    mask: 0.10 s with ``np.unique`` and ``np.isin``, 0.02 s with the tables (one core of a 2-core CPU),
    for each of the masks a ``sample`` reads before its first volume (which asks for int8)."""
    if not _small(labels):
        return np.stack([np.isin(labels, g) for g in groups]).astype(dtype) * 2 - 1
    table = np.full((len(groups), int(labels.max()) + 1), -1, dtype)
    for row, group in zip(table, groups):
        row[[v for v in group if 0 <= v < table.shape[1]]] = 1
    out = np.empty((len(groups), *labels.shape), dtype)
    for row, channel in zip(table, out):
        np.take(row, labels, out=channel)
    return out


def load_mask_tensor(path: Path, preset: str, size: Sequence[int] | None, mask_labels: str = "",
                     dtype: type = np.float32) -> torch.Tensor:
    """A mask file as the model's ±1 channels (``one_hot``) of ``dtype``, resized to ``size`` (nearest)."""
    import torch

    from .resample import resized

    label_map = parse(mask_labels, preset) if mask_labels else None
    labels = read_labels(path, MASK_LABELS[preset], label_map)[None]
    if size is not None:
        labels = resized(labels, size, "nearest").numpy()
    return torch.from_numpy(one_hot(labels[0], MASK_LABELS[preset], dtype))


# Largest difference between an image's and its mask's affine entries (mm, or mm per voxel) that
# still counts as the same voxel grid: far above float32 header round-off, far below a voxel.
AFFINE_TOLERANCE = 1e-3


def check_same_space(image: Path, mask: Path, tol: float = AFFINE_TOLERANCE) -> None:
    """Refuse an image/mask pair whose voxel grids differ (shape, or affine beyond ``tol``).

    Each file is reoriented to RAS on its own, so a pair stored with different affines over the
    same array (an LPS image with a RAS mask, say) would otherwise train with anatomy that no longer
    lines up. Reads headers only.
    """
    a, b = load_nifti(image), load_nifti(mask)
    shape_a, shape_b = tuple(a.shape[:3]), tuple(b.shape[:3])
    if shape_a != shape_b:
        raise InputError(f"{image.name} and its mask {mask.name} differ in voxel grid: "
                         f"image shape {shape_a}, mask shape {shape_b}")
    diff = float(np.abs(a.affine - b.affine).max())
    if not diff <= tol:
        axes_a, axes_b = "".join(nib.aff2axcodes(a.affine)), "".join(nib.aff2axcodes(b.affine))
        raise InputError(f"{image.name} and its mask {mask.name} are not in the same space: their affines "
                         f"differ by up to {diff:.4g} (tolerance {tol:g}); image axes {axes_a}, mask axes "
                         f"{axes_b}. Resample or re-save one of them onto the other's grid")


def to_file_space(volume: np.ndarray, like: nib.Nifti1Image) -> np.ndarray:
    """A (C, I, J, K) volume in canonical RAS order reoriented to ``like``'s own voxel order:
    (I, J, K) for one channel, (I, J, K, C) for several (NIfTI's 4-D layout)."""
    src = nib.orientations.io_orientation(canonical(like).affine)
    dst = nib.orientations.io_orientation(like.affine)
    transform = nib.orientations.ornt_transform(src, dst)
    arr = np.stack([nib.orientations.apply_orientation(c, transform) for c in volume])
    return arr[0] if arr.shape[0] == 1 else np.moveaxis(arr, 0, 3)


def like_mask(volume: np.ndarray, mask_path: Path) -> nib.Nifti1Image:
    """(C, I, J, K) canonical-space output as a float32 NIfTI image in the mask's own space.

    The volume is resampled to the mask's canonical shape if the model ran at another size, then
    reoriented from RAS back to the mask's orientation; affine and header come from the mask.
    """
    from .resample import resized

    mask_img = load_nifti(mask_path)
    canon_shape = canonical(mask_img).shape[:3]
    vol = resized(np.ascontiguousarray(volume, dtype=np.float32), canon_shape, "trilinear")
    return image_like(to_file_space(vol.numpy(), mask_img), mask_img)


def save_atomic(img: nib.Nifti1Image, path: str | Path) -> None:
    """``img`` written to ``path`` (``.nii.gz``: gzip as nibabel writes it, level 1, no time stamp) through a
    temporary dot-file without a NIfTI suffix, which no input listing reads, renamed into place when whole."""
    data = img.to_bytes()
    if str(path).endswith(".gz"):
        data = gzip.compress(data, compresslevel=1, mtime=0)
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_like_mask(volume: np.ndarray, mask_path: Path, out_path: Path) -> None:
    """``like_mask``, saved atomically to ``out_path``."""
    save_atomic(like_mask(volume, mask_path), out_path)


def image_like(arr: np.ndarray, like: nib.Nifti1Image) -> nib.Nifti1Image:
    """``arr`` (in ``like``'s voxel order) as a float32 NIfTI image with ``like``'s affine and
    header (its scaling reset)."""
    header = like.header.copy()
    header.set_data_dtype(np.float32)
    header["scl_slope"], header["scl_inter"] = 1.0, 0.0
    return nib.Nifti1Image(arr.astype(np.float32), like.affine, header)


def save_like(arr: np.ndarray, like: nib.Nifti1Image, path: Path) -> None:
    """``image_like``, saved atomically to ``path``."""
    save_atomic(image_like(arr, like), path)


# ---- offline data sets ------------------------------------------------------------------------

def _grid(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    axis = np.linspace(-1, 1, size, dtype=np.float32)
    return np.meshgrid(axis, axis, axis, indexing="ij")


def _ellipsoid(grid, center, radii) -> np.ndarray:
    x, y, z = grid
    return ((x - center[0]) / radii[0]) ** 2 + ((y - center[1]) / radii[1]) ** 2 + ((z - center[2]) / radii[2]) ** 2 <= 1


def _add_lesions(rng: np.random.Generator, grid, brain: np.ndarray, count: int) -> np.ndarray:
    """Random ellipsoidal lesions kept inside ``brain``."""
    lesion = np.zeros_like(brain)
    inside = np.argwhere(brain)
    size = brain.shape[0]
    for _ in range(count):
        c = inside[rng.integers(len(inside))] / (size - 1) * 2 - 1
        radii = rng.uniform(0.06, 0.16, size=3)
        lesion |= _ellipsoid(grid, c, radii) & brain
    return lesion


def phantom(size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One head-like phantom: (image float32, labels uint8) of shape (size,)*3.

    Nested ellipsoids for scalp, skull, CSF, grey and white matter with random shape jitter,
    noise and 1–3 lesions; labels 1 = brain (CSF + GM + WM), 2 = lesion.
    """
    g = _grid(size)
    j = lambda: rng.uniform(0.93, 1.07, size=3)  # noqa: E731 - per-subject shape jitter
    head = _ellipsoid(g, (0, 0, 0), np.array([0.85, 0.95, 0.85]) * j())
    skull = _ellipsoid(g, (0, 0, 0), np.array([0.78, 0.88, 0.78]) * j())
    brain = _ellipsoid(g, (0, 0.02, 0.05), np.array([0.70, 0.80, 0.68]) * j())
    grey = _ellipsoid(g, (0, 0.02, 0.05), np.array([0.62, 0.72, 0.60]) * j())
    white = _ellipsoid(g, (0, 0.02, 0.05), np.array([0.45, 0.55, 0.42]) * j())
    ventricles = _ellipsoid(g, (0, 0.05, 0.1), np.array([0.10, 0.22, 0.10]) * j())
    img = np.zeros((size,) * 3, np.float32)
    img[head] = 0.55  # scalp
    img[skull] = 0.12  # bone
    img[brain] = 0.25  # CSF
    img[grey] = 0.55
    img[white] = 0.80
    img[ventricles & brain] = 0.25
    lesion = _add_lesions(rng, g, brain, int(rng.integers(1, 4)))
    img[lesion] = rng.uniform(0.9, 1.0)
    img += rng.normal(0, 0.02, img.shape).astype(np.float32) * head
    labels = np.zeros((size,) * 3, np.uint8)
    labels[brain] = 1
    labels[lesion] = 2
    return img, labels


def _save_pair(out: Path, name: str, image: np.ndarray, labels: np.ndarray, affine: np.ndarray) -> None:
    save_atomic(nib.Nifti1Image(image.astype(np.float32), affine), out / "images" / f"{name}.nii.gz")
    save_atomic(nib.Nifti1Image(labels.astype(np.uint8), affine), out / "masks" / f"{name}.nii.gz")


def _check_out(out: Path, n: int, size: int, min_size: int = 8) -> None:
    if n < 1:
        raise InputError(f"--n must be >= 1, got {n}")
    if size < min_size:
        raise InputError(f"--size must be >= {min_size}, got {size}")
    for sub in ("images", "masks"):
        if (out / sub).exists() and any((out / sub).iterdir()):
            raise InputError(f"{out / sub} already holds files; choose an empty --out folder")


def write_phantoms(out: str | Path, n: int, size: int, seed: int = 0) -> list[str]:
    """Write ``n`` seeded phantoms to ``out/images`` and ``out/masks``; returns subject names."""
    out = Path(out)
    _check_out(out, n, size)
    rng = np.random.default_rng(seed)
    affine = np.diag([192.0 / size] * 3 + [1.0])  # ~19 cm field of view
    affine[:3, 3] = -96.0
    names = []
    for i in range(n):
        image, labels = phantom(size, rng)
        name = f"phantom_{i:03d}"
        _save_pair(out, name, image, labels, affine)
        names.append(name)
    return names


def cube_grid(shape: Sequence[int], size: int) -> tuple[list[tuple[int, int]], np.ndarray]:
    """The pads that centre a volume of ``shape`` in a cube, and the voxel transform from a
    ``size``³ grid over that cube to the volume's own voxels (its affine times this one is the
    grid's affine): grid voxel i sits at padded voxel (i + 0.5)·side/size − 0.5."""
    side = max(shape[:3])
    pads = [((side - s) // 2, side - s - (side - s) // 2) for s in shape[:3]]
    shift = np.eye(4)
    shift[:3, 3] = [-p[0] for p in pads]
    scale = side / size
    to_padded = np.diag([scale] * 3 + [1.0])
    to_padded[:3, 3] = 0.5 * scale - 0.5
    return pads, shift @ to_padded


def nilearn_datasets():
    """nilearn's ``datasets`` (its MNI152 templates, offline; a slow import, made only where needed), or one clear
    error where this Python lacks nilearn, a dependency of the package."""
    try:
        from nilearn import datasets
    except ImportError as exc:
        raise InputError(f"the MNI152 demo data needs nilearn, which this Python cannot import ({exc}); install it "
                         "(pip install nilearn), or write synthetic pairs with `medddpm phantom`") from None
    return datasets


def write_mni_demo(out: str | Path, n: int, size: int, seed: int = 0) -> list[str]:
    """Demo subjects from nilearn's MNI152 1 mm template (real anatomy, offline): the T1 and its
    brain mask resampled to a ``size``³ cube, with random lesions drawn inside the brain and
    shown as hyperintensities. Labels: 1 = brain, 2 = lesion."""
    from .resample import resized

    out = Path(out)
    _check_out(out, n, size)
    datasets = nilearn_datasets()

    t1 = datasets.load_mni152_template(resolution=1)
    brain = datasets.load_mni152_brain_mask(resolution=1)
    # pad to a cube (233 voxels), keep the template's affine consistent with the padding
    pads, to_voxels = cube_grid(t1.shape, size)
    t1_arr = np.pad(t1.get_fdata(dtype=np.float32), pads)
    br_arr = np.pad(np.asarray(brain.dataobj) > 0, pads)
    affine = t1.affine @ to_voxels
    t1_small = resized(t1_arr[None], (size,) * 3, "trilinear")[0].numpy()
    br_small = resized(br_arr.astype(np.uint8)[None], (size,) * 3, "nearest")[0].numpy() > 0
    rng = np.random.default_rng(seed)
    g = _grid(size)
    peak = float(np.percentile(t1_small[br_small], 99))
    names = []
    for i in range(n):
        lesion = _add_lesions(rng, g, br_small, int(rng.integers(1, 4)))
        image = t1_small.copy()
        image[lesion] = peak * rng.uniform(1.05, 1.2)
        image += rng.normal(0, 0.01 * peak, image.shape).astype(np.float32)
        labels = np.zeros(image.shape, np.uint8)
        labels[br_small] = 1
        labels[lesion] = 2
        name = f"mni_{i:03d}"
        _save_pair(out, name, image, labels, affine)
        names.append(name)
    return names
