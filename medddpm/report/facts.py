"""The numbers the book's prose quotes, one function per chapter: each returns {name: text}, and a
chapter glues them all with one call (``notebook.glue_facts``).

Every function returns every one of its names, whatever the results store holds: where the data
is missing the text is "—" and what is missing, so each sentence still reads. Prose never names a
GPU itself: a chapter's reference GPU (``ref``) and second GPU (``alt``) are chosen from the GPUs
that hold the chapter's data, the committed H200 and H100 first (``PREFERRED``), and their names
are facts too (``ref_gpu``, ``alt_gpu``).
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from ..core.config import KERNEL_VARIANTS, LADDER, PAPER_CONFIGS, DiffusionConfig
from ..net.kernels import THIN
from . import paper, tables
from .present import gpu_name, register_gpus, sci
from .wording import PREFERRED, missing, number, pct, roles, sci_fact  # noqa: F401 (the chapters' helpers, re-exported)

NCU_PREFERRED = ("h100-80gb-hbm3", "h200")  # for the paper's counters: the paper's own GPU first
STEP_TARGET_MS = 50.0  # issue 21: a fast training step on the reference GPU
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


def _ladder_facts(root: Path, gpus: list[str], f: dict[str, str]) -> dict[str, str | None]:
    """The ladder's facts into ``f`` (step times of every rung on the reference and second GPU,
    ``fast`` (the last rung) against the baseline, OPT1, the bf16 peak and the 50 ms target); returns the roles."""
    lad = tables.ladder(root, gpus)
    r = roles(lad["gpu_slug"] if not lad.empty else [])
    f["ladder_gpus"] = gpu_list(lad["gpu_slug"]) if not lad.empty else "none"
    f.update(_names(r))
    ms = lad.set_index(["gpu_slug", "config"]) if not lad.empty else pd.DataFrame(columns=["step_ms_median"])
    for role in ("ref", "alt"):
        for cfg in LADDER:
            f[f"{role}_{cfg}_ms"] = number(_get(ms, (r[role], cfg), "step_ms_median"), ".1f", f"bench row of {cfg}")
    fast = _get(ms, (r["ref"], "fast"), "step_ms_median")
    opt1 = _get(ms, (r["ref"], "opt1"), "step_ms_median")
    f["ref_fast_x"] = number(_get(ms, (r["ref"], "fast"), "speedup_vs_baseline"), ".1f", "bench rows of fast and baseline")
    f["ref_fast_tflops"] = number(_get(ms, (r["ref"], "fast"), "tflops"), ".0f", "bench row of fast")
    f["ref_fast_vs_opt1"] = number(opt1 / fast if fast and opt1 else None, ".1f", "bench rows of fast and opt1")
    peak = _get(ms, (r["ref"], "fast"), "peak_fraction")
    f["ref_fast_peak_pct"] = pct(peak, "peaks.json")
    f["ref_target_verdict"] = (missing("bench row of fast") if fast is None
                               else "meets" if fast <= STEP_TARGET_MS else "misses")
    f["ref_floor_ms"] = number(fast * peak if fast and peak == peak and peak is not None else None, ".0f", "peaks.json")
    return r


def _agreement(root: Path, gpus: list[str]) -> tuple[str | None, pd.DataFrame]:
    """The reference GPU among those with quality results, and its denoiser-agreement rows."""
    q = roles([g for g in gpus if (Path(root) / g / "quality").is_dir()])["ref"]
    return q, tables.quality_csv(root, [q], "agreement") if q else pd.DataFrame()


def _worst_agreement(root: Path, gpus: list[str]) -> dict[str, str]:
    """Per configuration, the worst relative L2 of its ε against FP64 (``quality/agreement.csv``)
    on the reference quality GPU (``_agreement``), or, for one measured only elsewhere, on the
    first other GPU that has it, named."""
    q, _ = _agreement(root, gpus)
    a = tables.quality_csv(root, gpus, "agreement")
    out = {}
    for cfg, rows in (a.groupby("config", sort=False) if not a.empty else []):
        g = q if q in set(rows["gpu_slug"]) else roles(rows["gpu_slug"])["ref"]
        v = sci(rows.loc[rows["gpu_slug"] == g, "rel_l2"].max())
        out[cfg] = v if g == q else f"{v} (on the {gpu_name(g)})"
    return out


def _thin_signature(signature: str) -> bool:
    """True for a 3³ convolution with a thin side ('64→1 k3 128³→128³'), the kind
    ``kernels.conv3d_thin`` computes."""
    m = re.match(r"(\d+)→(\d+) k3 ", signature)
    return bool(m) and min(int(m[1]), int(m[2])) <= THIN


def _band_side(row: pd.Series) -> str:
    """Where a loss-parity row's loss lies against the baseline's seed band: inside, below or above."""
    if row["inside_band"]:
        return "inside"
    return "below" if row["loss"] < row["band_low"] else "above"


def _gap_facts(gap: pd.DataFrame, gpu: str | None, config: str, key: str, f: dict[str, str]) -> None:
    """Into ``f``, from ``tables.roofline_gap``: ``config``'s kernel time, roofline bound and gap
    on ``gpu`` (``{key}_time_ms``, ``_bound_ms``, ``_gap_ms``), the convolutions' share of the gap
    (``_convolution_gap_ms``, ``_pct``), and per other category its time and the fraction of it
    its bound is (``_{category}_ms``, ``_{category}_bound_pct``, spaces as underscores)."""
    d = gap[(gap["gpu_slug"] == gpu) & (gap["config"] == config)] if not gap.empty else gap
    what = f"ncu roofline report of {config}"
    by_cat = d.set_index("category") if len(d) else pd.DataFrame(columns=["gap_ms", "gap_share", "bound_ms", "time_ms"])
    for name, col in (("time", "time_ms"), ("bound", "bound_ms"), ("gap", "gap_ms")):
        f[f"{key}_{name}_ms"] = number(d[col].sum() if len(d) else None, ".1f", what)
    f[f"{key}_convolution_gap_ms"] = number(_get(by_cat, "convolution/GEMM", "gap_ms"), ".1f", what)
    f[f"{key}_convolution_gap_pct"] = pct(_get(by_cat, "convolution/GEMM", "gap_share"), what)
    for cat in ("Triton pointwise", "Triton reduction", "normalization"):
        b_, t_ = _get(by_cat, cat, "bound_ms"), _get(by_cat, cat, "time_ms")
        f[f"{key}_{cat.replace(' ', '_')}_ms"] = number(t_, ".1f", what)
        f[f"{key}_{cat.replace(' ', '_')}_bound_pct"] = pct(b_ / t_ if b_ is not None and t_ else None, what)


def _kernel_facts(root: Path, gpus: list[str], f: dict[str, str]) -> None:
    """Issue 21's facts into ``f``: ``bf16-graphs`` against its kernel variants (kv_), the GroupNorm
    implementations against their minimal bytes (nm_), the convolutions layer by layer (ly_)."""
    kv = tables.kernel_variants(root, gpus)
    have = kv.groupby("gpu_slug")["config"].nunique() if not kv.empty else pd.Series(dtype=int)
    r = roles(have[have > 1].index)  # GPUs with a variant beside fast
    f.update(_names(r, "kv_"))
    ms = kv.set_index(["gpu_slug", "config"])["step_ms_median"] if not kv.empty else pd.Series(dtype=float)
    what = "bench rows of fast's kernel variants"
    for role in ("ref", "alt"):
        mine = kv[(kv["gpu_slug"] == r[role]) & (kv["config"] != "bf16-graphs")] if r[role] else kv.iloc[0:0]
        best = mine.loc[mine["step_ms_median"].idxmin()] if len(mine) else None
        fast = _get(ms, (r[role], "bf16-graphs"))
        f[f"kv_{role}_base_ms"] = number(fast, ".1f", "bench row of bf16-graphs")
        f[f"kv_{role}_best"] = str(best["config"]) if best is not None else missing(what)
        f[f"kv_{role}_best_ms"] = number(None if best is None else best["step_ms_median"], ".1f", what)
        f[f"kv_{role}_best_x"] = number(None if best is None or fast is None else fast / best["step_ms_median"],
                                        ".2f", what)
        if role == "ref":
            f["kv_ref_best_gain_ms"] = number(None if best is None or fast is None else fast - best["step_ms_median"],
                                              ".1f", what)
            f["kv_ref_best_verdict"] = (missing(what) if best is None else
                                        "meets" if best["step_ms_median"] <= STEP_TARGET_MS else "misses")
            over = None if best is None else best["step_ms_median"] - STEP_TARGET_MS
            f["kv_ref_best_vs_target"] = (missing(what) if over is None else
                                          f"meets the {STEP_TARGET_MS:g} ms target with {-over:.1f} ms to spare"
                                          if over <= 0 else f"misses the {STEP_TARGET_MS:g} ms target by {over:.1f} ms")
            for cfg in (k.name for k in KERNEL_VARIANTS):
                f[f"kv_ref_{cfg}_ms"] = number(_get(ms, (r["ref"], cfg)), ".1f", f"bench row of {cfg}")
            ref_best = None if best is None else str(best["config"])
    worst = _worst_agreement(root, gpus)
    for key, cfg in (("fast", "bf16-graphs"), ("fast-tnorm", "fast-tnorm"), ("best", ref_best)):
        f[f"kv_{key}_rel"] = worst.get(cfg) or missing(f"agreement rows of {cfg or 'the best variant'}")
    lp = tables.loss_parity(root, gpus)
    lp = lp[lp["gpu_slug"] == r["ref"]] if not lp.empty else lp
    for key, cfg in (("fast", "bf16-graphs"), ("best", ref_best)):
        row = lp[lp["config"] == cfg] if len(lp) else lp
        what = f"loss-parity row of {cfg or 'the best variant'} on the reference GPU"
        f[f"kv_{key}_lp"] = f"{row['loss'].iloc[0]:.4f}" if len(row) else missing(what)
        f[f"kv_{key}_lp_verdict"] = (_band_side(row.iloc[0]) if len(row) else missing(what))
    f["kv_lp_band"] = (f"{lp['band_low'].iloc[0]:.4f}–{lp['band_high'].iloc[0]:.4f}" if len(lp)
                       else missing("baseline loss-parity rows"))
    nm = tables.fast_path_csv(root, gpus, "norms")
    nr = roles(nm["gpu_slug"] if not nm.empty else [])
    f["nm_gpu"] = gpu_name(nr["ref"]) if nr["ref"] else missing("fast_path/norms.csv")
    mine = nm[nm["gpu_slug"] == nr["ref"]] if not nm.empty else nm
    what = "fast_path/norms.csv"
    for impl in ("inductor", "triton"):
        for which in ("forward", "step"):
            t = mine[f"{impl}_{which}_ms"].sum() if len(mine) else None
            f[f"nm_{impl}_{which}_ms"] = number(t, ".1f", what)
            f[f"nm_{impl}_{which}_tbs"] = number(mine[f"min_{which}_mb"].sum() / t / 1e3 if t else None, ".1f", what)
    nt = tables.fast_path_csv(root, [nr["ref"]] if nr["ref"] else [], "norm_tiles")
    if not nt.empty:  # the default launch shapes (candidate 0) on the largest norm
        nt = nt[nt["candidate"] == 0]
        nt = nt[nt["channels"] * nt["side"] ** 3 == (nt["channels"] * nt["side"] ** 3).max()]
    what = "fast_path/norm_tiles.csv"
    f["nt_shape"] = (f"{int(nt['channels'].iloc[0])} channels × {int(nt['side'].iloc[0])}³" if len(nt) else missing(what))
    per = nt.set_index("kernel")["tbs"] if len(nt) else pd.Series(dtype=float)
    for key, kernel in (("stats", "_stats_kernel"), ("apply", "_apply_kernel"), ("reduce", "_bwd_reduce_kernel"),
                        ("dx", "_bwd_dx_kernel")):
        f[f"nt_{key}_tbs"] = number(_get(per, kernel), ".1f", what)
    what = "fast_path/norms.csv"
    f["nm_min_step_gb"] = number(mine["min_step_mb"].sum() / 1e3 if len(mine) else None, ".1f", what)
    f["nm_shapes"] = number(len(mine) if len(mine) else None, "d", what)
    f["nm_layers"] = number(int(mine["count"].sum()) if len(mine) else None, "d", what)
    ly = tables.layer_costs(root, gpus)
    lr = roles(ly["gpu_slug"] if not ly.empty else [])
    f["ly_gpu"] = gpu_name(lr["ref"]) if lr["ref"] else missing("fast_path/layers.csv")
    mine = ly[ly["gpu_slug"] == lr["ref"]] if not ly.empty else ly
    what = "fast_path/layers.csv"
    f["ly_config"] = str(mine["config"].iloc[0]) if len(mine) else missing(what)
    every = tables.layer_costs(root, [lr["ref"]], "all") if lr["ref"] else ly
    thin = every[every["signature"].map(_thin_signature)] if len(every) else every
    per = thin.groupby("config")["ms"].sum() if len(thin) else pd.Series(dtype=float)
    f["ly_thin_fast_ms"] = number(_get(per, "bf16-graphs"), ".2f", "layers.csv rows of fast")
    f["ly_thin_ms"] = number(_get(per, f["ly_config"]), ".2f", what)
    passes = _layer_passes(mine, "ly", what, f)
    f["ly_other_ms"] = number(mine.loc[mine["isolated_ms"].isna(), "ms"].sum() if len(mine) else None, ".1f", what)
    f["ly_alt_gpu"] = gpu_name(lr["alt"]) if lr["alt"] else missing("fast_path/layers.csv of a second GPU")
    alt = ly[ly["gpu_slug"] == lr["alt"]] if not ly.empty and lr["alt"] else ly.iloc[0:0]
    f["ly_alt_config"] = str(alt["config"].iloc[0]) if len(alt) else missing("fast_path/layers.csv of a second GPU")
    _layer_passes(alt, "ly_alt", "fast_path/layers.csv of a second GPU", f)
    top = passes.nlargest(1, "ms") if len(passes) else passes
    slow = passes[passes["ms"] >= 0.5].nsmallest(1, "tflops") if len(passes) else passes
    for key, row in (("top", top), ("slow", slow)):
        f[f"ly_{key}"] = (f"{row['signature'].iloc[0]} ({row['pass'].iloc[0]})" if len(row) else missing(what))
        f[f"ly_{key}_ms"] = number(row["ms"].iloc[0] if len(row) else None, ".2f", what)
        f[f"ly_{key}_tflops"] = number(row["tflops"].iloc[0] if len(row) else None, ".0f", what)
    tc = tables.thin_convs(root, gpus)
    tr = roles(tc["gpu_slug"] if not tc.empty else [])
    tmine = tc[tc["gpu_slug"] == tr["ref"]] if not tc.empty else tc
    what = "fast_path/thin_convs.csv"
    f["tc_gpu"] = gpu_name(tr["ref"]) if tr["ref"] else missing(what)
    for impl in ("cudnn", "triton"):
        f[f"tc_{impl}_ms"] = number(tmine[f"ms_{impl}"].sum() if len(tmine) else None, ".2f", what)
    ahead = tmine[tmine["speedup"] < 1] if len(tmine) else tmine
    f["tc_cudnn_ahead"] = (missing(what) if not len(tmine) else "none" if not len(ahead) else
                           "; ".join(f"{sh} ({ps})" for sh, ps in zip(ahead["shape"], ahead["pass"])))


def _layer_passes(rows: pd.DataFrame, key: str, what: str, f: dict[str, str]) -> pd.DataFrame:
    """One GPU's convolution passes of ``tables.layer_costs`` (rows with an isolated time): their
    time in the step, the same shapes' isolated best, and how many rows run slower in the step."""
    passes = rows[rows["isolated_ms"].notna()] if len(rows) else rows
    f[f"{key}_conv_ms"] = number(passes["ms"].sum() if len(passes) else None, ".1f", what)
    f[f"{key}_isolated_ms"] = number(passes["isolated_ms"].sum() if len(passes) else None, ".1f", what)
    f[f"{key}_above"] = number(int((passes["lost_ms"] > 0).sum()) if len(passes) else None, "d", what)
    f[f"{key}_rows"] = number(len(passes) if len(passes) else None, "d", what)
    return passes


def beyond(root: Path, gpus: list[str]) -> dict[str, str]:
    """06: the fast-path ladder, its kernels, the rooflines, parity, the loop and several GPUs."""
    from ..profiling.categories import conv_pass

    register_gpus(root)  # GPU names from the store's records
    f: dict[str, str] = {}
    r = _ladder_facts(root, gpus, f)
    _kernel_facts(root, gpus, f)
    t = tables.torch_kernels(root, gpus, "step", ["bf16-graphs"])
    conv = t[t["category"] == "convolution/GEMM"].groupby("gpu_slug")["duration_us"].sum() / 1e3 if not t.empty else {}
    total = t.groupby("gpu_slug")["duration_us"].sum() / 1e3 if not t.empty else {}
    c, tot = _get(pd.Series(conv, dtype=float), r["ref"]), _get(pd.Series(total, dtype=float), r["ref"])
    f["ref_fast_conv_ms"] = number(c, ".1f", "torch.profiler step table of fast")
    f["ref_fast_kernel_ms"] = number(tot, ".1f", "torch.profiler step table of fast")
    f["ref_fast_other_ms"] = number(tot - c if c is not None and tot is not None else None, ".1f",
                                    "torch.profiler step table of fast")
    roofs = tables.ceilings(root, gpus)
    rw = tables.roofline(root, gpus, "roofline")
    f["roof_step_gpus"] = gpu_list(rw["gpu_slug"]) if not rw.empty else "none"
    passes = tables.results_csv(root, gpus, "fast_path/ncu_passes")
    by_path = passes.groupby("flop_paths")["passes"].max() if not passes.empty else pd.Series(dtype=float)
    f["passes_tensor"] = number(_get(by_path, "bf16"), "d", "fast_path/ncu_passes.csv")
    f["passes_fp32"] = number(_get(by_path, "fp32"), "d", "fast_path/ncu_passes.csv")
    nfast = rw.loc[rw["config"] == "bf16-graphs"].groupby("gpu_slug").size().max() if not rw.empty else None
    f["fast_step_kernels"] = number(None if nfast is None or nfast != nfast else int(nfast), ",", "roofline report of fast")
    sr = roles(rw["gpu_slug"] if not rw.empty else [])
    f.update(_names(sr, "step_"))
    gap = tables.roofline_gap(rw, roofs)
    hi = tables.roofline_highlights(rw, roofs)
    for role in ("ref", "alt"):
        _gap_facts(gap, sr[role], "bf16-graphs", f"step_{role}_fast", f)
    bm = _get(gap.groupby(["gpu_slug", "config"], observed=True)["bound_ms"].sum(), (sr["ref"], "bf16-graphs")) if not gap.empty else None
    f["step_ref_fast_target_reach"] = (missing("ncu roofline report of fast") if bm is None else
                                       "within reach of" if bm <= STEP_TARGET_MS else "beyond")
    for role in ("ref", "alt"):
        _gap_facts(gap, sr[role], "fast", f"step_{role}_all", f)
    hs = hi.set_index(["gpu_slug", "config", "what"]) if not hi.empty else pd.DataFrame(
        columns=["conv_pass", "tflops", "compute_fraction", "share"])
    for cfg in ("bf16-graphs", "baseline"):
        what = f"ncu roofline report of {cfg}"
        key = (sr["ref"], cfg, "conv")
        kind = _get(hs, key, "conv_pass")
        f[f"step_ref_{cfg}_conv_kind"] = kind if isinstance(kind, str) else missing(what)
        f[f"step_ref_{cfg}_conv_tflops"] = number(_get(hs, key, "tflops"), ".1f", what)
        f[f"step_ref_{cfg}_conv_compute_pct"] = pct(_get(hs, key, "compute_fraction"), what)
        f[f"step_ref_{cfg}_conv_share"] = pct(_get(hs, key, "share"), what, 1)
    norm = tables.normalized_scopes(root, gpus)
    norm = norm[(norm["config"] == "bf16-graphs") & (norm["mode"] == "step")] if not norm.empty else norm
    nr = roles(norm["gpu"] if not norm.empty else [])
    f.update(_names(nr, "ncu_"))
    vals = norm.set_index(["gpu", "metric"])["measured"] if not norm.empty else pd.Series(dtype=float)
    for role in ("ref", "alt"):
        for metric in NORM_METRICS:
            f[f"ncu_{role}_fast_{metric}"] = number(_get(vals, (nr[role], metric)), ".2f", "ncu step-mode report of fast")
    ca = tables.fast_path_csv(root, gpus, "cudnn_all_bench")
    ca = ca[ca["gpu_slug"] == r["ref"]].groupby("config")["step_ms_median"] if not ca.empty else None
    f["cudnn_all_ms"] = number(ca.median().get("bf16-graphs-cudnn-all") if ca is not None else None, ".1f",
                               "fast_path/cudnn_all_bench.csv")
    f["cudnn_all_fast_ms"] = (" and ".join(f"{v:.1f}" for v in ca.get_group("bf16-graphs")) if ca is not None and "bf16-graphs" in ca.groups
                              else missing("fast_path/cudnn_all_bench.csv"))
    rp = tables.roofline(root, gpus, "paper")
    f["roof_gpus"] = gpu_list(rp["gpu_slug"]) if not rp.empty else "none"
    probe = tables.results_csv(root, gpus, "fast_path/roofline_probe")
    f["probe_ratio"] = (f"{probe['flops_over_expected'].min():.4f}–{probe['flops_over_expected'].max():.4f}"
                        if not probe.empty else missing("fast_path/roofline_probe.csv"))
    f["window_grad_kernels"] = (f"{rp['short_name'].map(conv_pass).isin(['data gradient', 'weight gradient']).sum():,}"
                                if not rp.empty else missing("ncu report in paper mode"))
    big = rp[rp["category"] == "convolution/GEMM"].nlargest(1, "duration_ns") if not rp.empty else rp
    f["roof_conv_tflop"] = f"{big['flops'].iloc[0] / 1e12:.3f}" if len(big) else missing("ncu report in paper mode")
    f["conv_formula_tflop"] = f"{2 * 128**3 * 64 * 64 * 27 / 1e12:.3f}"  # 64→64 channels, 3³ kernel, 128³ voxels
    wr = roles(rp["gpu_slug"] if not rp.empty else [])
    f.update(_names(wr, "win_"))
    wh = tables.roofline_highlights(rp, roofs)
    wh = wh.set_index(["gpu_slug", "config", "what"]) if not wh.empty else pd.DataFrame(
        columns=["tflops", "roof_tflops", "compute_fraction", "dram_tbps", "bandwidth_fraction"])
    for cfg in ("baseline", "opt1"):
        what = f"ncu report of {cfg} in paper mode"
        f[f"win_{cfg}_conv_tflops"] = number(_get(wh, (wr["ref"], cfg, "conv"), "tflops"), ".0f", what)
        f[f"win_{cfg}_conv_compute_pct"] = pct(_get(wh, (wr["ref"], cfg, "conv"), "compute_fraction"), what)
    f["win_opt1_conv_roof"] = number(_get(wh, (wr["ref"], "opt1", "conv"), "roof_tflops"), ".0f", "peaks.json")
    f["win_opt1_norm_tbps"] = number(_get(wh, (wr["ref"], "opt1", "norm"), "dram_tbps"), ".2f", "ncu report of opt1")
    f["win_opt1_norm_bw_pct"] = pct(_get(wh, (wr["ref"], "opt1", "norm"), "bandwidth_fraction"), "ncu report of opt1")
    f["win_opt12_copy_bw_pct"] = pct(_get(wh, (wr["ref"], "opt12", "copy"), "bandwidth_fraction"), "ncu report of opt12")
    rs = tables.roofline_summary(rp, roofs)
    rs = rs.set_index(["gpu_slug", "config"]) if not rs.empty else pd.DataFrame(columns=["no_flops_share"])
    f["win_opt12_no_flops_share"] = pct(_get(rs, (wr["ref"], "opt12"), "no_flops_share"), "ncu report of opt12")
    lp = tables.loss_parity(root, gpus)
    lr = roles(lp["gpu_slug"] if not lp.empty else [])
    f.update(_names(lr, "lp_"))
    band = lp[lp["gpu_slug"] == lr["ref"]] if not lp.empty else lp
    fast_lp = band[band["config"] == "bf16-graphs"] if len(band) else band
    f["lp_band"] = (f"{band['band_low'].iloc[0]:.4f}–{band['band_high'].iloc[0]:.4f}" if len(band)
                    else missing("fast_path/loss_parity.csv"))
    f["lp_seeds"] = f"{band['band_seeds'].iloc[0]}" if len(band) else missing("fast_path/loss_parity.csv")
    f["lp_fast"] = f"{fast_lp['loss'].iloc[0]:.4f}" if len(fast_lp) else missing("loss-parity row of fast")
    f["lp_fast_verdict"] = (("inside" if fast_lp["inside_band"].iloc[0] else "outside") if len(fast_lp)
                            else missing("loss-parity row of fast"))
    sc, _ = tables.scaling(root)
    f.update(loop_facts(tables.loop_vs_bench(root, gpus), sc, tables.scaling_earlier(root)))
    return f


LOOP_TARGET = 1.03  # loop / bench per micro-batch: the loop may add at most 3 % to its benchmark
SCALING_TARGET = 0.97  # T(1 GPU) / T(N GPUs) of the real loop, weak scaling


def loop_facts(lb: pd.DataFrame, sc: pd.DataFrame, earlier: pd.DataFrame) -> dict[str, str]:
    """The prose facts of the training-loop and multi-GPU sections, always every key: '—' (with
    what is missing) where the store lacks the data."""
    f: dict[str, str] = {}
    if lb.empty:
        f.update(loop_rows=missing("loop_vs_bench.csv"), loop_within=missing("loop rows"),
                 loop_worst=missing("loop rows"), loop_data=missing("loop rows"))
    else:
        worst = lb.loc[lb["ratio"].idxmax()]
        f["loop_rows"] = str(len(lb))
        f["loop_within"] = f"{int((lb['ratio'] <= LOOP_TARGET).sum())} of {len(lb)}"
        f["loop_worst"] = (f"{worst['ratio']:.3f} ({worst['config']}, grad-accum {int(worst['grad_accum'])}, "
                           f"{gpu_name(worst['gpu_slug'])}: {worst['loop_ms_per_micro_batch']:.1f} against "
                           f"{worst['bench_ms']:.1f} ms)")
        f["loop_data"] = ", ".join(sorted(lb["data"].astype(str).unique()))
    multi = sc[sc["world_size"] > 1] if not sc.empty else sc
    if multi.empty:
        f.update(scaling_within=missing("scaling.csv"), scaling_range=missing("scaling.csv"))
    else:
        eff = multi["scaling_efficiency"]
        f["scaling_within"] = f"{int((eff >= SCALING_TARGET).sum())} of {len(multi)}"
        f["scaling_range"] = f"{100 * eff.min():.1f}–{100 * eff.max():.1f} %"
    for cfg in ("opt1", "bf16-graphs"):
        for accum in (1, 2):
            key = f"{cfg}_a{accum}"
            row = multi[(multi["config"] == cfg) & (multi["grad_accum"] == accum)] if not multi.empty else multi
            f[f"{key}_eff"] = f"{100 * row['scaling_efficiency'].iloc[0]:.1f} %" if len(row) else missing("row")
            one = sc[(sc["config"] == cfg) & (sc["grad_accum"] == accum) & (sc["world_size"] == 1)] if not sc.empty else sc
            f[f"{key}_ms"] = (f"{one['step_ms_median'].iloc[0]:.1f} → {row['step_ms_median'].iloc[0]:.1f}"
                              if len(row) and len(one) else missing("row"))
        old = earlier[(earlier["config"] == cfg) & (earlier["world_size"] > 1)] if not earlier.empty else earlier
        old1 = earlier[(earlier["config"] == cfg) & (earlier["world_size"] == 1)] if not earlier.empty else earlier
        f[f"{cfg}_earlier_eff"] = f"{100 * old['scaling_efficiency'].iloc[0]:.1f} %" if len(old) else missing("earlier run")
        nccl = old["allreduce_ms"].iloc[0] if len(old) and "allreduce_ms" in old else float("nan")
        f[f"{cfg}_earlier_nccl"] = f"{nccl:.1f}" if nccl == nccl else missing("earlier profile")
        f[f"{cfg}_earlier_ms"] = (f"{old1['step_ms_median'].iloc[0]:.1f} → {old['step_ms_median'].iloc[0]:.1f}"
                                  if len(old) and len(old1) else missing("earlier run"))
    return f


SAMPLING_CONFIGS = ("baseline", "opt1", "bf16-graphs", "fast-w16", "fast-w16-p8", "fast-w16-p8-tnorm",
                    "fast-w16-tnorm-tconv", "fast-w16-tnorm-tconv-fold", "fast-w16-tnorm-tconv-fold-up")  # slow to fast; the fastest of these is the chapter's "fastest sampler" (their samples are the ones it checks)
SAMPLING_LEVERS = ("fast-w16-tnorm-tconv-fold-up-update", "fast-w16-tnorm-tconv-fold-up-table")  # measured beside fold-up, each alone; not candidates for the fastest sampler (their samples are fold-up's denoiser's, not checked on their own)
SAMPLING_FP8 = ("fast-w16-tnorm-tconv-fold-up-update-fp8skip", "fast-w16-tnorm-tconv-fold-up-update-fp8")  # FP8 convolutions on fold-up-update (bf16, their reference below); judged by their own section (quality/precision*.csv), not candidates for the bf16 "fastest sampler"
FP8_BF16 = "fast-w16-tnorm-tconv-fold-up-update"  # the bf16 sampler the FP8 ones add their lever to
AGREEMENT_CONFIGS = ("baseline", "opt1", "bf16", "bf16-graphs", "fast-w16", "fast-w16-p8", "fast-tnorm", "fast-w16-p8-tnorm",
                     "fast-tnorm-tconv", "fast-w16-tnorm-tconv", "fast", "fast-w16-tnorm-tconv-fold",
                     "fast-w16-tnorm-tconv-fold-up")
SAMPLE_SOURCES = ("opt1", "opt2", "bf16", "bf16-graphs", "real")


def quality(root: Path, gpus: list[str]) -> dict[str, str]:
    """07: sampling speed and its kernels, denoiser agreement, training parity, sample agreement,
    the long run."""
    register_gpus(root)  # GPU names from the store's records
    sb = tables.sample_bench(root, gpus)
    one = sb[sb["batch"] == 1] if not sb.empty else sb
    r = roles(one["gpu_slug"] if not one.empty else [])
    f = {"sample_gpus": gpu_list(sb["gpu_slug"]) if not sb.empty else "none", **_names(r, "samp_")}
    s = one.set_index(["gpu_slug", "config", "sampler"])["s_per_volume_median"] if not one.empty else pd.Series(dtype=float)
    for cfg in (*SAMPLING_CONFIGS, *SAMPLING_LEVERS, *SAMPLING_FP8):
        for smp in ("ddim", "ddpm"):
            v = _get(s, (r["ref"], cfg, smp))
            f[f"samp_{cfg}_{smp}_s"] = number(v, ".2f", f"sample_bench row of {cfg}")
            f[f"samp_{cfg}_{smp}_verdict"] = _target_verdict(v, smp, f"sample_bench row of {cfg}")
    mine = one[one["gpu_slug"] == r["ref"]] if not one.empty else one
    ddim = mine[(mine["sampler"] == "ddim") & mine["config"].isin(SAMPLING_CONFIGS)] if len(mine) else mine
    best = ddim.loc[ddim["s_per_volume_median"].idxmin(), "config"] if len(ddim) else None
    f["samp_best"] = best or missing("sample_bench.csv")
    f["samp_best_quality"] = _best_sampler_quality(root, r["ref"], best)
    for smp, target in SAMPLING_TARGETS_S.items():
        v = _get(s, (r["ref"], best, smp)) if best else None
        opt1 = _get(s, (r["ref"], "opt1", smp))
        f[f"samp_best_{smp}_s"] = number(v, ".2f", f"sample_bench row of {best or 'any configuration'}")
        f[f"samp_best_{smp}_target"] = f"{target:g}"
        f[f"samp_best_{smp}_verdict"] = _target_verdict(v, smp, "sample_bench.csv")
        f[f"samp_best_{smp}_vs_opt1"] = number(opt1 / v if v and opt1 else None, ".1f", "sample_bench rows of opt1")
    etas = tables.sample_bench(root, [r["ref"]] if r["ref"] else [], every_eta=True)
    etas = etas[(etas["config"] == best) & (etas["sampler"] == "ddim") & (etas["batch"] == 1)] if best else etas
    f["samp_best_ddim_etas"] = ("; ".join(f"η = {e:g}: {v:.2f} s" for e, v in zip(etas["eta"], etas["s_per_volume_median"]))
                                if len(etas) else missing("sample_bench.csv"))
    for smp in ("ddim", "ddpm"):
        batches = sb[(sb["gpu_slug"] == r["ref"]) & (sb["config"] == best) & (sb["sampler"] == smp)] if best else sb
        batches = batches.sort_values("batch") if len(batches) else batches
        f[f"samp_best_{smp}_batches"] = (", ".join(f"batch {int(b)}: {v:.2f} s" for b, v in
                                                   zip(batches["batch"], batches["s_per_volume_median"]))
                                         if len(batches) else missing("sample_bench.csv"))
        f[f"samp_best_{smp}_batch_meets"] = _batch_verdict(batches, SAMPLING_TARGETS_S[smp])
    dk = tables.denoise_categories(root, [r["ref"]] if r["ref"] else [])
    profiled = ddim[ddim["config"].isin(dk.columns)] if len(ddim) and not dk.empty else ddim.iloc[0:0]
    best_profiled = profiled.loc[profiled["s_per_volume_median"].idxmin(), "config"] if len(profiled) else None
    f["denoise_best_config"] = best_profiled or missing("denoising-step kernel table")
    for key, cfg in (("denoise_fast", "bf16-graphs"), ("denoise_best", best_profiled or "bf16-graphs")):
        col = dk[cfg] if not dk.empty and cfg in dk.columns else None
        what = f"denoising-step kernel table of {cfg}"
        f[f"{key}_ms"] = number(col.sum() if col is not None else None, ".1f", what)
        f[f"{key}_conv_ms"] = number(_get(col, "convolution/GEMM") if col is not None else None, ".1f", what)
        f[f"{key}_layout_ms"] = number((_get(col, "layout transform") or 0.0) if col is not None else None, ".1f", what)
    # DDPM 250 of the fastest sampler: its wall time a step against its kernels' time a step
    kern = dk[best].sum() if best and not dk.empty and best in dk.columns else None
    ddpm = _get(s, (r["ref"], best, "ddpm")) if best else None
    what = f"DDPM 250 row and kernel table of {best or 'the fastest sampler'}"
    f["samp_best_ddpm_step_ms"] = number(None if ddpm is None else 1000 * ddpm / DDPM_STEPS, ".1f", what)
    f["samp_best_kernel_ms"] = number(kern, ".1f", what)
    only = None if kern is None else DDPM_STEPS * kern / 1000  # s a volume with no time between kernels
    f["samp_best_kernels_only_s"] = number(only, ".2f", what)
    target = SAMPLING_TARGETS_S["ddpm"]
    f["samp_best_gap_verdict"] = (missing(what) if only is None else
                                  f"removing the gaps alone would not reach the {target:g} s target: the kernels "
                                  "themselves must get faster" if only > target else
                                  f"removing the gaps alone would reach the {target:g} s target")
    q, a = _agreement(root, gpus)
    f["q_gpu"] = gpu_name(q) if q else missing("quality results")
    worst = _worst_agreement(root, gpus)
    for cfg in AGREEMENT_CONFIGS:
        f[f"q_{cfg}_rel"] = worst.get(cfg) or missing(f"agreement rows of {cfg}")
    f["q_rms"] = (f"{a['ref_rms'].min():.2f}–{a['ref_rms'].max():.2f}" if not a.empty
                  else missing("quality/agreement.csv"))
    pv = tables.parity_verdict(root, [q]) if q else pd.DataFrame()
    what = "training-parity runs (quality/parity_*.csv)"
    if pv.empty:
        f.update({k: missing(what) for k in ("p_band", "p_seeds", "p_start", "p_steps", "p_inside", "p_range")})
    else:
        b = pv.iloc[0]
        others = pv[pv["config"] != "baseline"]
        f.update(p_band=f"{b['band_low']:.4f}–{b['band_high']:.4f}", p_seeds=f"{b['seeds_low']:.4f}–{b['seeds_high']:.4f}",
                 p_start=f"{b['loss_step0']:.3f}", p_steps=f"{int(b['steps']):,}",
                 p_inside=f"{int(others['inside_band'].sum())} of {len(others)}",
                 p_range=f"{others['loss'].min():.4f}–{others['loss'].max():.4f}")
    per = tables.sample_agreement(root, q) if q else pd.DataFrame()
    for src in SAMPLE_SOURCES:
        row = per.loc[src] if src in per.index else None
        f[f"s_{src}_psnr"] = (missing(f"sample agreement of {src}") if row is None else
                              "identical" if row["psnr_db"] == float("inf") else f"{row['psnr_db']:.1f} dB")
        f[f"s_{src}_ssim"] = number(None if row is None else row["ssim"], ".3f", f"sample agreement of {src}")
    sb64 = tables.sample_bench(root, [q], size="64x64x64") if q else pd.DataFrame()
    fig1 = sb64[(sb64["config"] == "bf16-graphs") & (sb64["sampler"] == "ddim")] if not sb64.empty else sb64
    f["fig1_s"] = number(fig1["s_per_volume_median"].iloc[-1] if len(fig1) else None, ".2f", "64³ sample_bench row of fast")
    f.update(sampler_quality(root, q, sb))
    f.update(sampler_numerics(root, q, gpus))
    f.update(fp8_sampling(root, q, r["ref"]))
    lr = tables.long_run(root, q) if q else None
    what = "long run (quality/long_log.csv)"
    f["long_steps"] = number(lr and lr["steps"], ",", what)
    f["long_loss"] = number(lr and lr["loss_tail"], ".3f", what)
    f["long_tail"] = number(lr and lr["tail"], "d", what)
    f["long_ms"] = number(lr and lr["ms_per_step"], ".1f", what)
    return f


SAMPLER_RUNS = {"ddpm250": ("ddpm", 250, 1.0), "ddim50_eta1": ("ddim", 50, 1.0), "ddim50_eta0": ("ddim", 50, 0.0),
                "ddim250_eta0": ("ddim", 250, 0.0)}  # issue 20's comparison: fact key → (sampler, steps, η)
SAMPLER_QUALITY_CONFIGS = ("bf16-graphs", "fast-w16-tnorm-tconv")  # the denoisers whose samplers the chapter names
OFFSET_SEEN = 3e-4  # |signed mean of ε's error| above this is an offset: bf16's rounding averages below 1e-4
NUMERICS_RUNS = ("ddpm250", "ddim50_eta1")  # the SAMPLER_RUNS set beside FP32
SAMPLER_NUMERICS_CONFIGS = ("bf16-graphs", "fast-w16-tnorm-tconv", "fast-w16-tnorm-tconv-fold",
                            "fast-w16-tnorm-tconv-fold-up")  # bf16 ones set beside FP32


FP8_RUNS = ("ddpm250", "ddim50_eta0")  # the SAMPLER_RUNS of quality/precision.csv


def fp8_sampling(root: Path, q: str | None, s_gpu: str | None) -> dict[str, str]:
    """07, "FP8 convolutions": the probe of each convolution shape (``sampling/fp8_convs.csv`` of
    ``s_gpu``, the sampling GPU), one DDPM step's kernels in FP8 and bf16
    (``sampling/denoise_kernels_ddpm.csv``), and the samples of one checkpoint under FP32, bf16 and
    the FP8 configurations (``quality/precision*.csv`` of ``q``): voxel agreement with the FP32
    samples of the same runs and seeds, and quality against the real images."""
    f: dict[str, str] = {}
    what = "FP8 convolution probe (sampling/fp8_convs.csv)"
    probe = tables.fp8_convs(root, s_gpu) if s_gpu else pd.DataFrame()
    probe = probe.set_index(["cin", "cout", "side"]) if not probe.empty else probe
    for shape in ((64, 64, 128), (128, 64, 128), (128, 128, 64)):
        key = "fp8_probe_{}_{}_{}".format(*shape)
        f[f"{key}_x"] = number(_get(probe, shape, "speedup"), ".2f", what)
        f[f"{key}_bf16"] = number(_get(probe, shape, "bf16_ms"), ".2f", what)
        f[f"{key}_fp8"] = number(_get(probe, shape, "fp8_ms"), ".2f", what)
    f["fp8_probe_err"] = (missing(what) if probe.empty else
                          f"{100 * probe['fp8_rel_err'].min():.1f}–{100 * probe['fp8_rel_err'].max():.1f} %")
    f["fp8_probe_err_bf16"] = (missing(what) if probe.empty else f"{100 * probe['bf16_rel_err'].max():.2f} %")
    dk = tables.results_csv(root, [s_gpu], "sampling/denoise_kernels_ddpm") if s_gpu else pd.DataFrame()
    for cfg, key in ((FP8_BF16, "bf16"), (SAMPLING_FP8[-1], "fp8")):
        rows = dk[dk["config"] == cfg] if not dk.empty else dk
        w = f"DDPM-step kernel table of {cfg}"
        f[f"fp8_step_{key}_ms"] = number(rows["ms_per_step"].sum() if len(rows) else None, ".1f", w)
        conv = rows[rows["category"] == "convolution/GEMM"]["ms_per_step"].sum() if len(rows) else None
        f[f"fp8_step_{key}_conv_ms"] = number(conv, ".1f", w)
    what = "FP8 sample agreement (quality/precision*.csv)"
    raw = tables.precision_runs(root, q) if q else pd.DataFrame()
    f["fp8_n"] = _seeds_subjects(raw, what)
    pr = tables.precision(root, q) if q else pd.DataFrame()
    runs = pr[pr["sampler"] != "real"].set_index(["sampler", "steps", "eta", "config"]) if not pr.empty else pr
    curve = tables.plateau(tables.heldout_curve(root, q, "precision_heldout")) if q else None
    f["fp8_step"] = number(curve and curve["last_step"], ",", "quality/precision_heldout.csv")
    bar = tables.sample_agreement(root, q) if q else pd.DataFrame()
    bar_db = _get(bar, "bf16-graphs", "psnr_db")
    f["fp8_bar_db"] = number(bar_db, ".1f", "sample agreement of bf16-graphs (quality/sample_agreement.csv)")
    for run_key in FP8_RUNS:
        smp, steps, eta = SAMPLER_RUNS[run_key]
        for cfg, key in (("baseline", "fp32"), (FP8_BF16, "bf16"), (SAMPLING_FP8[0], "fp8skip"), (SAMPLING_FP8[1], "fp8")):
            r = _get(runs, (smp, steps, eta, cfg))
            k = f"fp8_{run_key}_{key}"
            _run_facts(r, k, what, f)
            if cfg == "baseline":
                continue
            f[f"{k}_shift"] = (missing(what) if r is None or "background_shift" not in r or pd.isna(r["background_shift"])
                               else f"{r['background_shift']:+.3f} ± {r['background_shift_se']:.3f}")
            f[f"{k}_psnr"] = number(None if r is None else r["psnr_vs_fp32"], ".1f", what)
            f[f"{k}_psnr_min"] = number(None if r is None else r["psnr_vs_fp32_min"], ".1f", what)
            f[f"{k}_ssim"] = number(None if r is None else r["ssim_vs_fp32"], ".3f", what)
            f[f"{k}_bar"] = (missing(what) if r is None or bar_db is None else
                             "above" if r["psnr_vs_fp32"] >= bar_db else "below")
    return f


def run_label(sampler: str, steps: int, eta: float) -> str:
    """'DDPM 250' or 'DDIM 50 (η = 1)'."""
    return f"DDPM {steps}" if sampler == "ddpm" else f"DDIM {steps} (η = {eta:g})"


def _versus_ddpm(run: pd.Series | None, ddpm: pd.Series | None, what: str, whose: str = "its") -> str:
    """A sampler run's background mean against DDPM 250's (means ± standard errors), and, where it
    misses the match criterion, by how much against the standard error of the difference."""
    from ..sample.quality import MATCH_BACKGROUND

    if run is None or ddpm is None:
        return missing(what)
    text = (f"background mean {run['background']:.2f} ± {run['background_se']:.2f} against {whose} DDPM 250's "
            f"{ddpm['background']:.2f} ± {ddpm['background_se']:.2f}")
    excess = abs(run["background"] - ddpm["background"]) - MATCH_BACKGROUND
    if excess <= 0:
        return text
    se = math.hypot(run["background_se"], ddpm["background_se"])
    return (f"{text}: {excess:.{3 if excess < 0.01 else 2}f} beyond the {MATCH_BACKGROUND:g} criterion, "
            f"{'less' if excess < se else 'more'} than the {se:.2f} standard error of the difference")


def _target_verdict(seconds: float | None, sampler: str, what: str) -> str:
    """"meets" or "misses" the sampler's target (``SAMPLING_TARGETS_S``), or ``missing(what)``."""
    return missing(what) if seconds is None else "meets" if seconds <= SAMPLING_TARGETS_S[sampler] else "misses"


def _seeds_subjects(runs: pd.DataFrame, what: str) -> str:
    """'N seeds × M held-out subjects' of sampler-run rows (the real images' rows not counted)."""
    if runs.empty:
        return missing(what)
    return f"{runs.loc[runs['sampler'] != 'real', 'seed'].nunique()} seeds × {runs['subject'].nunique()} held-out subjects"


def _batch_verdict(batches: pd.DataFrame, target: float) -> str:
    """The smallest batch of ``batches`` (sample_bench rows of one configuration and sampler, in
    batch order) whose seconds per volume meet ``target``, said as latency (batch 1) or throughput."""
    if not len(batches):
        return missing("sample_bench.csv")
    meets = batches[batches["s_per_volume_median"] <= target]
    if not len(meets):
        return f"no batch size measured ({', '.join(str(int(b)) for b in batches['batch'])}) meets it"
    batch, secs = int(meets["batch"].iloc[0]), meets["s_per_volume_median"].iloc[0]
    if batch == 1:
        return f"batch 1 already meets it ({secs:.2f} s)"
    return f"from batch {batch} on, {secs:.2f} s a volume, it meets it as throughput"


def _run_facts(run: pd.Series | None, key: str, what: str, f: dict[str, str]) -> None:
    """One sampler run of ``tables.sampler_summary`` into ``f``: its background mean ± standard
    error (``{key}_bg``), in-brain correlation (``_corr``) and match verdict (``_match``)."""
    f[f"{key}_bg"] = missing(what) if run is None else f"{run['background']:.2f} ± {run['background_se']:.2f}"
    f[f"{key}_corr"] = number(None if run is None else run["brain_corr"], ".3f", what)
    f[f"{key}_match"] = missing(what) if run is None else run["matches_ddpm250"]


def _numerics_summary(s: pd.DataFrame) -> pd.DataFrame:
    """``tables.sampler_summary`` of ``tables.sampler_numerics`` rows, indexed by (sampler, steps, η, config)."""
    summ = tables.sampler_summary(s) if not s.empty else pd.DataFrame()
    summ = summ[summ["sampler"] != "real"] if not summ.empty else summ
    return summ.set_index(["sampler", "steps", "eta", "config"]) if len(summ) else summ


def _best_sampler_quality(root: Path, q: str | None, best: str | None) -> str:
    """Whether the fastest sampler's samples were checked: against the FP32 model's DDPM 250
    samples (``sampler_numerics.csv``), against its own DDPM 250 (``samplers.csv``), or not at all."""
    if best is None:
        return missing("sample_bench.csv")
    by = _numerics_summary(tables.sampler_numerics(root, q) if q else pd.DataFrame())
    verdicts = {key: _get(by, (*SAMPLER_RUNS[key], best), "matches_ddpm250") for key in NUMERICS_RUNS}
    if any(v is not None for v in verdicts.values()):
        said = [f"its {run_label(*SAMPLER_RUNS[k])} {'matches' if v == 'yes' else 'does not match'} them"
                for k, v in verdicts.items() if v is not None]
        return ("its samples were compared with the FP32 model's DDPM 250 samples of the same trained "
                f"checkpoint (below): {' and '.join(said)}")
    sq = tables.samplers(root, q) if q else pd.DataFrame()
    if not sq.empty and best in set(sq["config"].dropna()):
        return "its samples are compared with DDPM 250's on the same trained checkpoint below"
    return ("its samples have not been compared with DDPM 250's on a trained checkpoint: only its ε agreement "
            "with FP64 (below) is measured, so its speed does not yet count for the targets")


def sampler_numerics(root: Path, q: str | None, gpus: list[str]) -> dict[str, str]:
    """07, "Are the fast samplers' samples the model's?": ε's offset from trained weights
    (``quality/agreement_trained.csv``) and the samplers of one checkpoint under the FP32 baseline and
    the bf16 configurations, each against the FP32 DDPM 250 (``quality/sampler_numerics.csv``); the
    thin convolutions' offset in isolation (``quality/thin_offset.csv`` of any of ``gpus``)."""
    f: dict[str, str] = {}
    bias = tables.eps_bias(root, [q]) if q else pd.DataFrame()
    b = bias.set_index("config") if not bias.empty else bias
    f["sn_bias_n"] = number(int(b["checkpoints"].max()) if len(b) else None, "d", "quality/agreement_trained.csv")
    off = b["worst_mean_err"] > OFFSET_SEEN if len(b) else pd.Series(dtype=bool)
    for key, which in (("sn_offset", off), ("sn_no_offset", ~off)):
        names = list(b.index[which]) if len(b) else []
        f[key] = ", ".join(f"`{n}`" for n in names) if names else (
            "none" if len(b) else missing("quality/agreement_trained.csv"))
    for cfg in SAMPLER_NUMERICS_CONFIGS:
        w = f"trained-weights ε agreement of {cfg}"
        f[f"sn_bias_{cfg}"] = sci_fact(_get(b, cfg, "mean_err"), w, signed=True)
        f[f"sn_bias_{cfg}_worst"] = sci_fact(_get(b, cfg, "worst_mean_err"), w)
        f[f"sn_l2_{cfg}"] = number(_get(b, cfg, "rel_l2"), ".3f", w)
    what = "thin-convolution offset probe (quality/thin_offset.csv)"
    probe = tables.quality_csv(root, gpus, "thin_offset")
    pr = roles(probe["gpu_slug"] if not probe.empty else [])
    mine = probe[probe["gpu_slug"] == pr["ref"]] if not probe.empty else probe
    at = mine.set_index(["conv", "bias", "engine"])["mean_err"] if len(mine) else pd.Series(dtype=float)
    f["sn_probe_gpu"] = gpu_name(pr["ref"]) if pr["ref"] else missing(what)
    for conv, key in (("output 64→1", "out"), ("stem 3→64", "stem")):
        for bias in (True, False):
            for engine in ("cudnn", "triton"):
                f[f"sn_probe_{key}_{engine}{'_bias' if bias else ''}"] = sci_fact(_get(at, (conv, bias, engine)), what, signed=True)
    what = "sampler runs of the FP32 baseline (quality/sampler_numerics.csv)"
    s = tables.sampler_numerics(root, q) if q else pd.DataFrame()
    f["sn_n"] = _seeds_subjects(s, what)
    curve = tables.plateau(tables.heldout_curve(root, q, "sampler_numerics_heldout")) if q else None
    f["sn_step"] = number(curve and curve["last_step"], ",", "quality/sampler_numerics_heldout.csv")
    by = _numerics_summary(s)
    for key in NUMERICS_RUNS:
        smp, steps, eta = SAMPLER_RUNS[key]
        for cfg in ("baseline", *SAMPLER_NUMERICS_CONFIGS):
            r = _get(by, (smp, steps, eta, cfg))
            w = f"{run_label(smp, steps, eta)} samples of {cfg} (quality/sampler_numerics.csv)"
            _run_facts(r, f"sn_{key}_{cfg}", w, f)
            f[f"sn_{key}_{cfg}_vs"] = _versus_ddpm(r, _get(by, ("ddpm", 250, 1.0, tables.NUMERICS_REFERENCE)), w,
                                                   "the FP32 model's")
    return f


def sampler_quality(root: Path, q: str | None, sb: pd.DataFrame) -> dict[str, str]:
    """07, "Which sampler is right?": the held-out loss curve to its lowest point
    (``quality/converge_heldout.csv``), the checkpoint that was sampled, every sampler run against
    the real image (``quality/samplers.csv``), and the recommended sampler with its 128³ time
    (``sb``: ``tables.sample_bench``)."""
    from ..sample.quality import MATCH_BACKGROUND

    f: dict[str, str] = {}
    what = "held-out loss curve (quality/converge_heldout.csv)"
    pl = tables.plateau(tables.heldout_curve(root, q)) if q else None
    f["cv_best_step"] = number(pl and pl["best_step"], ",", what)
    f["cv_best_loss"] = number(pl and pl["best"], ".4f", what)
    f["cv_last_step"] = number(pl and pl["last_step"], ",", what)
    f["cv_last_loss"] = number(pl and pl["last"], ".4f", what)
    f["cv_rise"] = pct(pl and pl["rise"], what)
    f["cv_verdict"] = (missing(what) if pl is None else "stopped falling" if pl["stopped"]
                       else "had not yet stopped falling")
    f["cv_ms"] = number(tables.steady_ms(root, [q], "quality/converge_timing").get(q) if q else None, ".1f",
                        "timing of the held-out run (quality/converge_timing.csv)")
    what = "held-out curve of the sampled run (quality/samplers_heldout.csv)"
    sampled = tables.plateau(tables.heldout_curve(root, q, "samplers_heldout")) if q else None
    f["sm_ckpt_step"] = number(sampled and sampled["last_step"], ",", what)
    f["sm_ckpt_loss"] = number(sampled and sampled["last"], ".4f", what)
    what = "sampler runs (quality/samplers.csv)"
    s = tables.samplers(root, q) if q else pd.DataFrame()
    summ = tables.sampler_summary(s) if not s.empty else pd.DataFrame()
    runs = summ[(summ["sampler"] != "real") & summ["clip"]] if not summ.empty else summ
    real = summ[summ["sampler"] == "real"] if not summ.empty else summ
    f["sm_n"] = (missing(what) if s.empty else
                 f"{s.loc[s['sampler'] != 'real', 'seed'].nunique()} seeds × {s['subject'].nunique()} held-out subjects")
    f["sm_real_bg"] = number(real["background"].iloc[0] if len(real) else None, ".2f", what)
    f["sm_bg_sd"] = (f"{runs['background_sd'].min():.2f}–{runs['background_sd'].max():.2f}" if len(runs)
                     else missing(what))
    by = runs.set_index(["sampler", "steps", "eta", "config"]) if len(runs) else runs
    for key, (smp, steps, eta) in SAMPLER_RUNS.items():
        for cfg in SAMPLER_QUALITY_CONFIGS:
            _run_facts(_get(by, (smp, steps, eta, cfg)), f"sm_{key}_{cfg}", f"{run_label(smp, steps, eta)} samples of {cfg}", f)
    for cfg in SAMPLER_QUALITY_CONFIGS:
        f[f"sm_ddim50_eta1_{cfg}_vs"] = _versus_ddpm(_get(by, ("ddim", 50, 1.0, cfg)), _get(by, ("ddpm", 250, 1.0, cfg)),
                                                    f"DDIM 50 and DDPM 250 samples of {cfg}")
    raw = summ[(summ["sampler"] != "real") & ~summ["clip"]] if not summ.empty else summ
    f["sm_noclip_bg"] = (f"{raw['background'].min():.1f} to {raw['background'].max():.1f}" if len(raw)
                         else missing("unclipped sampler runs"))
    f["sm_noclip_corr"] = number(raw["brain_corr"].max() if len(raw) else None, ".2f", "unclipped sampler runs")
    black = runs[(runs["background"] - real["background"].iloc[0]).abs() <= MATCH_BACKGROUND] if len(real) else runs
    f["sm_black"] = (missing(what) if not len(runs) else "none of them" if not len(black) else
                     ", ".join(f"{run_label(r.sampler, r.steps, r.eta)} of `{r.config}`" for r in black.itertuples()))
    fewer = runs[(runs["matches_ddpm250"] == "yes") & (runs["steps"] < 250)] if len(runs) else runs
    one = sb[(sb["batch"] == 1) & (sb["sampler"] == "ddim")] if not sb.empty else sb
    if len(fewer):
        ref = roles(one["gpu_slug"] if len(one) else [])["ref"]
        times = (one[one["gpu_slug"] == ref].set_index(["config", "steps", "eta"])["s_per_volume_median"]
                 if len(one) else pd.Series(dtype=float))
        fewer = fewer.assign(s=[_get(times, (r.config, r.steps, r.eta)) for r in fewer.itertuples()])
        rec = fewer.sort_values(["steps", "s"], na_position="last").iloc[0]
        f["sm_rec"] = f"{run_label(rec['sampler'], rec['steps'], rec['eta'])} under `{rec['config']}`"
        f["sm_rec_gpu"] = gpu_name(ref) if ref else missing("sample_bench.csv")
        f["sm_rec_s"] = number(rec["s"], ".2f", f"sample_bench row of {rec['config']} at η = {rec['eta']:g}")
        f["sm_rec_verdict"] = (missing("sample_bench.csv") if rec["s"] is None else
                               "meets" if rec["s"] <= SAMPLING_TARGETS_S["ddim"] else "misses")
    else:
        f.update({k: missing("sampler matching DDPM 250 with fewer steps")
                  for k in ("sm_rec", "sm_rec_gpu", "sm_rec_s", "sm_rec_verdict")})
    return f


def quality_chapter(root: Path, gpus: list[str]) -> dict[str, str]:
    """Chapter 07's facts: ``quality`` and its few-step samplers' (``few_step.facts``)."""
    from . import few_step

    return {**quality(root, gpus), **few_step.facts(root, gpus)}


CHAPTERS = {"01_setup": setup, "03_characterization": characterization, "04_interventions": interventions,
            "05_end_to_end": end_to_end, "06_beyond": beyond, "07_quality": quality_chapter}
