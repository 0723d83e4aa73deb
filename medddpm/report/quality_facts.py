"""The facts of the quality and sampling chapters (09 quality; 10 sampling; 11 few-step samplers;
12 FP8 and Fig. 1): one {name: text} for a chapter's prose (``notebook.glue_facts``), every name
always there, "—" and what is missing where the store lacks the data; GPUs named by role
(``wording.roles``: a reference GPU and a second one, from those that hold the data)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from ..core.config import DiffusionConfig
from . import quality_tables
from .present import gpu_name, register_gpus
from .wording import missing, number

SAMPLING_TARGETS_S = {"ddim": 1.0, "ddpm": 4.0}  # issue 20: seconds per 128³ volume, batch 1, H200
DDPM_STEPS = DiffusionConfig().timesteps  # denoising steps of a DDPM chain (T)
ONE_GPU = "— (one GPU in this store)"

SAMPLING_CONFIGS = ("baseline", "opt1", "bf16-graphs", "fast-w16", "fast-w16-p8", "fast-w16-p8-tnorm",
                    "fast-w16-tnorm-tconv", "fast-w16-tnorm-tconv-fold", "fast-w16-tnorm-tconv-fold-up")  # slow to fast; the fastest of these is the chapter's "fastest sampler" (their samples are the ones it checks)
SAMPLING_LEVERS = ("fast-w16-tnorm-tconv-fold-up-update", "fast-w16-tnorm-tconv-fold-up-table")  # measured beside fold-up, each alone; not candidates for the fastest sampler (their samples are fold-up's denoiser's, not checked on their own)
SAMPLING_FP8 = ("fast-w16-tnorm-tconv-fold-up-update-fp8skip", "fast-w16-tnorm-tconv-fold-up-update-fp8")  # FP8 convolutions on fold-up-update (bf16, their reference below); judged by their own section (quality/precision*.csv), not candidates for the bf16 "fastest sampler"
FP8_BF16 = "fast-w16-tnorm-tconv-fold-up-update"  # the bf16 sampler the FP8 ones add their lever to


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


def _agreement(root: Path, gpus: list[str]) -> tuple[str | None, pd.DataFrame]:
    """The reference GPU among those with quality results, and its denoiser-agreement rows."""
    q = quality_tables.quality_gpus(root, gpus)[1]
    return q, quality_tables.quality_csv(root, [q], "agreement") if q else pd.DataFrame()


def quality(root: Path, gpus: list[str]) -> dict[str, str]:
    """09, 10 and 12: sampling speed and its kernels, denoiser agreement, training parity, sample
    agreement, the samplers against the real images and FP32, FP8 sampling, the long run."""
    register_gpus(root)  # GPU names from the store's records
    sb = quality_tables.sample_bench(root, gpus)
    one = sb[sb["batch"] == 1] if not sb.empty else sb
    r = quality_tables.sampling_roles(sb)
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
    etas = quality_tables.sample_bench(root, [r["ref"]] if r["ref"] else [], every_eta=True)
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
    dk = quality_tables.denoise_categories(root, [r["ref"]] if r["ref"] else [])
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
    f["q_rms"] = (f"{a['ref_rms'].min():.2f}–{a['ref_rms'].max():.2f}" if not a.empty
                  else missing("quality/agreement.csv"))
    pv = quality_tables.parity_verdict(root, [q]) if q else pd.DataFrame()
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
    sb64 = quality_tables.sample_bench(root, [q], size="64x64x64") if q else pd.DataFrame()
    fig1 = sb64[(sb64["config"] == "bf16-graphs") & (sb64["sampler"] == "ddim")] if not sb64.empty else sb64
    f["fig1_s"] = number(fig1["s_per_volume_median"].iloc[-1] if len(fig1) else None, ".2f", "64³ sample_bench row of fast")
    lr = quality_tables.long_run(root, q) if q else None
    what = "long run (quality/long_log.csv)"
    f["long_steps"] = number(lr and lr["steps"], ",", what)
    f["long_loss"] = number(lr and lr["loss_tail"], ".3f", what)
    f["long_tail"] = number(lr and lr["tail"], "d", what)
    f["long_ms"] = number(lr and lr["ms_per_step"], ".1f", what)
    return f


SAMPLER_RUNS = {"ddpm250": ("ddpm", 250, 1.0), "ddim50_eta1": ("ddim", 50, 1.0), "ddim50_eta0": ("ddim", 50, 0.0),
                "ddim250_eta0": ("ddim", 250, 0.0)}  # issue 20's comparison: fact key → (sampler, steps, η)
SAMPLER_QUALITY_CONFIGS = ("bf16-graphs", "fast-w16-tnorm-tconv")  # the denoisers whose samples chapter 10 judged (and Fig. 1 shows)
NUMERICS_RUNS = ("ddpm250", "ddim50_eta1")  # the SAMPLER_RUNS set beside FP32


def run_label(sampler: str, steps: int, eta: float) -> str:
    """'DDPM 250' or 'DDIM 50 (η = 1)'."""
    return f"DDPM {steps}" if sampler == "ddpm" else f"DDIM {steps} (η = {eta:g})"


def _target_verdict(seconds: float | None, sampler: str, what: str) -> str:
    """"meets" or "misses" the sampler's target (``SAMPLING_TARGETS_S``), or ``missing(what)``."""
    return missing(what) if seconds is None else "meets" if seconds <= SAMPLING_TARGETS_S[sampler] else "misses"


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


def _numerics_summary(s: pd.DataFrame) -> pd.DataFrame:
    """``quality_tables.sampler_summary`` of ``quality_tables.sampler_numerics`` rows, indexed by (sampler, steps, η, config)."""
    summ = quality_tables.sampler_summary(s) if not s.empty else pd.DataFrame()
    summ = summ[summ["sampler"] != "real"] if not summ.empty else summ
    return summ.set_index(["sampler", "steps", "eta", "config"]) if len(summ) else summ


def _best_sampler_quality(root: Path, q: str | None, best: str | None) -> str:
    """Whether the fastest sampler's samples were checked: against the FP32 model's DDPM 250
    samples (``sampler_numerics.csv``), against its own DDPM 250 (``samplers.csv``), or not at all."""
    if best is None:
        return missing("sample_bench.csv")
    by = _numerics_summary(quality_tables.sampler_numerics(root, q) if q else pd.DataFrame())
    verdicts = {key: _get(by, (*SAMPLER_RUNS[key], best), "matches_ddpm250") for key in NUMERICS_RUNS}
    if any(v is not None for v in verdicts.values()):
        said = [f"its {run_label(*SAMPLER_RUNS[k])} {'matches' if v == 'yes' else 'does not match'} them"
                for k, v in verdicts.items() if v is not None]
        return ("its samples were compared with the FP32 model's DDPM 250 samples of the same trained "
                f"checkpoint (below): {' and '.join(said)}")
    sq = quality_tables.samplers(root, q) if q else pd.DataFrame()
    if not sq.empty and best in set(sq["config"].dropna()):
        return "its samples are compared with DDPM 250's on the same trained checkpoint below"
    return ("its samples have not been compared with DDPM 250's on a trained checkpoint: only its ε agreement "
            "with FP64 (below) is measured, so its speed does not yet count for the targets")
