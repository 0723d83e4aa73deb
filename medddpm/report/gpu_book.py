"""``make gpu-book``: the book's measurements on this machine's GPU, then every chapter rendered.

Each stage is the ``measure=True`` path of the chapter that owns it (``measure.STAGES``), run with
papermill exactly as a researcher would run that notebook; the other chapters only render what
the store then holds. With ``--no-render`` (no papermill on the machine) the stages are called
through the package instead, and ``make render`` draws the chapters later.

    python -m medddpm.report.gpu_book [--stages end_to_end,ncu,ladder,sampling] [--dry-run]

Progress goes to stdout with each stage's expected and actual minutes; ``gpu_book.csv`` in the
GPU's folder keeps the timings. ncu steps are skipped with one line when ncu is missing or may not
read the GPU's counters.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..core.config import ALL_CONFIGS
from ..core.errors import InputError, MedddpmError
from ..core.io import append_rows


@dataclass(frozen=True)
class Stage:
    """One kind of measurement: the chapter whose ``measure=True`` runs it, its default
    configurations and the minutes it takes a configuration on an H100 at 128³ (measured)."""

    chapter: str  # notebooks/<chapter>.py owns the stage
    configs: str  # default --configs
    minutes_per_config: float  # H100, 128³, an eager configuration: the basis of the expected time shown
    compiled_minutes: float | None = None  # H100, 128³, a torch.compile configuration (None: as eager)


# Minutes measured by `make gpu-book` on an H100 at 128³ (the newest gpu-book run in data/results/h100-80gb-hbm3/).
STAGES = {
    "end_to_end": Stage("01_setup", ALL_CONFIGS, 0.3),  # bench + torch.profiler: 1.36 min for the paper's 5
    "ncu": Stage("03_characterization", "baseline,opt1", 5.2),  # paper mode ~4 min + step mode ~1 min: 5.32, 5.02
    "ladder": Stage("06_beyond", "baseline,opt1,bf16,bf16-compile,bf16-graphs,fast", 0.15,
                    compiled_minutes=1.5),  # eager: 0.45 min for 3; compiled (Inductor's compile): 4.39 for 3
    "sampling": Stage("10_sampling", "opt1,bf16-graphs,fast-w16-p8,fast-w16-tnorm-tconv-fold-up", 0.75),  # DDIM 50 + DDPM 250: 2.95 for 4
}
TIMINGS = "gpu_book.csv"  # in the GPU's results folder
LOG = "gpu_book.log"  # the progress lines, beside it
COLUMNS = ["started", "stage", "chapter", "configs", "expected_min", "minutes", "status"]


def expected_minutes(stage: str, configs: str) -> float:
    """The stage's expected minutes on an H100 at 128³: its per-configuration estimate, compiled
    configurations at the compiled one."""
    from ..core.config import run_config

    st = STAGES[stage]
    names = [c for c in configs.split(",") if c]
    compiled = st.compiled_minutes is not None
    return sum(st.compiled_minutes if compiled and run_config(c, training=stage != "sampling").compile
               else st.minutes_per_config for c in names)


def ncu_ready() -> str | None:
    """None when ncu can profile here, else the one-line reason it cannot (missing, or no
    permission to read the GPU's performance counters)."""
    from ..profiling.ncu import CLOCK, ProfilerError, check_output, find_ncu

    try:
        ncu = find_ncu()
        probe = [ncu, *CLOCK, "--metrics", "sm__cycles_elapsed.max", sys.executable, "-c",
                 "import torch; (torch.ones(8, device='cuda') + 1).sum().item()"]
        p = subprocess.run(probe, capture_output=True, text=True, timeout=180)
        check_output(p.stdout + p.stderr, p.returncode)
    except (ProfilerError, subprocess.TimeoutExpired, OSError) as exc:
        return str(exc).splitlines()[0]
    return None


class _Say:
    """Progress lines to stdout and, once the GPU's folder is known, appended to its log."""

    def __init__(self) -> None:
        self.log: Path | None = None
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            with self.log.open("a") as f:
                f.write("".join(f"{ln}\n" for ln in self.lines))
            self.lines = []


def _papermill(chapter: str, out: Path, params: dict) -> None:
    from .notebook import execute

    src = Path(__file__).resolve().parents[2] / "notebooks" / f"{chapter}.py"
    execute(src, out / f"{chapter}.ipynb", params, cwd=src.parent)


def run(stages: list[str], configs: dict[str, str], size: int, results: Path, out: Path, render: bool,
        dry_run: bool = False) -> int:
    """Measure ``stages`` (with ``configs`` per stage) into ``results``, then render every chapter
    into ``out``; returns the exit code (1 if a stage failed; the others still ran)."""
    from . import measure

    say = _Say()
    folder = None if dry_run else measure.local_gpu_folder(results)  # no GPU: one error before anything
    plan = [(s, configs.get(s) or STAGES[s].configs) for s in stages]
    total = sum(expected_minutes(s, c) for s, c in plan)
    say(f"gpu-book: {len(plan)} stage(s), expected about {total:.0f} min on an H100 at {size}³ "
          f"(the goal: 30 min or less), then the chapters rendered")
    for i, (s, c) in enumerate(plan, 1):
        say(f"  [{i}/{len(plan)}] {s:<10} ({STAGES[s].chapter}): {c}  ~{expected_minutes(s, c):.0f} min")
    if dry_run:
        return 0
    say.log = folder / LOG
    say(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(sys.argv)}")
    failed = 0
    t0 = time.monotonic()
    for i, (s, c) in enumerate(plan, 1):
        started, status = time.strftime("%Y-%m-%dT%H:%M:%S"), "done"
        say(f"[{i}/{len(plan)}] {s}: measuring {c} (expected ~{expected_minutes(s, c):.0f} min; "
            f"{(time.monotonic() - t0) / 60:.1f} min so far)")
        t = time.monotonic()
        reason = ncu_ready() if s == "ncu" else None
        if reason:
            status = "skipped"
            say(f"[{i}/{len(plan)}] ncu: skipped — {reason}")
        else:
            try:
                if render:
                    _papermill(STAGES[s].chapter, out, {"measure": True, "results_dir": str(results), "size": size,
                                                        "configs": c})
                else:
                    measure.STAGES[s](results, size, c)
            except Exception as exc:  # noqa: BLE001 — one failed stage must not lose the others
                failed, status = 1, "failed"
                last = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)  # the message's last line
                say(f"[{i}/{len(plan)}] {s}: failed — {last}")
        minutes = (time.monotonic() - t) / 60
        append_rows(folder / TIMINGS, [{"started": started, "stage": s, "chapter": STAGES[s].chapter, "configs": c,
                                        "expected_min": round(expected_minutes(s, c), 1), "minutes": round(minutes, 2),
                                        "status": status}], COLUMNS, "gpu_book")
        say(f"[{i}/{len(plan)}] {s}: {status} in {minutes:.1f} min")
    if render:
        owned = {STAGES[s].chapter for s, _ in plan}
        chapters = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9]*.py"))
        for ch in [c for c in chapters if c not in owned]:
            say(f"rendering {ch} …")
            _papermill(ch, out, {"results_dir": str(results)})
        say(f"chapters in {out}; `make book` builds the book with this GPU in it")
    else:
        say("chapters not rendered here (--no-render): `make render` or `make book` draws them")
    say(f"gpu-book: {(time.monotonic() - t0) / 60:.1f} min in all; timings in {folder / TIMINGS}")
    return failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m medddpm.report.gpu_book", description=__doc__.splitlines()[0])
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of: {', '.join(STAGES)}")
    for s, st in STAGES.items():
        p.add_argument(f"--{s.replace('_', '-')}-configs", dest=f"{s}_configs", help=f"configurations of {s} "
                       f"(default {st.configs})")
    p.add_argument("--size", type=int, default=128, help="volume side (the paper: 128)")
    p.add_argument("--results", default="data/results", help="results store (the GPU's folder is made in it)")
    p.add_argument("--out", default="build/gpu-book", help="executed chapters (.ipynb)")
    p.add_argument("--no-render", action="store_true", help="measure through the package, without papermill")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the expected time only")
    a = p.parse_args(argv)
    stages = [s.strip() for s in a.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        print(f"gpu-book: error: unknown stage(s) {unknown}; choose from {', '.join(STAGES)}", file=sys.stderr)
        return 2
    configs = {s: getattr(a, f"{s}_configs") for s in STAGES if getattr(a, f"{s}_configs")}
    try:
        from ..core.config import run_config

        for s, c in configs.items():
            for name in c.split(","):
                run_config(name, training=s != "sampling")
        if not a.no_render and not a.dry_run:
            import papermill  # noqa: F401
        return run(stages, configs, a.size, Path(a.results), Path(a.out), render=not a.no_render, dry_run=a.dry_run)
    except ImportError as exc:
        print(f"gpu-book: error: {exc.name} is not installed: `make setup-book`, or pass --no-render", file=sys.stderr)
        return 2
    except (InputError, ValueError, MedddpmError) as exc:
        print(f"gpu-book: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
