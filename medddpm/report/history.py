"""A chapter's history (issue 76): every change it measured, oldest first, out of the chapter's main line. Each GPU
folder's ``<chapter folder>/history.json`` holds its rows: the date, the change, what it measured (before → after,
where it was an A/B) and its run folder. A row is written once, when its run is judged, by the reader of that day
(``frozen_by`` names it and its commit), so a superseded experiment needs no reader of its own in the package."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.io import write_text_atomic
from .present import gpu_name

FILE = "history.json"
COLUMNS = ["date", "GPU", "change", "measured (before → after, where an A/B)", "run"]
FIELDS = ("date", "change", "measured", "run")  # what every row of a history.json holds


def rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of one ``history.json``, checked for the fields every row holds; none where there is no file."""
    path = Path(path)
    if not path.is_file():
        return []
    found = json.loads(path.read_text())["rows"]
    bad = [i for i, r in enumerate(found) if set(FIELDS) - set(r)]
    if bad:
        raise ValueError(f"{path}: rows {bad} lack one of {', '.join(FIELDS)}")
    return found


def folders(root: str | Path) -> list[str]:
    """The store's GPU or machine folders with a ``history.json`` of their own (the multi-GPU machines' runs)."""
    return sorted(p.name for p in Path(root).glob("*") if (p / FILE).is_file())


def table(root: str | Path, gpus: list[str], folder: str, chapter: str | None = None) -> pd.DataFrame:
    """The history of chapter folder ``folder`` on ``gpus``: every GPU's rows, oldest first (a row without a date,
    the chapter's first measurements, first of its GPU's); with ``chapter``, only the rows of that chapter (a folder
    that several chapters read names each row's)."""
    out = [{"date": r["date"], "GPU": gpu_name(g), "change": r["change"], COLUMNS[3]: r["measured"], "run": r["run"],
            "order": i} for g in dict.fromkeys(gpus) for i, r in enumerate(rows(Path(root) / g / folder / FILE))
           if chapter is None or r.get("chapter") == chapter]
    df = pd.DataFrame(out, columns=[*COLUMNS, "order"])
    return df.sort_values(["date", "GPU", "order"], kind="stable").drop(columns="order").reset_index(drop=True)


def append(path: str | Path, row: dict[str, Any], frozen_by: str) -> None:
    """Add one row (``FIELDS``, and its ``chapter`` where given) to a ``history.json``, written atomically;
    ``frozen_by`` names the reader and commit that computed its ``measured``."""
    if set(FIELDS) - set(row):
        raise ValueError(f"a history row needs {', '.join(FIELDS)}; got {', '.join(row)}")
    path = Path(path)
    old = json.loads(path.read_text()) if path.is_file() else {"rows": []}
    old["rows"].append({**{k: row[k] for k in (*FIELDS, "chapter") if k in row}, "frozen_by": frozen_by})
    write_text_atomic(path, json.dumps(old, indent=1, ensure_ascii=False) + "\n")
