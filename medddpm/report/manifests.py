"""Run manifests (``run.json``) of a results store: what kind of measurement a run folder holds, when, on what GPU
and code, the arms it compares and what it supersedes. The report layer finds runs by asking for the newest of a
kind on a GPU, so no dated folder name lives in the code."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

MANIFEST = "run.json"
REQUIRED = ("kind", "date", "gpu", "machine", "commits", "changed", "kept")  # what every manifest says


def read(folder: str | Path) -> dict[str, Any]:
    """A run folder's manifest, checked for the fields every manifest carries."""
    path = Path(folder) / MANIFEST
    manifest = json.loads(path.read_text())
    missing = [k for k in REQUIRED if k not in manifest]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}")
    return manifest


def every(root: str | Path) -> Iterator[tuple[str, Path, dict[str, Any]]]:
    """(GPU folder, run folder, manifest) of every manifest under ``root`` (``<gpu>/…/run.json``)."""
    root = Path(root)
    for path in sorted(root.glob(f"*/**/{MANIFEST}")) if root.is_dir() else []:
        yield path.relative_to(root).parts[0], path.parent, read(path.parent)


def runs(root: str | Path, kind: str, gpus: list[str] | None = None) -> list[tuple[str, Path, dict[str, Any]]]:
    """The runs of ``kind`` on ``gpus`` (every GPU folder: None), newest first; a run another supersedes is left out."""
    found = [r for r in every(root) if r[2]["kind"] == kind and (gpus is None or r[0] in gpus)]
    superseded = {(g, m["supersedes"]) for g, _, m in found if m.get("supersedes")}
    kept = [r for r in found if (r[0], r[1].name) not in superseded]
    return sorted(kept, key=lambda r: (r[2]["date"], r[1].name), reverse=True)
