"""Data in: NIfTI image/mask pairs and the offline demo sets (``nifti``), BraTS roots as distributed
(``brats``), and the input pipeline that feeds the training loop (``pipeline``). The names of
``nifti`` are re-exported here, where ``medddpm.data`` held them before."""
from .nifti import (  # noqa: F401
    AFFINE_TOLERANCE, MASK_LABELS, NIFTI_SUFFIXES, ROLE_TOKENS, Pair, VolumeDataset, canonical, check_same_space,
    list_nifti, load_mask_tensor, load_nifti, one_hot, pair_files, phantom, read_image, read_labels, resize,
    save_like, squeeze_singleton, strip_nifti_suffix, subject_id, to_file_space, unit_range, write_like_mask, write_mni_demo, write_phantoms,
)
