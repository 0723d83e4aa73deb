"""The numbers the book's prose quotes, one function per chapter: each returns {name: text}, and a
chapter glues them all with one call (``notebook.glue_facts``).

Every function returns every one of its names, whatever the results store holds: where the data
is missing the text is "—" and what is missing, so each sentence still reads. Prose never names a
GPU itself: a chapter's reference GPU (``ref``) and second GPU (``alt``) are chosen from the GPUs
that hold the chapter's data, the committed H200 and H100 first (``PREFERRED``), and their names
are facts too (``ref_gpu``, ``alt_gpu``).

This module holds the helpers every chapter's facts share and chapters 01–05 (06–08 read their tables alone);
``quality_facts`` has 09–12, and ``chapters.CHAPTERS`` says which function each chapter glues.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from ..core.config import PAPER_CONFIGS, DiffusionConfig
from . import paper, quality_tables, tables
from .present import gpu_name, register_gpus, sci
from .wording import PREFERRED, missing, number, pct, roles, sci_fact  # noqa: F401 (the chapters' helpers, re-exported)

NCU_PREFERRED = ("h100-80gb-hbm3", "h200")  # for the paper's counters: the paper's own GPU first
SAMPLING_TARGETS_S = {"ddim": 1.0, "ddpm": 4.0}  # issue 20: seconds per 128³ volume, batch 1, H200
DDPM_STEPS = DiffusionConfig().timesteps  # denoising steps of a DDPM chain (T)
ONE_GPU = "— (one GPU in this store)"


def _names(r: Mapping[str, str | None], prefix: str = "") -> dict[str, str]:
    return {f"{prefix}ref_gpu": gpu_name(r["ref"]) if r["ref"] else missing("GPU with this data"),
            f"{prefix}alt_gpu": gpu_name(r["alt"]) if r["alt"] else ONE_GPU}


def gpu_list(gpus: Iterable[str]) -> str:
    names = [gpu_name(g) for g in sorted(set(gpus))]
    return ", ".join(names) if names else "none"


def _get(table: pd.DataFrame | pd.Series, key: Any, column: str | None = None) -> Any:
    """``table.loc[key, column]`` or None."""
    if table is None or len(table) == 0 or key is None or (isinstance(key, tuple) and None in key):
        return None
    try:
        v = table.loc[key] if column is None else table.loc[key, column]
    except (KeyError, TypeError, IndexError, ValueError, pd.errors.IndexingError):
        return None
    return v.iloc[0] if isinstance(v, pd.Series) and column is not None and len(v) else v


# ---- chapters ------------------------------------------------------------------------------

def setup(root: Path, gpus: list[str]) -> dict[str, str]:
    """01: the GPUs of the store."""
    register_gpus(root)  # GPU names from the store's records
    return {"n_gpus": str(len(gpus)), "gpu_list": gpu_list(gpus)}


def model(size: int = 128) -> dict[str, str]:
    """02: parameters and FLOPs of the paper's model at ``size``³ (counted, not measured)."""
    from ..core.config import model_preset
    from ..net.summary import summarize

    s = summarize(model_preset("whole-head"), (size,) * 3)
    top = max(s["blocks"], key=lambda b: b["flops"])
    return {"params": f"{s['parameters']:,}", "tflops": f"{s['forward_flops'] / 1e12:.2f}",
            "input_shape": str(s["input_shape"]), "top_block": str(top["block"]),
            "top_block_share": f"{100 * top['flops'] / s['forward_flops']:.0f} %"}


def characterization(root: Path, gpus: list[str]) -> dict[str, str]:
    """03: which GPUs have baseline ncu reports, the paper's dominant-kernel cycles, Fig. 5's order."""
    from ..profiling import metrics as M
    from ..profiling import store

    register_gpus(root)  # GPU names from the store's records
    k = tables.ncu_kernels(root, gpus, "paper")
    base = k[k["config"] == "baseline"] if not k.empty else k
    fig4 = paper.values(figure="Fig 4")
    h100 = fig4[(fig4["gpu"] == "H100") & (fig4["metric"] == "cycles")]["value"]
    f = {"ncu_gpus": gpu_list(base["gpu_slug"]) if not base.empty else "none",
         "paper_h100_dominant_cycles": f"{sci(h100.iloc[0])} cycles",
         "prio_order": missing("baseline ncu report in paper mode with rule estimates")}
    prio = tables.per_gpu(M.priority_scores, k, store.load_table("ncu_paper_rules", root, gpus)) if not k.empty else k
    if not prio.empty:
        f["prio_order"] = " > ".join(prio.groupby("category")["priority"].sum().sort_values(ascending=False).index[:3])
    return f


def end_to_end(root: Path, gpus: list[str]) -> dict[str, str]:
    """05: step times of the paper's configurations, the window's coverage, ncu vs torch.profiler."""
    register_gpus(root)  # GPU names from the store's records
    b = tables.bench(root, gpus, list(PAPER_CONFIGS))
    r = roles(b["gpu_slug"] if not b.empty else [])
    f = {"bench_gpus": gpu_list(b["gpu_slug"]) if not b.empty else "none", **_names(r)}
    ms = b.set_index(["gpu_slug", "config"])["step_ms_median"] if not b.empty else pd.Series(dtype=float)
    x = b.set_index(["gpu_slug", "config"])["speedup_vs_baseline"] if not b.empty else pd.Series(dtype=float)
    for cfg in PAPER_CONFIGS:
        f[f"ref_{cfg}_step_ms"] = number(_get(ms, (r["ref"], cfg)), ".0f", f"bench row of {cfg}")
        f[f"ref_{cfg}_speedup"] = number(_get(x, (r["ref"], cfg)), ".1f", f"bench rows of {cfg} and baseline")

    def compare(a: str, b_: str) -> str:
        va, vb = _get(ms, (r["ref"], a)), _get(ms, (r["ref"], b_))
        return missing(f"bench rows of {a} and {b_}") if va is None or vb is None else ("slower" if va > vb else "faster")
    f["ref_opt2_vs_baseline"], f["ref_opt12_vs_opt1"] = compare("opt2", "baseline"), compare("opt12", "opt1")
    c = tables.coverage(root, gpus)
    cr = roles(c["gpu_slug"] if not c.empty else [])
    cov = c[c["config"] == "baseline"].set_index("gpu_slug")["coverage"] if not c.empty else pd.Series(dtype=float)
    f.update(_names(cr, "cov_"))
    for role in ("ref", "alt"):
        f[f"cov_{role}_baseline_coverage"] = pct(_get(cov, cr[role]), "torch.profiler first-step table", 1)
    a = tables.step_agreement(root, gpus)
    f["agree_max_time_dev"] = pct((a["time_ratio"] - 1).abs().max(), "ncu step-mode report", 1) if not a.empty \
        else missing("ncu step-mode report")
    f["agree_max_count_dev"] = (f"{(a['ncu_kernels'] - a['torch_kernels']).abs().max():d}" if not a.empty
                                else missing("ncu step-mode report"))
    from . import workloads

    f.update(workloads.facts(root, gpus))
    return f


NORM_CONFIGS = ("opt1", "opt2", "opt12", "pytorch-default")
NORM_METRICS = ("cycles", "instructions", "ipc")


def interventions(root: Path, gpus: list[str]) -> dict[str, str]:
    """04: the kernel mix of whole steps and the §6.1 ratios of ncu reports, beside the paper's."""
    from ..profiling import metrics as M

    register_gpus(root)  # GPU names from the store's records
    t = tables.torch_kernels(root, gpus, "step")
    s = tables.ncu_summaries(root, gpus, "paper")
    have = (s[["gpu", "config"]].drop_duplicates().sort_values(["gpu", "config"]) if not s.empty
            else pd.DataFrame(columns=["gpu", "config"]))
    f = {"ncu_pairs": "; ".join(f"{gpu_name(g)}: {', '.join(d['config'])}" for g, d in have.groupby("gpu")) or "none",
         "torch_gpus": gpu_list(t["gpu_slug"]) if not t.empty else "none"}
    fig8 = paper.values(figure="Fig 8")
    ref = fig8[(fig8["config"] == "opt2") & (fig8["subject"] == "elementwise")].iloc[0]
    f["paper_opt2_elementwise"] = f"{ref['value']:.0f}–{ref['value_high']:.0f} %"
    r = roles(t["gpu_slug"] if not t.empty else [])
    f.update(_names(r, "mix_"))
    mix = M.kernel_mix(t, "category", "duration_us", ["gpu_slug", "config"]) if not t.empty else pd.DataFrame()
    conv = (mix[mix["category"] == "convolution/GEMM"].set_index(["gpu_slug", "config"])["share"]
            if not mix.empty else pd.Series(dtype=float))
    for cfg in ("baseline", "opt1", "opt2", "opt12"):
        f[f"mix_ref_{cfg}_conv_share"] = pct(_get(conv, (r["ref"], cfg)), f"torch.profiler step table of {cfg}")
    for _, p in paper.values(figure="§6.1").iterrows():
        high = f"–{p['value_high']:.2f}" if pd.notna(p["value_high"]) else ""
        f[f"paper_{p['gpu']}_{p['config']}_norm_{p['metric'].replace('norm_', '')}"] = f"{p['value']:.2f}{high}"
    norm = tables.normalized_scopes(root, gpus)
    nr = roles(norm["gpu"] if not norm.empty else [], NCU_PREFERRED)
    f.update(_names(nr, "ncu_"))
    vals = norm.set_index(["gpu", "config", "mode", "metric"])["measured"] if not norm.empty else pd.Series(dtype=float)
    for role in ("ref", "alt"):
        for cfg in NORM_CONFIGS:
            for mode in ("paper", "step"):
                for metric in NORM_METRICS:
                    f[f"ncu_{role}_{cfg}_{mode}_norm_{metric}"] = number(
                        _get(vals, (nr[role], cfg, mode, metric)), ".2f", f"ncu {mode}-mode report of {cfg}")
    opt2 = _get(vals, (nr["ref"], "opt2", "step", "cycles"))
    f["ncu_opt2_verdict"] = (missing("ncu step-mode report of opt2") if opt2 is None else
                             "We do not see this in either scope" if opt2 >= 1 else "We see cycles fall too")
    return f


def _agreement(root: Path, gpus: list[str]) -> tuple[str | None, pd.DataFrame]:
    """The reference GPU among those with quality results, and its denoiser-agreement rows."""
    q = quality_tables.quality_gpus(root, gpus)[1]
    return q, quality_tables.quality_csv(root, [q], "agreement") if q else pd.DataFrame()


