"""Executing the book's notebooks: jupytext sources (notebooks/*.py) → papermill → executed
.ipynb chapters in book/chapters/, with the parameter cells hidden from the rendered book."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.io import atomic_path


def glue(name: str, value: Any, display: bool = False) -> None:
    """myst-nb's glue where it is installed (the book quotes these values in prose), else a no-op.
    Returns nothing, so that a glue call ending a figure's cell adds no output to the figure."""
    try:
        from myst_nb import glue as _glue
    except ImportError:  # e.g. a GPU machine running papermill without the book extras
        return
    _glue(name, value, display=display)


def glue_facts(facts: dict[str, str]) -> None:
    """Glue every fact of a chapter (``report.chapters.CHAPTERS``) under its name, for the prose."""
    for name, value in facts.items():
        glue(name, value)


def execute(source: str | Path, target: str | Path, parameters: dict[str, Any] | None = None,
            cwd: str | Path | None = None, kernel: str = "python3") -> Path:
    """Run one jupytext notebook with papermill and write the executed .ipynb atomically."""
    import jupytext
    import nbformat
    import papermill as pm

    import tempfile

    source, target = Path(source).resolve(), Path(target)
    nb = jupytext.read(source)
    with tempfile.TemporaryDirectory() as tmp, atomic_path(target, ".ipynb") as tmp_out:
        tmp_in = Path(tmp) / source.with_suffix(".ipynb").name
        nbformat.write(nb, tmp_in)
        pm.execute_notebook(str(tmp_in), str(tmp_out), parameters=parameters or {}, kernel_name=kernel,
                            cwd=str(cwd or source.parent), progress_bar=False)
        executed = nbformat.read(tmp_out, as_version=4)
        for cell in executed.cells:  # parameter cells are for papermill, not for readers
            tags = cell.metadata.setdefault("tags", [])
            if {"parameters", "injected-parameters"} & set(tags) and "remove-cell" not in tags:
                tags.append("remove-cell")
        nbformat.write(executed, tmp_out)
    return target


def main(argv: list[str] | None = None) -> int:
    """python -m medddpm.report.notebook [--src notebooks] [--out book/chapters] [-p name value]…"""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m medddpm.report.notebook")
    p.add_argument("--src", default="notebooks")
    p.add_argument("--out", default="book/chapters")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="papermill parameter (VALUE parsed as JSON when it can be)")
    a = p.parse_args(argv)
    params = {}
    for name, value in a.parameter:
        try:
            params[name] = json.loads(value)
        except json.JSONDecodeError:
            params[name] = value
    sources = sorted(Path(a.src).glob("[0-9]*.py"))
    if not sources:
        print(f"no notebooks (NN_*.py) in {a.src}")
        return 2
    for s in sources:
        print(f"executing {s} → {Path(a.out) / (s.stem + '.ipynb')}", flush=True)
        execute(s, Path(a.out) / f"{s.stem}.ipynb", params)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
