"""How the book shows things to people: GPU names, tables and a colour for every category.

* ``gpu_name('l40s')`` → 'L40S': the name the results store records for the GPU folder
  (``info.json``'s ``gpu``, else ``bench.csv``'s ``gpu`` column; ``register_gpus``), shortened
  the same way for every GPU ('NVIDIA L40S' → 'L40S'); ``GPU_NAMES`` for folders with no record
  (multi-GPU machines, the paper's GPUs); a folder the book knows nothing of keeps its name.
* ``table(df)``: an HTML table with no index column, '—' for missing values, numbers rounded
  and grouped, in a box that scrolls sideways instead of being cut off at the page edge.
* ``color(name)``: one colour per category (kernel category, configuration, GPU, instruction
  class), the same in every figure, from the colour-blind-safe Okabe–Ito palette.
"""
from __future__ import annotations

import html
import numbers
from typing import Any, Mapping

import pandas as pd

from .paper import PAPER_SUFFIX

GPU_NAMES = {  # folders without a recorded name (a multi-GPU machine's: "<gpu>-x<N>" also works)
    "h200-x2": "2× H200",
}
MISSING = "—"
WRAP_CHARS = 24  # table cells with longer text may wrap onto several lines
# Column names as a reader sees them (units in the header); others are shown as they are.
HEADERS = {
    "gpu_slug": "GPU", "gpu": "GPU", "config": "configuration", "size": "volume", "batch": "batch",
    "step_ms_median": "step, ms (median)", "step_ms_min": "step, ms (min)", "step_ms_max": "step, ms (max)",
    "fwd_ms_median": "forward, ms (median)", "peak_mem_gib": "peak memory, GiB",
    "speedup_vs_baseline": "× baseline", "speedup_vs_previous": "× previous rung", "tflops": "TFLOP/s",
    "peak_fraction": "share of bf16 peak", "tf32_conv": "TF32 conv", "tf32_matmul": "TF32 matmul",
    "channels_last": "channels-last", "precision": "precision", "cudnn": "cuDNN", "torch": "torch",
    "duration_ns": "duration, ns", "duration_us": "duration, µs", "cycles": "cycles", "instructions": "instructions",
    "ipc": "IPC", "abbr": "abbr.", "short_name": "kernel", "value": "value", "value_high": "value (upper)",
    "source": "source in the paper", "qualifier": "qualifier", "subject": "subject", "metric": "metric",
    "window_kernels": "kernels in window", "step_kernels": "kernels in step", "window_us": "window, µs",
    "step_kernel_us": "step kernels, µs", "coverage": "window / step", "sampler": "sampler", "steps": "steps",
    "s_per_volume_median": "s per volume (median)", "s_per_volume_min": "s per volume (min)",
    "s_per_volume_max": "s per volume (max)", "world_size": "GPUs", "volumes_per_s": "volumes/s",
    "scaling_efficiency": "scaling efficiency", "allreduce_ms": "NCCL, ms/step", "nccl": "NCCL",
    "machine": "machine", "allreduce_ms_per_step": "NCCL kernels, ms/step", "step_ms": "wall, ms/step",
    "compute_ms_per_step": "other kernels, ms/step",
    "grad_accum": "micro-batches per step", "data": "input pipeline", "run": "run",
    "loop_ms_per_micro_batch": "train loop, ms per micro-batch", "bench_ms": "bench, ms per micro-batch",
    "ratio": "loop / bench",
    "exposed_ms_per_step": "exposed NCCL, ms/step", "kernel_ms_per_step": "all kernels, ms/step",
    "hidden_share": "share hidden", "params": "parameters", "GFLOP": "GFLOP", "out_shape": "output shape",
    "layers": "layers", "block": "block", "ms_per_step": "ms/step", "rel_l2": "relative L2",
    "kernels": "kernels (ncu / profiler)", "ncu_ms": "ncu, ms", "torch_ms": "profiler, ms", "time_ratio": "ncu / profiler",
    "workload": "workload", "peak_gib": "peak GiB",
}

# Okabe & Ito (2008), colour-blind safe; then the same hues lighter and darker, then greys.
OKABE_ITO = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000"]
EXTRA = ["#F5C767", "#A3D5F2", "#66C5AB", "#8A6000", "#1F4E79", "#8F3F00", "#E7B5D3", "#999999", "#5E5E5E"]
# Categories that exist in this project, in a fixed order: each keeps its colour in every figure.
KNOWN = [
    "convolution/GEMM", "normalization", "elementwise", "copy", "reduction", "optimizer", "upsample",
    "attention", "other", "Triton reduction", "Triton pointwise", "layout transform", "attention/softmax",
    "baseline", "opt1", "opt2", "opt12", "pytorch-default", "bf16", "bf16-compile", "bf16-compile-tuned",
    "bf16-ndhwc", "bf16-ndhwc-sdpa", "bf16-graphs",
]
# Instruction classes (sass__inst_executed_per_opcode_category; Figs 4, 7, 9): a palette of their own.
CLASS_COLORS = {"Floating Point": "#56B4E9", "Integer": "#E69F00", "Load/Store": "#009E73", "Control": "#CC79A7",
                "Uniform Datapath": "#0072B2", "Movement": "#D55E00", "Predicate": "#F0E442",
                "Conversion": "#999999", "Miscellaneous": "#5E5E5E"}
OTHER_REST = "other (rest)"
# GPUs keep their own colours (blue, vermillion, green), apart from the categories'.
# The paper names its GPUs by family (V100, A100, H100); ours of a family share its hue.
FAMILY_COLORS = {"H100": "#0072B2", "H200": "#D55E00", "A100": "#CC79A7", "V100": "#56B4E9", "B200": "#009E73"}
MACHINE_COLOR = "#009E73"  # several GPUs of one host ("2× H200")
# Any other GPU: a colour from these, fixed by a hash of its name (the same in every build).
GPU_PALETTE = ["#E69F00", "#8A6000", "#1F4E79", "#8F3F00", "#66C5AB", "#E7B5D3", "#5E5E5E", "#A3D5F2"]

_assigned: dict[str, str] = {}
_recorded: dict[str, str] = {}  # GPU folder → recorded name, from ``register_gpus``


def short_gpu_name(full: str) -> str:
    """A GPU's name as the driver reports it, shortened for readers: 'NVIDIA H100 80GB HBM3' →
    'H100 80GB HBM3', 'NVIDIA L40S' → 'L40S', 'Tesla V100-SXM2-32GB' → 'V100-SXM2-32GB'."""
    words = str(full).split()
    while words and words[0] in ("NVIDIA", "Tesla", "GeForce"):
        words = words[1:]
    return " ".join(words) or str(full)


def register_gpus(root: Any) -> dict[str, str]:
    """Read each GPU folder's recorded name under results ``root`` (``info.json``'s ``gpu``, else the
    ``gpu`` column of ``bench.csv``), for ``gpu_name``; returns {folder: short name}."""
    import json
    from pathlib import Path

    found = {}
    for folder in sorted(p for p in Path(root).iterdir() if p.is_dir()) if Path(root).is_dir() else []:
        name = None
        if (folder / "info.json").exists():
            try:
                name = json.loads((folder / "info.json").read_text()).get("gpu")
            except (json.JSONDecodeError, AttributeError):
                name = None
        if not name and (folder / "bench.csv").exists():
            gpus = pd.read_csv(folder / "bench.csv", usecols=lambda c: c == "gpu").get("gpu", pd.Series(dtype=str))
            name = gpus.dropna().iloc[-1] if len(gpus.dropna()) else None
        if name and str(name).lower() != "cpu":
            found[folder.name] = short_gpu_name(name)
    _recorded.update(found)
    return found


def gpu_name(slug: Any) -> Any:
    """Readers' name of a results-store GPU folder ('h200' → 'H200', 'l40s' → 'L40S', 'h200-x2' →
    '2× H200'); '(paper)' suffixes are kept; a folder with no recorded name keeps its own."""
    if not isinstance(slug, str):
        return slug
    base, sep, rest = slug.partition(" ")
    if base in GPU_NAMES:
        return GPU_NAMES[base] + sep + rest
    machine, x, n = base.rpartition("-x")
    if x and n.isdigit() and (machine in _recorded or base in _recorded):  # its own record names one GPU
        return f"{n}× {_recorded.get(machine) or _recorded[base]}" + sep + rest
    if base in _recorded:
        return _recorded[base] + sep + rest
    return base + sep + rest


def gpu_color(name: str) -> str:
    """The colour of a GPU (a readers' name): its family's, a machine's, else one fixed by its name."""
    import zlib

    if "×" in name:
        return MACHINE_COLOR
    family = name.split()[0].split("-")[0] if name.split() else name
    if family in FAMILY_COLORS:
        return FAMILY_COLORS[family]
    return GPU_PALETTE[zlib.crc32(name.encode()) % len(GPU_PALETTE)]


def is_gpu(name: str) -> bool:
    """Whether ``name`` is a GPU of the store (folder or readers' name) or one of the paper's."""
    return gpu_name(name) != name or name in {*_recorded.values(), *GPU_NAMES.values(), *FAMILY_COLORS}


def header(column: Any) -> str:
    """A column's header for readers: ``HEADERS``, GPU slugs by name, else the name itself."""
    text = str(column)
    return HEADERS.get(text, str(gpu_name(text)))


def color(name: str) -> str:
    """The colour of a category: fixed for ``KNOWN`` names, then first come first served (stable
    within a build); 'other (rest)' is always light grey."""
    if name == OTHER_REST:
        return "#D0D0D0"
    name = name.removesuffix(PAPER_SUFFIX)  # the paper's value of a series has the series' colour
    if is_gpu(name):
        return gpu_color(gpu_name(name))
    if name in CLASS_COLORS:
        return CLASS_COLORS[name]
    if name not in _assigned:
        palette = OKABE_ITO + EXTRA
        index = KNOWN.index(name) if name in KNOWN else len(KNOWN) + len([n for n in _assigned if n not in KNOWN])
        _assigned[name] = palette[index % len(palette)]
    return _assigned[name]


def colors(names) -> list[str]:
    return [color(str(n)) for n in names]


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def sci(value: float, digits: int = 2) -> str:
    """A number in scientific notation for readers: 1.3e-03 → '1.3 × 10⁻³' (``digits`` significant)."""
    mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
    return f"{mantissa} × 10{str(int(exponent)).translate(_SUPERSCRIPT)}"


def _cell(value: Any, digits: int) -> str:
    if value is None or (isinstance(value, float) and value != value) or value is pd.NA or value is pd.NaT:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    if isinstance(value, numbers.Real):
        v = float(value)
        if v != 0 and abs(v) < 10 ** -digits:
            return sci(v, digits)
        return f"{v:,.{digits}f}"
    return str(value)


class Table:
    """A DataFrame shown to readers (``_repr_html_``), see ``table``."""

    def __init__(self, df: pd.DataFrame, digits: int | Mapping[str, int] = 2, caption: str | None = None) -> None:
        self.df, self.digits, self.caption = df, digits, caption

    def _digits(self, column: str) -> int:
        return self.digits.get(column, 2) if isinstance(self.digits, Mapping) else self.digits

    def _repr_html_(self) -> str:
        df = self.df
        if isinstance(df.columns, pd.MultiIndex):
            df = df.copy()
            df.columns = [" · ".join(str(p) for p in c if str(p)) for c in df.columns]
        head = "".join(f"<th>{html.escape(header(c))}</th>" for c in df.columns)
        rows = []
        for _, r in df.iterrows():
            cells = []
            for c in df.columns:
                text = _cell(gpu_name(r[c]) if str(c).lower() in ("gpu", "gpu_slug", "machine") else r[c], self._digits(c))
                align = "right" if isinstance(r[c], numbers.Number) and not isinstance(r[c], bool) else "left"
                wrap = "" if align == "left" and len(text) > WRAP_CHARS else ";white-space:nowrap"  # prose wraps, numbers do not
                cells.append(f'<td style="text-align:{align}{wrap}">{html.escape(text)}</td>')
            rows.append("<tr>" + "".join(cells) + "</tr>")
        caption = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        return ('<div class="medddpm-table" style="overflow-x:auto;max-width:100%">'
                f'<table class="table" style="font-size:0.85em">{caption}<thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody>'
                "</table></div>")

    def __repr__(self) -> str:  # plain-text fallback (nbmake, terminals)
        return self.df.to_string(index=False, na_rep=MISSING)


def table(df: pd.DataFrame, digits: int | Mapping[str, int] = 2, caption: str | None = None,
          index: bool = False) -> Table:
    """``df`` for readers: no index column (``index=True`` turns a meaningful index into columns),
    '—' for missing values, thousands grouped, ``digits`` decimals (one number, or per column),
    GPU slugs in ``gpu``/``gpu_slug`` columns by their names, scrolling sideways when wide."""
    if index:
        df = df.reset_index()
    return Table(df, digits, caption)
