"""How a fact reads (the chapters' fact modules, ``chapters.CHAPTERS``): missing data, numbers for
readers, and which GPU plays which role in a chapter."""
from __future__ import annotations

import math
from typing import Any, Iterable

PREFERRED = ("h200", "h100-80gb-hbm3")  # the committed GPUs, reference first


def missing(what: str) -> str:
    """The text of a fact whose data the store lacks."""
    return f"— (no {what} in this results store)"


def number(value: Any, spec: str, what: str) -> str:
    """``value`` formatted with ``spec``, or ``missing(what)`` when it is absent or not finite."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return missing(what)
    return format(value, spec)


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural where ``n`` is not 1 ('1 GPU', '4 GPUs')."""
    return f"{n} {noun}" + "s" * (n != 1)


def pct(value: Any, what: str, digits: int = 0) -> str:
    """A fraction as a percentage ('12 %'), or ``missing(what)``."""
    text = number(None if value is None else 100 * value, f".{digits}f", what)
    return text if text.startswith("—") else f"{text} %"


def roles(gpus: Iterable[str], preferred: tuple[str, ...] = PREFERRED) -> dict[str, str | None]:
    """The reference and second GPU among ``gpus``: ``preferred`` ones first, then the rest sorted."""
    have = sorted(set(gpus))
    order = [g for g in preferred if g in have] + [g for g in have if g not in preferred]
    return {"ref": order[0] if order else None, "alt": order[1] if len(order) > 1 else None}
