"""Chapter 06's facts on how `fast`'s ranks reduce their gradients (issue 49): one flat bf16 all-reduce
after the backward against three fp32 buckets overlapped with it (``fast-b3``), measured on one machine
in one call (``<machine>/<run>/sync.csv``), their losses step by step, and where the buckets' time went,
from every rank's kernels summed by name (``<machine>/<run>/profiles/k-*.csv``,
``python -m medddpm.profiling.scaling profile --kernels``)."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from .fast_tables import run_files
from .wording import missing

SYNC_KEYS = ("sync_run", "sync_rows", "sync_gain", "sync_loss")
KERNEL_KEYS = ("kernel_run", "seg_launches", "seg_kernel_ms", "beside_ms", "flat_nccl_ms")
# k-<config>-<N>[-nocomm]-rank<r>.csv: one rank's kernels summed by name
_KERNELS = re.compile(r"k-(?P<config>.+?)-(?P<n>\d+)(?P<nocomm>-nocomm)?-rank(?P<rank>\d+)\.csv")


def _newest(root: Path, name: str) -> Path | None:
    """The folder of the newest ``name`` (``fast_tables.run_files``)."""
    found = run_files(root, name)
    return found[-1].parent if found else None


def loss_gap(a: Path, b: Path) -> str | None:
    """How far two runs' losses (``log.csv`` files: step, loss) lie apart over their common steps, as a
    clause; None where either file is missing."""
    if not (a.is_file() and b.is_file()):
        return None
    m = pd.read_csv(a)[["step", "loss"]].merge(pd.read_csv(b)[["step", "loss"]], on="step", suffixes=("_a", "_b"))
    rel = ((m["loss_b"] - m["loss_a"]).abs() / m["loss_a"]).max()
    return f"differ by at most {100 * rel:.2f} % over their {len(m)} common steps"


def by_world_size(rows: pd.DataFrame, digits: int) -> str:
    """"1 GPU: `fast` 52.97 ms; 2 GPUs: `fast` 54.37 ms (97.4 %), …" of scaling rows (several configurations
    a world size, in the rows' order), step times to ``digits`` decimals."""
    return "; ".join(
        f"{n} GPU{'s' if n > 1 else ''}: " + ", ".join(
            f"`{r['config']}` {r['step_ms_median']:.{digits}f} ms" + (f" ({100 * r['scaling_efficiency']:.1f} %)" if n > 1 else "")
            for _, r in g.iterrows()) for n, g in rows.groupby("world_size"))


def sync_facts(root: Path) -> dict[str, str]:
    """`fast` and `fast-b3` of the newest ``sync.csv``: step times and efficiencies per world size, what
    `fast` saves (or costs) a step at each world size both ran, and their losses at the largest."""
    folder = _newest(root, "sync.csv")
    if folder is None:
        return {k: missing("a sync.csv (fast and fast-b3 in one call)") for k in SYNC_KEYS}
    s = pd.read_csv(folder / "sync.csv")
    s = s[s["grad_accum"] == 1].sort_values(["world_size", "config"])
    f = {"sync_run": f"`{folder.relative_to(root).as_posix()}/`"}
    f["sync_rows"] = by_world_size(s, 2)
    ms = s[s["world_size"] > 1].pivot_table(index="world_size", columns="config", values="step_ms_median")
    both = ms.dropna(subset=["fast", "fast-b3"]) if {"fast", "fast-b3"} <= set(ms.columns) else ms.iloc[:0]
    f["sync_gain"] = ("; ".join(f"{'saves' if b3 > fast else 'costs'} {abs(b3 - fast):.2f} ms a step at {n} GPUs"
                                for n, fast, b3 in zip(both.index, both["fast"], both["fast-b3"]))
                      if len(both) else missing("fast and fast-b3 at one world size"))
    n = int(both.index.max()) if len(both) else None
    gap = loss_gap(folder / f"log-fast-b3-{n}.csv", folder / f"log-fast-{n}.csv") if n else None
    f["sync_loss"] = f"at {n} GPUs {gap}" if gap else missing("the loss logs of fast and fast-b3")
    return f


def _kernel_tables(folder: Path) -> dict[tuple[str, int, bool], list[pd.DataFrame]]:
    """(config, ranks, no-op all-reduce) → each rank's kernel sums in ``folder``."""
    out: dict[tuple[str, int, bool], list[pd.DataFrame]] = {}
    for p in sorted(folder.glob("k-*.csv")):
        if m := _KERNELS.fullmatch(p.name):
            out.setdefault((m["config"], int(m["n"]), bool(m["nocomm"])), []).append(pd.read_csv(p))
    return out


def _per_rank(tables: list[pd.DataFrame], nccl: bool | None = None) -> list[float]:
    """Each rank's kernel ms per step: every kernel, NCCL's alone (``nccl`` True) or all but NCCL's (False)."""
    out = []
    for t in tables:
        is_nccl = t["name"].str.contains("nccl", case=False)
        pick = t if nccl is None else t[is_nccl] if nccl else t[~is_nccl]
        out.append(float(pick["us_per_step"].sum()) / 1e3)
    return out


def kernel_facts(root: Path) -> dict[str, str]:
    """Where three buckets' time went on two ranks (the newest ``profiles/`` folder): the launches and
    kernel ms a step the 2-rank code path adds with no byte moved (no-op all-reduces against one
    process), how much slower the other kernels run beside NCCL's (real against no-op all-reduces,
    rank by rank), and NCCL's kernel ms a step of the one fp32 all-reduce after the backward."""
    folder = _newest(root, "profiles")
    k = _kernel_tables(folder / "profiles") if folder is not None else {}
    one, noop, real = k.get(("fast", 1, False)), k.get(("fast-b3", 2, True)), k.get(("fast-b3", 2, False))
    if not (one and noop and real):
        return {key: missing("kernel sums of fast on one process and fast-b3 on 2 ranks, real and no-op "
                             "(scaling profile --kernels)") for key in KERNEL_KEYS}
    fmt = lambda vs: " / ".join(f"{v:+.2f}" for v in vs)  # noqa: E731
    base_launches, base_ms = float(one[0]["launches_per_step"].sum()), _per_rank(one)[0]
    f = {"kernel_run": f"`{folder.relative_to(root).as_posix()}/profiles/`",
         "seg_launches": " / ".join(f"{float(t['launches_per_step'].sum()) - base_launches:+.0f}" for t in noop),
         "seg_kernel_ms": fmt([v - base_ms for v in _per_rank(noop)]),
         "beside_ms": fmt([a - b for a, b in zip(_per_rank(real, nccl=False), _per_rank(noop))])}
    flat = k.get(("fast-flat", 2, False))
    f["flat_nccl_ms"] = " / ".join(f"{v:.2f}" for v in _per_rank(flat, nccl=True)) if flat \
        else missing("kernel sums of fast-flat on 2 ranks")
    return f
