"""Small file helpers: atomic writes so a crash never leaves a half-written result."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed onto ``path``.

    ``suffix`` keeps extensions that writers sniff (``.nii.gz``). On error the temporary file is
    removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + suffix, dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def append_csv(path: str | os.PathLike, df, provenance: dict | None = None) -> None:
    """Append ``df``'s rows to the CSV at ``path`` (created when missing) atomically, with ``\\n``
    line endings; with ``provenance``, write it beside the table as ``<name>.env.json``."""
    import json

    import pandas as pd

    path = Path(path)
    if path.exists():
        df = pd.concat([pd.read_csv(path), df], ignore_index=True)
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False, lineterminator="\n")
    if provenance is not None:
        write_text_atomic(path.with_suffix(".env.json"), json.dumps(provenance, indent=2, default=str))
