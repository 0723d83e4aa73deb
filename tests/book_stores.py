"""Results stores that hold a subset of the committed one, for executing the book's chapters on
them (tests/test_book_stores.py, tests/test_facts.py): what a reader's or a GPU owner's store may
look like."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "data" / "results"
UNKNOWN = ("l40s", "NVIDIA L40S")  # a GPU the book has never seen: (folder, name)
GLUE_REF = re.compile(r"\{glue:text\}`([^`]+)`")


def referenced(source: Path) -> set[str]:
    """Glue names a chapter's markdown and figure captions quote."""
    return set(GLUE_REF.findall(source.read_text()))


def _link(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(src, dst)


def measured_only(dst: Path, source: str = "h100-80gb-hbm3", gpu: tuple[str, str] = UNKNOWN) -> Path:
    """What ``make gpu-measure`` leaves for a GPU unknown to the book: info.json, nvidia-smi.csv,
    bench.csv and the torch.profiler tables of the paper's configurations (those of ``source``
    relabelled), and nothing else — no ncu report, fast path, sampling, quality or scaling."""
    slug, name = gpu
    src, out = COMMITTED / source, dst / slug
    out.mkdir(parents=True)
    info = json.loads((src / "info.json").read_text())
    (out / "info.json").write_text(json.dumps({**info, "gpu": name, "gpu_slug": slug}, indent=2))
    smi = pd.read_csv(src / "nvidia-smi.csv", skipinitialspace=True)
    smi.assign(name=name).to_csv(out / "nvidia-smi.csv", index=False)
    bench = pd.read_csv(src / "bench.csv")
    bench[bench["config"].isin(["baseline", "opt1", "opt2", "opt12", "pytorch-default"])].assign(gpu=name).to_csv(
        out / "bench.csv", index=False)
    for cfg in ("baseline", "opt1", "opt2", "opt12", "pytorch-default"):
        (out / cfg).mkdir()
        for f in sorted((src / cfg).glob("torch_*")):
            shutil.copy(f, out / cfg / f.name)
    return dst


def subset(dst: Path, folders: list[str]) -> Path:
    """A store holding only ``folders`` of the committed one (linked, not copied)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in folders:
        _link(COMMITTED / f, dst / f)
    return dst


STORES = {  # name → builder(tmp folder) → store root
    "h200-only": lambda d: subset(d, ["h200"]),
    "h100-only": lambda d: subset(d, ["h100-80gb-hbm3"]),
    "unknown-gpu-measured-only": lambda d: measured_only(d),
    "empty": lambda d: (d.mkdir(parents=True, exist_ok=True), d)[1],
}
