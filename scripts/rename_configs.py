#!/usr/bin/env python3
"""Rename run configurations throughout a results store, in one consistent step.

    rename_configs.py ROOT OLD=NEW [OLD=NEW ...] [--dry-run]

Every mapping is applied at once (so ``fast=bf16-graphs fast-all=fast`` swaps names without a clash):
CSV, gzipped CSV and parquet tables (the ``config`` column, and ``source`` columns that hold a
configuration or a sampler run named after one, like ``ddim50-eta1-fast``); JSON records (``config``
and ``name`` values, dictionary keys equal to a name or ending in ``/<name>``); and folders named after
a configuration. Raw logs (``*.log``, ``*.txt``, ``*.jsonl``) stay as they were written. Each file is
rewritten atomically; a folder whose new name exists already stops the run before anything changes.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import re
import sys
from pathlib import Path

import pandas as pd

from medddpm.io import atomic_path

COLUMNS = ("config", "source")  # table columns that name configurations
JSON_KEYS = ("config", "name")  # JSON values that name configurations
RUN_FILE = re.compile(r"(timing|log|profile)-(.+?)-((?:a)?\d+(?:-a\d+)?\.(?:csv|json))")  # a run's files
RUN_NAME = re.compile(r"((?:ddpm|ddim)\d+(?:-eta[0-9.]+)?(?:-noclip)?(?:-s\d+)?-)(.+)")  # SamplerRun.name


def parse(pairs: list[str]) -> dict[str, str]:
    out = {}
    for p in pairs:
        old, sep, new = p.partition("=")
        if not sep or not old or not new or old in out:
            raise SystemExit(f"rename_configs.py: {p!r} is not OLD=NEW (each OLD once)")
        out[old] = new
    return out


def rename_value(v, m: dict[str, str]):
    """``v`` renamed: a configuration, a sampler run ending in one, or a configuration with a suffix
    that names a run of it ('fast-long'); anything else unchanged."""
    if not isinstance(v, str):
        return v
    if v in m:
        return m[v]
    run = RUN_NAME.fullmatch(v)
    if run and run[2] in m:
        return run[1] + m[run[2]]
    if v.endswith("-long") and v[:-5] in m:
        return m[v[:-5]] + "-long"
    return v


def rename_json(obj, m: dict[str, str]):
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            head, _, tail = k.rpartition("/")
            key = m.get(k, f"{head}/{m[tail]}" if head and tail in m else k)
            out[key] = rename_value(v, m) if k in JSON_KEYS else rename_json(v, m)
        return out
    if isinstance(obj, list):
        return [rename_json(v, m) for v in obj]
    return obj


def rename_table(df: pd.DataFrame, m: dict[str, str]) -> pd.DataFrame | None:
    cols = [c for c in COLUMNS if c in df.columns and not pd.api.types.is_numeric_dtype(df[c])]
    if not cols:
        return None
    new = df.copy()
    for c in cols:
        new[c] = df[c].map(lambda v: rename_value(v, m))
    return None if all(new[c].equals(df[c]) for c in cols) else new


def rename_csv(path: Path, m: dict[str, str]) -> str | None:
    """The CSV's text with its configuration columns renamed, every other field as written; None
    when nothing changes."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows:
        return None
    cols = [i for i, c in enumerate(rows[0]) if c in COLUMNS]
    changed = False
    for row in rows[1:]:
        for i in cols:
            if i < len(row) and rename_value(row[i], m) != row[i]:
                row[i], changed = rename_value(row[i], m), True
    if not changed:
        return None
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


def plan(root: Path, m: dict[str, str]) -> tuple[list[tuple[Path, object]], list[tuple[Path, Path]]]:
    """(files to rewrite with their new content, folders to move)."""
    writes, moves = [], []
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        name = path.name
        if name.endswith((".csv", ".csv.gz")):
            new = rename_csv(path, m)
        elif name.endswith(".parquet"):
            new = rename_table(pd.read_parquet(path), m)
        elif name.endswith(".json"):
            data = json.loads(path.read_text())
            new = rename_json(data, m)
            new = None if new == data else new
        else:
            continue
        if new is not None:
            writes.append((path, new))
    moves = run_file_moves(root, m)
    for d in sorted((p for p in root.rglob("*") if p.is_dir() and p.name in m), key=lambda p: -len(p.parts)):
        moves.append((d, d.with_name(m[d.name])))
    return writes, moves


def run_file_moves(root: Path, m: dict[str, str]) -> list[tuple[Path, Path]]:
    """(file, renamed file) for every run file whose name carries a configuration of ``m``."""
    moves = []
    for path in sorted(root.rglob("*")):
        f = RUN_FILE.fullmatch(path.name) if path.is_file() else None
        if f and f[2] in m:
            moves.append((path, path.with_name(f"{f[1]}-{m[f[2]]}-{f[3]}")))
    return moves


def apply(writes, moves) -> None:
    for path, new in writes:
        with atomic_path(path) as tmp:
            if path.name.endswith(".parquet"):
                new.to_parquet(tmp, index=False)
            elif path.name.endswith(".json"):
                Path(tmp).write_text(json.dumps(new, indent=2, ensure_ascii=False) + "\n")
            elif path.name.endswith(".gz"):
                with gzip.open(tmp, "wt", newline="") as fh:
                    fh.write(new)
            else:
                Path(tmp).write_text(new, newline="")
    staged = []
    for old, new in moves:  # through temporary names, so that a swap of two names does not clash
        tmp = old.with_name(old.name + ".renaming")
        old.rename(tmp)
        staged.append((tmp, new))
    for tmp, new in staged:
        tmp.rename(new)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", help="results store (data/results)")
    p.add_argument("pairs", nargs="+", help="OLD=NEW configuration names")
    p.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
    a = p.parse_args(argv)
    m = parse(a.pairs)
    root = Path(a.root)
    if not root.is_dir():
        print(f"rename_configs.py: {root} is not a folder", file=sys.stderr)
        return 2
    writes, moves = plan(root, m)
    targets = {new for _, new in moves}
    clash = [str(new) for _, new in moves if new.exists() and new not in {old for old, _ in moves}]
    if clash or len(targets) < len(moves):
        print(f"rename_configs.py: target folder(s) exist already: {', '.join(clash) or 'two moves to one name'}",
              file=sys.stderr)
        return 2
    for path, _ in writes:
        print(f"rewrite {path}")
    for old, new in moves:
        print(f"move {old} -> {new}")
    if not a.dry_run:
        apply(writes, moves)
    return 0


if __name__ == "__main__":
    sys.exit(main())
