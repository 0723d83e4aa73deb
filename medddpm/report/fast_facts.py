"""The facts of the fast-path chapters (06 the ladder, parity, the loop and several GPUs; 07 the
kernels; 08 the roofline), one function per chapter, as ``facts`` says: every name always there,
"—" and what is missing where the store lacks the data."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from ..core.config import CONFIGS, KERNEL_VARIANTS, LADDER
from ..net.kernels import THIN
from . import fast_tables, history, tables
from .facts import NORM_METRICS, STEP_TARGET_MS, _get, _names, _worst_agreement, gpu_list
from .present import gpu_name, register_gpus
from .wording import missing, number, pct, roles


def _ladder_facts(root: Path, gpus: list[str], f: dict[str, str]) -> dict[str, str | None]:
    """The ladder's facts into ``f`` (step times of every rung on the reference and second GPU,
    ``fast`` (the last rung) against the baseline, OPT1, the bf16 peak and the 50 ms target); returns the roles."""
    lad = fast_tables.ladder(root, gpus)
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
    """Into ``f``, from ``fast_tables.roofline_gap``: ``config``'s kernel time, roofline bound and gap
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
    kv = fast_tables.kernel_variants(root, gpus)
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
    lp = fast_tables.loss_parity(root, gpus)
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
    ly = fast_tables.layer_costs(root, gpus)
    lr = roles(ly["gpu_slug"] if not ly.empty else [])
    f["ly_gpu"] = gpu_name(lr["ref"]) if lr["ref"] else missing("fast_path/layers.csv")
    mine = ly[ly["gpu_slug"] == lr["ref"]] if not ly.empty else ly
    what = "fast_path/layers.csv"
    f["ly_config"] = str(mine["config"].iloc[0]) if len(mine) else missing(what)
    every = fast_tables.layer_costs(root, [lr["ref"]], "all") if lr["ref"] else ly
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
    tc = fast_tables.thin_convs(root, gpus)
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
    """One GPU's convolution passes of ``fast_tables.layer_costs`` (rows with an isolated time): their
    time in the step, the same shapes' isolated best, and how many rows run slower in the step."""
    passes = rows[rows["isolated_ms"].notna()] if len(rows) else rows
    f[f"{key}_conv_ms"] = number(passes["ms"].sum() if len(passes) else None, ".1f", what)
    f[f"{key}_isolated_ms"] = number(passes["isolated_ms"].sum() if len(passes) else None, ".1f", what)
    f[f"{key}_above"] = number(int((passes["lost_ms"] > 0).sum()) if len(passes) else None, "d", what)
    f[f"{key}_rows"] = number(len(passes) if len(passes) else None, "d", what)
    return passes


def beyond(root: Path, gpus: list[str]) -> dict[str, str]:
    """06: the fast-path ladder, where its step's kernel time goes, parity, the loop and several GPUs."""
    register_gpus(root)  # GPU names from the store's records
    f: dict[str, str] = {}
    r = _ladder_facts(root, gpus, f)
    t = tables.torch_kernels(root, gpus, "step", ["bf16-graphs"])
    conv = t[t["category"] == "convolution/GEMM"].groupby("gpu_slug")["duration_us"].sum() / 1e3 if not t.empty else {}
    total = t.groupby("gpu_slug")["duration_us"].sum() / 1e3 if not t.empty else {}
    c, tot = _get(pd.Series(conv, dtype=float), r["ref"]), _get(pd.Series(total, dtype=float), r["ref"])
    f["ref_fast_conv_ms"] = number(c, ".1f", "torch.profiler step table of fast")
    f["ref_fast_kernel_ms"] = number(tot, ".1f", "torch.profiler step table of fast")
    f["ref_fast_other_ms"] = number(tot - c if c is not None and tot is not None else None, ".1f",
                                    "torch.profiler step table of fast")
    _parity_facts(root, gpus, f)
    sc, _ = fast_tables.scaling(root)
    earlier = fast_tables.scaling_earlier(root)
    f.update(loop_facts(fast_tables.loop_vs_bench(root, gpus), sc, earlier))
    f.update(scaling_facts(sc))
    return f


def _scaling_line(rows: pd.DataFrame, what: str, accum: int = 1) -> str:
    """"52.2 → 55.0 / 55.8 ms/step on 1 → 2 / 4 GPUs (94.9 % / 93.5 %, machine)" of one configuration's
    rows at grad-accum ``accum`` (1 GPU and more), or a no-data line naming ``what``."""
    rows = rows[rows["grad_accum"] == accum].sort_values("world_size") if len(rows) else rows
    multi = rows[rows["world_size"] > 1] if len(rows) else rows
    if not len(multi) or not (rows["world_size"] == 1).any():
        return missing(what)
    return (f"{rows['step_ms_median'].iloc[0]:.1f} → " + " / ".join(f"{ms:.1f}" for ms in multi["step_ms_median"])
            + " ms/step on 1 → " + " / ".join(str(n) for n in multi["world_size"]) + " GPUs ("
            + " / ".join(f"{100 * e:.1f} %" for e in multi["scaling_efficiency"]) + f", {gpu_name(rows['machine'].iloc[0])})")


def _widest(rows: pd.DataFrame) -> str | None:
    """The machine whose rows reach the most GPUs (then the most rows, then the first name): where a
    configuration's scaling facts come from when several machines measured it."""
    if not len(rows):
        return None
    g = rows.groupby("machine").agg(n=("world_size", "max"), rows=("world_size", "size"))
    return str(g.sort_values(["n", "rows"], ascending=False, kind="stable").index[0])


def scaling_facts(sc: pd.DataFrame) -> dict[str, str]:
    """Today's ``fast`` on 1 → N GPUs (one flat bf16 all-reduce after the backward), on the machine that ran it on the
    most GPUs (``_widest``), and how many of its rows reach the scaling target; its gradient settings."""
    now = sc[sc["config"] == "fast"] if len(sc) else sc
    widest = _widest(now)
    return {"fast_scaling": _scaling_line(now[now["machine"] == widest] if widest else now, "fast rows in scaling.csv"),
            "fast_within": _within(now[now["grad_accum"] == 1] if len(now) else now, "fast rows on several GPUs"),
            "config_fast_reduce": CONFIGS["fast"].grad_reduce, "config_fast_buckets": str(CONFIGS["fast"].grad_buckets)}


def _parity_facts(root: Path, gpus: list[str], f: dict[str, str]) -> None:
    """The short-training loss parity (lp_) into ``f``: the baseline's seed band, ``bf16-graphs``'s loss."""
    lp = fast_tables.loss_parity(root, gpus)
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


def kernels(root: Path, gpus: list[str]) -> dict[str, str]:
    """07: ``fast``'s kernel levers, the norms against their minimal bytes, the convolutions layer by
    layer, the thin convolutions on their own."""
    register_gpus(root)
    f: dict[str, str] = {}
    _kernel_facts(root, gpus, f)
    return f


def roofline(root: Path, gpus: list[str]) -> dict[str, str]:
    """08: the rooflines of a whole step and of the paper's window, the gap to the bounds, cuDNN's
    every-algorithm run, ``bf16-graphs`` in the paper's metrics."""
    from ..profiling.categories import conv_pass

    register_gpus(root)
    f: dict[str, str] = {}
    r = _ladder_facts(root, gpus, f)
    roofs = fast_tables.ceilings(root, gpus)
    rw = fast_tables.roofline(root, gpus, "roofline")
    f["roof_step_gpus"] = gpu_list(rw["gpu_slug"]) if not rw.empty else "none"
    passes = tables.results_csv(root, gpus, "fast_path/ncu_passes")
    by_path = passes.groupby("flop_paths")["passes"].max() if not passes.empty else pd.Series(dtype=float)
    f["passes_tensor"] = number(_get(by_path, "bf16"), "d", "fast_path/ncu_passes.csv")
    f["passes_fp32"] = number(_get(by_path, "fp32"), "d", "fast_path/ncu_passes.csv")
    nfast = rw.loc[rw["config"] == "bf16-graphs"].groupby("gpu_slug").size().max() if not rw.empty else None
    f["fast_step_kernels"] = number(None if nfast is None or nfast != nfast else int(nfast), ",", "roofline report of fast")
    sr = roles(rw["gpu_slug"] if not rw.empty else [])
    f.update(_names(sr, "step_"))
    gap = fast_tables.roofline_gap(rw, roofs)
    hi = fast_tables.roofline_highlights(rw, roofs)
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
    rp = fast_tables.roofline(root, gpus, "paper")
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
    wh = fast_tables.roofline_highlights(rp, roofs)
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
    rs = fast_tables.roofline_summary(rp, roofs)
    rs = rs.set_index(["gpu_slug", "config"]) if not rs.empty else pd.DataFrame(columns=["no_flops_share"])
    f["win_opt12_no_flops_share"] = pct(_get(rs, (wr["ref"], "opt12"), "no_flops_share"), "ncu report of opt12")
    return f


LOOP_TARGET = 1.03  # loop / bench per micro-batch: the loop may add at most 3 % to its benchmark
SCALING_TARGET = 0.97  # T(1 GPU) / T(N GPUs) of the real loop, weak scaling


def _within(rows: pd.DataFrame, what: str) -> str:
    """"k of n": how many of ``rows``' several-GPU rows reach ``SCALING_TARGET``; "—" naming ``what``
    where there is none."""
    multi = rows[rows["world_size"] > 1] if len(rows) else rows
    return (f"{int((multi['scaling_efficiency'] >= SCALING_TARGET).sum())} of {len(multi)}" if len(multi)
            else missing(what))


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
    f["scaling_within"] = _within(sc, "scaling.csv")
    eff = multi["scaling_efficiency"] if len(multi) else None
    f["scaling_range"] = f"{100 * eff.min():.1f}–{100 * eff.max():.1f} %" if eff is not None else missing("scaling.csv")
    for cfg in ("opt1", "bf16-graphs"):
        # the machine of the earlier run where there is one (the prose sets the two side by side)
        ran = earlier.loc[earlier["config"] == cfg, "machine"] if not earlier.empty else pd.Series(dtype=str)
        here = sc[sc["machine"] == ran.iloc[0]] if len(ran) and not sc.empty and (sc["machine"] == ran.iloc[0]).any() else sc
        f[f"{cfg}_machine"] = gpu_name(here["machine"].iloc[0]) if len(here) else missing("scaling.csv")
        for accum in (1, 2):
            key = f"{cfg}_a{accum}"
            at = here[here["world_size"] > 1] if not here.empty else here
            row = at[(at["config"] == cfg) & (at["grad_accum"] == accum)] if not at.empty else at
            f[f"{key}_eff"] = f"{100 * row['scaling_efficiency'].iloc[0]:.1f} %" if len(row) else missing("row")
            one = here[(here["config"] == cfg) & (here["grad_accum"] == accum) & (here["world_size"] == 1)] \
                if not here.empty else here
            f[f"{key}_ms"] = (f"{one['step_ms_median'].iloc[0]:.1f} → {row['step_ms_median'].iloc[0]:.1f}"
                              if len(row) and len(one) else missing("row"))
    return f


def scaling_history(root: Path) -> pd.DataFrame:
    """Chapter 06's multi-GPU history: every machine folder's ``history.json`` (``report.history``), oldest first."""
    return history.table(root, sorted(p.name for p in Path(root).glob("*") if (p / history.FILE).is_file()), "")
