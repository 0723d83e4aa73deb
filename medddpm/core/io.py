"""Small file helpers: atomic writes so a crash never leaves a half-written result."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .errors import InputError


_UMASK = os.umask(0)  # the process's umask, read once (setting it back at once): mkstemp's files are -rw------- whatever
os.umask(_UMASK)  # it says, and a lab's shared folder could not read a checkpoint or a sample


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (a dot-file, which no input listing reads); on success it gets the
    permissions the umask gives a new file and is renamed onto ``path``.

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
        if tmp_path.exists():
            os.chmod(tmp_path, 0o666 & ~_UMASK)  # as open() would have created it
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def append_rows(path: str | Path, rows: list[dict[str, Any]], columns: list[str],
                what: str = "bench") -> None:
    """Append rows to ``path`` (created with a header if new); written atomically. A table
    written before ``columns`` gained new columns is rewritten with them (its rows left blank
    there); any other header is refused."""
    path = Path(path)
    old = ""
    if path.exists():
        old = path.read_text()
        header = old.splitlines()[0].split(",") if old.strip() else []
        if header and header != columns:
            if not set(header) < set(columns):
                raise InputError(f"{path} has columns {header}, not the {what} columns; choose another --out")
            old = _with_columns(old, columns)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    if not old.strip():
        writer.writeheader()
    writer.writerows(rows)
    if old and not old.endswith("\n"):
        old += "\n"
    write_text_atomic(path, old + buf.getvalue())


def _with_columns(text: str, columns: list[str]) -> str:
    """A CSV text rewritten with ``columns`` (a superset of its own), new cells blank."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(csv.DictReader(io.StringIO(text)))
    return buf.getvalue()


def append_csv(path: str | os.PathLike, df, provenance: dict | None = None) -> None:
    """``append_rows`` for a DataFrame (its columns are the table's); with ``provenance``, write it
    beside the table as ``<name>.env.json``."""
    path = Path(path)
    append_rows(path, df.to_dict("records"), list(df.columns), path.stem)
    if provenance is not None:
        write_text_atomic(path.with_suffix(".env.json"), json.dumps(provenance, indent=2, default=str))
