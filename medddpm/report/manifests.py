"""Run manifests (``run.json``) of a results store: what kind of measurement a run folder holds, when, on what GPU
and code, the arms it compares and what it supersedes. The report layer finds runs by asking for the newest of a
kind on a GPU, so no dated folder name lives in the code."""
from __future__ import annotations

import json
import re
import sys
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


def flag(flags: str, name: str, default: str | None = None) -> str | None:
    """The value after ``name`` (``--seed``) in an arm's flags, ``default`` where it is not given."""
    found = re.search(rf"(?<!\S){re.escape(name)} (\S+)", flags)
    return found[1] if found else default


def seed(flags: str) -> int:
    """The ``--seed`` of an arm's flags, ``train``'s default where it is not given."""
    from ..core.config import TrainConfig

    return int(flag(flags, "--seed", str(TrainConfig().seed)))


def global_batch(spec: dict) -> int:
    """The volumes a step of a manifest's arm: ``--nproc`` × ``--batch`` × ``--grad-accum`` of its flags, ``train``'s
    defaults where one is not given."""
    from ..core.config import TrainConfig

    d, f = TrainConfig(), spec.get("flags", "")
    return (int(flag(f, "--nproc", "1")) * int(flag(f, "--batch", str(d.batch_size)))
            * int(flag(f, "--grad-accum", str(d.grad_accum))))


def stage_seconds(run: Path, start: str, end: str) -> float:
    """Seconds between two stamps of a pipeline's ``logs/times.txt`` (``<stage> <epoch seconds>`` lines; ``end``
    matched as a prefix, so ``train128-rc`` finds ``train128-rc0``), NaN where either is missing."""
    path = run / "logs" / "times.txt"
    stamps = dict(line.split() for line in path.read_text().splitlines() if line.strip()) if path.exists() else {}
    t0, t1 = stamps.get(start), next((v for k, v in stamps.items() if k.startswith(end)), None)
    return float(t1) - float(t0) if t0 and t1 else float("nan")


DATED = re.compile(r"^(?P<name>.+)-(?P<date>20\d\d-\d\d-\d\d)$")  # a run kept apart: content, then date
PLATEAU = "recipe-plateau"  # a run to its plateau at the paper's size (scripts/probes/plateau128.sh, curriculum128.sh)
KINDS = {  # the kind of measurement a dated run folder holds, by its content name (the chapters' vocabulary)
    "sample-rows": ("default-rows", "default-rows-adam", "after-cut", "v-default-chain", "ddpm-default",
                    "ddpm-default-two-gpu-host",
                    "warmup-every-config", "beside-training", "beside-training-ddpm-default", "ddpm-v-default"),
    "sample-ab": ("own-gpu-ranks", "fused-residual", "small-job", "small-job-precompile", "process-pool-tried",
                  "triton-key-h200-host", "triton-keys", "start-up-tried", "start-up-cut", "sample-overlap"),
    "train-clock": ("train-clock", "train-eval-cut"),
    "kernel-profile": ("eager-kernels",),
    "ddp-scaling": ("ddp", "second-host", "reduce-bf16", "sync-flat-bf16", "buckets", "scaling-b3", "scaling-b3-accum",
                    "clocks"),
    "gpu-book": ("gpu-book",),
    "recipe-ab": ("ab-64", "patch-128", "batch-64", "muon-64", "muon2-64", "muon3-64", "muon-128", "judge-128",
                  "patch2-128"),
    "recipe-plateau": ("plateau-128", "default-128", "batch4-128", "readme-128", "readme2-128", "ddp2-128", "ddp2s22-128",
                       "ddp2b4-128", "default2-128"),
    "recipe-probe": ("curriculum-128",),
    "gpu-tests": ("gpu-tests", "gpu-tests-data"),
}
SUPERSEDING = {"sample-rows": ("after-cut", "default-rows", "default-rows-adam")}  # a kind's current rows: each newer
# run of these names supersedes the one before it on the same GPU


def kind_of(name: str) -> str:
    """The kind of a dated run folder's content name (``KINDS``)."""
    for kind, names in KINDS.items():
        if name in names:
            return kind
    raise ValueError(f"no kind for run {name!r}: add it to medddpm.report.manifests.KINDS")


def _provenance(folder: Path) -> dict[str, Any]:
    """The provenance entry of a run folder: its own provenance.json, else its key in a parent's."""
    own = folder / "provenance.json"
    if own.exists():
        return json.loads(own.read_text())
    for parent in folder.parents:
        p = parent / "provenance.json"
        if p.exists():
            entry = json.loads(p.read_text()).get(str(folder.relative_to(parent)))
            if entry:
                return entry
        if parent.name == "results":
            break
    return {}


def fill(root: str | Path) -> list[Path]:
    """Write a manifest into every dated run folder under ``root`` that has none, from its provenance (what ran,
    when, on what machine and code, the device's reply); returns the folders written."""
    root, written = Path(root), []
    for folder in sorted(p for p in root.glob("*/**/*") if p.is_dir() and DATED.match(p.name)):
        if (folder / MANIFEST).exists():
            continue
        m = DATED.match(folder.name)
        prov = _provenance(folder)
        gpu_dir = folder.relative_to(root).parts[0]
        info = root / gpu_dir / "info.json"
        gpu = prov.get("gpu") or (json.loads(info.read_text()).get("gpu") if info.exists() else gpu_dir)
        manifest = {
            "kind": kind_of(m["name"]), "name": m["name"], "date": m["date"], "gpu": gpu,
            "machine": prov.get("measured") or prov.get("machine") or prov.get("device") or "not recorded",
            "commits": prov.get("code") or prov.get("commit") or "not recorded",
            "changed": prov.get("what") or prov.get("changed") or prov.get("script") or m["name"],
            "supersedes": None,
            "kept": sorted(p.name for p in folder.iterdir()),
            **({"device_reply": prov["device_reply"]} if "device_reply" in prov else {}),
        }
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str) + "\n")
        written.append(folder)
    for kind, names in SUPERSEDING.items():  # link each GPU's runs of these names, oldest to newest
        for gpu_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            chain = sorted((m["date"], path) for g, path, m in every(root)
                           if g == gpu_dir.name and m["kind"] == kind and m.get("name") in names)
            for (_, older), (_, newer) in zip(chain, chain[1:]):
                m = read(newer)
                if m.get("supersedes") != older.name:
                    (newer / MANIFEST).write_text(json.dumps({**m, "supersedes": older.name}, indent=1) + "\n")
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "fill":
        print("usage: python -m medddpm.report.manifests fill RESULTS_DIR", file=sys.stderr)
        return 2
    for folder in fill(args[1]):
        print(f"wrote {folder / MANIFEST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
