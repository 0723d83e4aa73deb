"""Nsight Compute CSV exports → tidy tables (usable on their own, no GPU needed).

Inputs are what ``ncu --import REPORT --csv`` prints:

* ``--page raw``: row 1 = header, row 2 = units, then one row per kernel; numbers may carry
  thousands separators; the two NVTX columns exist only with ``--nvtx``. Any ``--print-units``
  works: every value is converted through the units row to the base units that
  ``--print-units base`` prints (ns, byte, byte/s, hz, cycle, …); an unknown unit is an error.
* ``--page details``: one row per (kernel, section, metric), with rule rows carrying
  ``Rule Name``, ``Rule Type``, ``Estimated Speedup Type`` and ``Estimated Speedup`` (percent).
* ``--page raw --print-metric-instances details --metrics sass__inst_executed_per_opcode_category``:
  one cell per kernel such as ``1,988 (Integer: 1,485; Control: 170; ...)``.

Everything is parsed by column name, never by position.
"""
from __future__ import annotations

import csv
import gzip
import io
import re
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np

from ..core.errors import InputError
from .categories import abbreviation, category, short_name

if TYPE_CHECKING:  # pandas is imported where a table is built: the CLI's parser reads this module's names
    import pandas as pd

ID, NAME = "ID", "Kernel Name"
NVTX_PREFIX = "thread Domain:Push/Pop_Range"
INSTANCE_METRIC = "sass__inst_executed_per_opcode_category"

# Our names for the metrics the figures use (paper §3.2, §4, §6), with the ncu metric behind each.
METRICS: dict[str, str] = {
    "duration_ns": "gpu__time_duration.sum",
    "cycles": "gpc__cycles_elapsed.max",  # Nsight Compute's "Elapsed Cycles"
    "sm_active_cycles": "sm__cycles_active.avg",
    "instructions": "smsp__inst_executed.sum",  # "Executed Instructions"
    "ipc": "sm__inst_executed.avg.per_cycle_active",  # "Executed Ipc Active", per SM
    "issued_instructions": "smsp__inst_issued.sum",
    "tensor_pipe_pct": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "fma_pipe_pct": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "alu_pipe_pct": "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "l1_hit_pct": "l1tex__t_sector_hit_rate.pct",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "dram_throughput_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",  # SOL "DRAM Throughput"
    "warps_active": "sm__warps_active.avg.per_cycle_active",
    "stall_long_scoreboard": "smsp__warps_issue_stalled_long_scoreboard.sum",
    "stall_math_pipe_throttle": "smsp__warps_issue_stalled_math_pipe_throttle.sum",
    "stall_branch_resolving": "smsp__warps_issue_stalled_branch_resolving.sum",
    "stall_long_scoreboard_ratio": "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    "stall_math_pipe_throttle_ratio": "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
    "stall_branch_resolving_ratio": "smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio",
    # Roofline (issue 9): DRAM traffic and the operations that count as FLOPs. One tensor-path op
    # is one FLOP (an n×n×n bf16 matmul counts 2n³ of them: scripts/probes/roofline_probe.py); FFMA is
    # two FLOPs a thread instruction, FADD and FMUL one.
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "tensor_ops_bf16": "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
    "tensor_ops_fp16": "sm__ops_path_tensor_src_fp16_dst_fp32.sum",
    "tensor_ops_tf32": "sm__ops_path_tensor_src_tf32_dst_fp32.sum",
    "ffma_thread_inst": "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "fadd_thread_inst": "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "fmul_thread_inst": "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum",
}


def read_csv_rows(path: str | Path) -> list[list[str]]:
    """Rows of a (possibly gzipped) ncu CSV, skipping any ``==PROF==`` / warning lines before it."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"ncu CSV {str(path)!r} does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:
        text = f.read()
    start = text.find('"ID"')
    if start < 0:
        raise InputError(f"{path} is not an ncu CSV export (no \"ID\" column)")
    rows = list(csv.reader(io.StringIO(text[start:])))
    return [r for r in rows if r]


def to_number(value: str) -> float:
    """'7,863' → 7863.0; '', 'n/a', 'nan' → NaN; anything else unparsable → NaN."""
    v = value.strip().replace(",", "")
    if v == "" or v.lower() in {"nan", "n/a", "-"}:
        return float("nan")
    try:
        return float(v)
    except ValueError:
        return float("nan")


# Units of a raw export: SI prefixes on countable units, and time (ncu's base unit for a time on
# its own is ns, for the denominator of a rate it is s). Nothing outside these tables is guessed.
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}
_PER_S = {unit: 1e9 / ns for unit, ns in _NS.items()}  # "x per <unit>" → x per second (exact)
_COUNTABLE = frozenset("byte bit cycle sector sectors inst warp thread request block branches pass "
                       "register cluster SM sample hz".split())


def _count_factor(token: str) -> float | None:
    """'Kbyte' → 1e3, 'cycle' → 1, 'Ghz' → 1e9, '%' → 1; None where the token is unknown."""
    if token in ("%", ""):
        return 1.0
    for prefix in sorted(_PREFIX, key=len, reverse=True):
        rest = token[len(prefix):]
        if token.startswith(prefix) and (rest in _COUNTABLE or rest.lower() == "hz"):
            return _PREFIX[prefix]
    return None


def unit_factor(unit: str) -> float | None:
    """Factor that turns a value printed in ``unit`` into ncu's base unit for it: 'us' → 1e3 (ns),
    'Mbyte' → 1e6, 'Gbyte/s' → 1e9 (byte/s), 'sector/us' → 1e6 (sector/s); None if unknown.

    A prefix scales the printed value wherever it stands, as ncu's own base export does (a
    derived metric printed as 1.591 %/Kbyte is 1,591 %/byte there); a time in the denominator is
    converted to seconds."""
    unit = unit.strip()
    if unit in _NS:
        return _NS[unit]
    num, _, den = unit.partition("/")
    top = _count_factor(num)
    if not den or top is None:
        return top
    if den in _PER_S:
        return top * _PER_S[den]
    bottom = _count_factor(den)
    return None if bottom is None else top * bottom


def unit_factors(header: list[str], units: list[str], path: str | Path) -> dict[str, float]:
    """Per column, the factor to base units; one error naming every unknown unit."""
    factors, unknown = {}, {}
    for col, unit in zip(header, units):
        f = unit_factor(unit)
        if f is None:
            unknown.setdefault(unit, col)
        else:
            factors[col] = f
    if unknown:
        listed = ", ".join(f"{u!r} (column {c!r})" for u, c in sorted(unknown.items()))
        raise InputError(f"{path}: unknown unit(s) in the units row: {listed}; export with --print-units base")
    return factors


def nvtx_path(cell: str) -> str:
    """'695 "<default domain>:train_step:none…" "<default domain>:forward:none…"' → 'train_step/forward'."""
    names = re.findall(r'"<[^>]*>:([^:"]*)', cell or "")
    return "/".join(names)


def metric_name(column: str) -> str:
    """Strip section prefixes such as 'LTS.TriageCompute.' from a raw-page column name."""
    parts = column.split(".")
    for i, part in enumerate(parts):
        if "__" in part:
            return ".".join(parts[i:])
    return column


def parse_raw(path: str | Path) -> pd.DataFrame:
    """One row per kernel: id, kernel, short_name, category, abbr, nvtx, launch config, our named
    metrics (``METRICS``; NaN where not collected) and every other numeric metric by its name."""
    import pandas as pd

    rows = read_csv_rows(path)
    if len(rows) < 2:
        raise InputError(f"{path}: no header/units rows")
    header, data = rows[0], rows[2:]
    if ID not in header or NAME not in header:
        raise InputError(f"{path}: missing the {ID!r} or {NAME!r} column")
    if rows[1][header.index(ID)].strip().isdigit():
        raise InputError(f"{path}: no units row under the header (export with ncu's --page raw)")
    factors = unit_factors(header, rows[1], path)
    if not data:
        raise InputError(f"{path}: the report holds zero kernels")
    nvtx_col = next((c for c in header if c.startswith(NVTX_PREFIX)), None)
    fixed = {ID, NAME, "Process ID", "Process Name", "Host Name", "Context", "Stream", "Block Size",
             "Grid Size", "Device", "CC"}
    records = []
    for r in data:
        cells = dict(zip(header, r))
        rec: dict[str, object] = {
            "id": int(to_number(cells[ID])),
            "kernel": cells[NAME],
            "nvtx": nvtx_path(cells.get(nvtx_col, "")) if nvtx_col else "",
            "block": cells.get("Block Size", ""),
            "grid": cells.get("Grid Size", ""),
        }
        for col in header:
            if col in fixed or col == nvtx_col or col.startswith("Id:Domain"):
                continue
            name = metric_name(col)
            if name == INSTANCE_METRIC:
                continue
            value = to_number(cells.get(col, "")) * factors.get(col, 1.0)
            # the same metric may stand twice (a section-prefixed copy); keep the one with a value
            if name not in rec or (np.isnan(rec[name]) and not np.isnan(value)):  # type: ignore[arg-type]
                rec[name] = value
        records.append(rec)
    df = pd.DataFrame.from_records(records)
    for ours, theirs in METRICS.items():
        df[ours] = df[theirs] if theirs in df else np.nan
    df["short_name"] = df["kernel"].map(short_name)
    df["category"] = df["kernel"].map(category)
    df["abbr"] = df["kernel"].map(abbreviation)
    lead = ["id", "kernel", "short_name", "category", "abbr", "nvtx", "block", "grid", *METRICS]
    rest = sorted(c for c in df.columns if c not in lead)
    return df[lead + rest].sort_values("id").reset_index(drop=True)


def parse_details_rules(path: str | Path) -> pd.DataFrame:
    """Rule rows of a ``--page details`` export: id, section, rule, type, speedup_type, speedup_pct."""
    import pandas as pd

    rows = read_csv_rows(path)
    header, data = rows[0], rows[1:]
    need = {ID, "Section Name", "Rule Name", "Rule Type", "Estimated Speedup Type", "Estimated Speedup"}
    missing = need - set(header)
    if missing:
        raise InputError(f"{path}: not a --page details export (missing {sorted(missing)})")
    out = []
    seen = set()
    for r in data:
        c = dict(zip(header, r))
        if not c["Rule Name"]:
            continue
        key = (c[ID], c["Section Name"], c["Rule Name"], c["Rule Type"], c["Estimated Speedup"])
        if key in seen:  # ncu repeats some rule rows verbatim
            continue
        seen.add(key)
        out.append({"id": int(to_number(c[ID])), "section": c["Section Name"], "rule": c["Rule Name"],
                    "type": c["Rule Type"], "speedup_type": c["Estimated Speedup Type"],
                    "speedup_pct": to_number(c["Estimated Speedup"])})
    return pd.DataFrame(out, columns=["id", "section", "rule", "type", "speedup_type", "speedup_pct"])


_CLASS = re.compile(r"([A-Za-z][A-Za-z /_-]*?):\s*([\d,\.]+)")


def parse_instances(path: str | Path) -> pd.DataFrame:
    """Long table of instruction classes: id, class, count, share (of the kernel's instructions)."""
    import pandas as pd

    rows = read_csv_rows(path)
    header, data = rows[0], rows[1:]
    col = next((c for c in header if metric_name(c) == INSTANCE_METRIC), None)
    if col is None:
        raise InputError(f"{path}: no {INSTANCE_METRIC} column (export with --print-metric-instances details)")
    units = next((r for r in data if not r[header.index(ID)].strip().isdigit()), None)
    scale = unit_factors([col], [dict(zip(header, units)).get(col, "")], path)[col] if units else 1.0
    out = []
    for r in data:
        c = dict(zip(header, r))
        cell = c.get(col, "")
        if not c.get(ID, "").strip().isdigit() or "(" not in cell:
            continue
        kid = int(c[ID])
        pairs = [(name.strip(), to_number(n) * scale) for name, n in _CLASS.findall(cell[cell.index("("):])]
        total = sum(n for _, n in pairs)
        for name, n in pairs:
            out.append({"id": kid, "class": name, "count": n, "share": n / total if total else np.nan})
    return pd.DataFrame(out, columns=["id", "class", "count", "share"])


def tidy(raw: str | Path, details: str | Path | None = None, instances: str | Path | None = None
         ) -> dict[str, pd.DataFrame]:
    """All tables of one report: 'kernels', and 'rules' / 'instructions' where given."""
    tables = {"kernels": parse_raw(raw)}
    if details is not None:
        tables["rules"] = parse_details_rules(details)
    if instances is not None:
        tables["instructions"] = parse_instances(instances)
    return tables
