"""The paper's reported numbers (``data/paper/``) and how our GPUs map onto its V100/A100/H100."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd


def repo_root(start: str | Path | None = None) -> Path:
    """The folder holding ``data/results`` and ``data/paper``, searched upward from ``start`` (cwd)."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "data" / "paper").is_dir():
            return folder
    raise FileNotFoundError(f"no data/paper folder above {here}; run from inside the medddpm repository")


def paper_dir(root: str | Path | None = None) -> Path:
    return repo_root(root) / "data" / "paper"


def results_dir(path: str | Path | None = None) -> Path:
    """``path`` if given, else ``<repo>/data/results``."""
    return Path(path) if path else repo_root() / "data" / "results"


def values(root: str | Path | None = None, **filters: str) -> pd.DataFrame:
    """Rows of ``values.csv``, filtered by column=value (e.g. ``figure='Fig 10'``, ``gpu='H100'``)."""
    df = pd.read_csv(paper_dir(root) / "values.csv")
    for col, val in filters.items():
        df = df[df[col].isin(val if isinstance(val, (list, tuple, set)) else [val])]
    return df.reset_index(drop=True)


def table(name: str, root: str | Path | None = None) -> pd.DataFrame:
    """``table1``, ``table2`` or ``hyperparameters`` as printed in the paper."""
    return pd.read_csv(paper_dir(root) / f"{name}.csv", dtype=str)


def label(row: pd.Series) -> str:
    """A row of ``values`` as the paper states it: '~78', '>70', '~73–80', '0.42'."""
    q = "" if row.get("qualifier") in ("=", None) or pd.isna(row.get("qualifier")) else row["qualifier"]
    high = row.get("value_high")
    return f"{q}{row['value']:g}" + (f"–{high:g}" if pd.notna(high) else "")


PAPER_SUFFIX = " (paper)"  # a plotted series of the paper's values: '<GPU> (paper)'


def as_series(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``values`` as a plotted series beside ours: ``series`` '<GPU> (paper)' and ``label``."""
    return rows.assign(series=rows["gpu"] + PAPER_SUFFIX, label=rows.apply(label, axis=1) if len(rows) else [])


def is_paper(series: str) -> bool:
    return series.endswith(PAPER_SUFFIX)


def paper_gpu(slug: str) -> str | None:
    """The paper's GPU our results folder corresponds to ('h100-80gb-hbm3' → 'H100'), if any."""
    m = re.match(r"^(v100|a100|h100)", slug.lower())
    return m.group(1).upper() if m else None
