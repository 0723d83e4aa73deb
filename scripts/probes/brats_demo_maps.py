"""BraTS-shaped demo data on a machine without nilearn (the GPU machines): ``save`` the MNI152
tissue maps on BraTS's grid where nilearn is, carry the file, ``write`` the demo set there.

    python scripts/probes/brats_demo_maps.py save MAPS.npz [SIZE]
    python scripts/probes/brats_demo_maps.py write MAPS.npz OUT N [SIZE] [LABELS]
"""
import sys

import numpy as np

from medddpm.data import brats


def shape_of(size: int) -> tuple[int, int, int]:
    return tuple(max(1, round(g * size / brats.BRATS_GRID[0])) for g in brats.BRATS_GRID)


def main(argv: list[str]) -> None:
    what, path = argv[0], argv[1]
    if what == "save":
        size = int(argv[2]) if len(argv) > 2 else 240
        maps = brats.mni_on_brats_grid(shape_of(size))
        np.savez_compressed(path, **{k: np.round(np.clip(v, 0, 1) * 255).astype(np.uint8) for k, v in maps.items()})
        return
    out, n = argv[2], int(argv[3])
    size = int(argv[4]) if len(argv) > 4 else 240
    with np.load(path) as f:
        maps = {k: f[k].astype(np.float32) / 255 for k in f.files}
    names = brats.write_brats_demo(out, n, size, 0, "per-subject", argv[5] if len(argv) > 5 else "brats2021", tissue=maps)
    print(f"wrote {len(names)} subjects to {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
