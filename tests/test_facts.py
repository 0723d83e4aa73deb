"""The book's prose facts (issue 22): one function per chapter, every quoted name always there,
'—' and what is missing where the store lacks the data, GPUs named by role from the store."""

import pytest

from book_stores import COMMITTED, REPO, STORES, referenced
from medddpm.report import (anatomy, equivalence, fast_tables, headline, quality_tables,
                            stretch, tables, waiting, wording)
from medddpm.report.chapters import CHAPTERS
from medddpm.report.present import register_gpus

GPUS = ["h100-80gb-hbm3", "h200"]


@pytest.mark.parametrize("store", list(STORES))  # the committed store: the book's own build (-W fails on an unglued name)
@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_every_quoted_fact_is_always_there(chapter, store, tmp_path):
    root = STORES[store](tmp_path / "results")
    gpus = tables.select_gpus(root, None)
    f = CHAPTERS[chapter](root, gpus)
    assert referenced(REPO / "notebooks" / f"{chapter}.py") <= set(f)
    assert all(isinstance(v, str) and v for v in f.values())
    if store == "empty":
        assert all(v.startswith("—") or v in ("none", "0") or k.startswith(("paper_", "conv_formula", "config_"))
                   or k.endswith("_target") or k in (*anatomy.STORE_FREE,
                                                  *waiting.STORE_FREE, *equivalence.STORE_FREE) for k, v in f.items()), {k: v for k, v in f.items() if not v.startswith("—")}


def test_roles_prefer_the_committed_gpus_then_any():
    assert wording.roles(["h100-80gb-hbm3", "h200", "l40s"]) == {"ref": "h200", "alt": "h100-80gb-hbm3"}
    assert wording.roles(["l40s", "a10"]) == {"ref": "a10", "alt": "l40s"}
    assert wording.roles(["h100-80gb-hbm3"]) == {"ref": "h100-80gb-hbm3", "alt": None}
    assert wording.roles([]) == {"ref": None, "alt": None}
    assert wording.roles(["h200", "h100-80gb-hbm3"], ("h100-80gb-hbm3", "h200"))["ref"] == "h100-80gb-hbm3"


def test_the_paper_configurations_state_reads_each_lever_against_what_it_changes(tmp_path):
    """Chapter 05's state table (``tables.lever_ratios``): the bench rows' step times, each lever against the one it
    changes, per GPU; a GPU without one of the two rows has no row for it, and an unknown GPU's rows are read."""
    register_gpus(COMMITTED)
    b = tables.bench(COMMITTED, GPUS, list(tables.CONFIG_ORDER))
    r = tables.lever_ratios(b).set_index(["gpu", "config"])
    ms = b.set_index(["gpu_slug", "config"])["step_ms_median"]
    assert r.loc[("h200", "opt1"), "× faster"] == ms[("h200", "baseline")] / ms[("h200", "opt1")]
    assert r.loc[("h200", "opt12"), "against"] == "opt1" and len(r) == 8
    assert tables.lever_ratios(b[b["config"] != "baseline"]).set_index("config").index.tolist() == ["opt12", "opt12"]
    root = STORES["unknown-gpu-measured-only"](tmp_path / "results")
    register_gpus(root)
    assert set(tables.lever_ratios(tables.bench(root, ["l40s"], list(tables.CONFIG_ORDER)))["gpu"]) == {"l40s"}
    assert fast_tables.state(root, ["l40s"]).empty  # no bench row of fast: no state row, not a made-up one


def test_missing_and_number_formatting():
    assert wording.number(float("nan"), ".1f", "x") == wording.missing("x") == "— (no x in this results store)"
    assert wording.number(3.14159, ".2f", "x") == "3.14" and wording.pct(0.256, "x") == "26 %"
    assert wording.pct(None, "bench row").startswith("—")
    assert wording.count(1, "GPU") == "1 GPU" and wording.count(4, "volume") == "4 volumes"


def test_headline_has_gpus_as_rows_and_only_measured_ones(tmp_path):
    register_gpus(COMMITTED)
    h = headline.headline(COMMITTED, GPUS)
    assert list(h.columns) == ["result", "scope", "GPU", "ours", "paper (H100)", "chapter"]
    assert set(h["GPU"]) == {"H200", "H100 80GB HBM3"} and h["ours"].notna().all()
    firsts = h[h["result"] != ""]
    assert not firsts.duplicated(["result", "scope"]).any() and (h.loc[h["result"] == "", "chapter"] == "").all()
    root = STORES["unknown-gpu-measured-only"](tmp_path / "results")
    register_gpus(root)
    assert set(headline.headline(root, ["l40s"])["GPU"]) == {"L40S"}


def test_kernel_tables_pick_the_best_variant_and_total_the_norms(tmp_path):
    """Issue 21's tables from a small store: the fastest kernel variant beside bf16-graphs and its
    target verdict, the norms' totals against their minimal bytes, and the convolutions against
    their isolated times."""
    import pandas as pd

    g = tmp_path / "results" / "h200"
    (g / "fast_path").mkdir(parents=True)
    cols = pd.read_csv(COMMITTED / "h200" / "bench.csv", nrows=1).columns
    rows = pd.DataFrame([dict(zip(cols, [None] * len(cols)), gpu="NVIDIA H200", config=c, model="whole-head",
                              size="128x128x128", batch=1, step_ms_median=ms, grad_accum=1)
                         for c, ms in (("bf16-graphs", 60.0), ("fast-tnorm", 52.0), ("fast-p8", 48.0))])
    rows.to_csv(g / "bench.csv", index=False)
    pd.DataFrame({"signature": ["a", "b"], "count": [2, 1], "min_forward_mb": [300.0, 100.0],
                  "min_step_mb": [800.0, 200.0], "inductor_forward_ms": [0.2, 0.1], "inductor_step_ms": [0.8, 0.2],
                  "triton_forward_ms": [0.1, 0.1], "triton_step_ms": [0.4, 0.1]}).to_csv(g / "fast_path" / "norms.csv",
                                                                                          index=False)
    pd.DataFrame({"signature": ["s1", "s1", "s2"], "pass": ["weight gradient", "other kernels of the op", "data gradient"],
                  "ms": [2.0, 0.5, 1.0], "tflops": [100.0, None, 400.0], "isolated_ms": [2.5, None, 0.8],
                  "lost_ms": [-0.5, 0.5, 0.2]}).to_csv(g / "fast_path" / "layers.csv", index=False)
    root = tmp_path / "results"
    k = fast_tables.kernel_state(root, ["h200"]).iloc[0]
    assert (k["fastest variant"], k["its step (ms)"], k["saved (ms)"], k["met"]) == ("fast-p8", 48.0, 12.0, "yes")
    n = fast_tables.norm_totals(root, ["h200"]).iloc[0]
    assert (n["shapes"], n["layers"], n["minimal GB (step)"]) == (2, 3, 1.0)
    assert n["triton step (ms)"] == pytest.approx(0.5) and n["triton step (TB/s)"] == pytest.approx(2.0)  # 1 GB in 0.5 ms
    assert n["inductor step (ms)"] == pytest.approx(1.0)
    ly = fast_tables.layer_totals(root, ["h200"]).iloc[0]
    assert (ly["convolution passes (ms)"], ly["alone at cuDNN's best (ms)"], ly["no pass (ms)"]) == (3.0, 3.3, 0.5)
    assert ly["rows slower in the step"] == "1 of 2"


def test_layer_and_thin_convolution_tables_follow_the_newest_configuration(tmp_path):
    """layers.csv holds bf16-graphs's table and a newer configuration's; the totals quote the newer one and the
    thin convolutions of both, and the thin-convolution probe's rows with the package's launch shapes."""
    import pandas as pd

    from medddpm.net import kernels

    g = tmp_path / "results" / "h200" / "fast_path"
    g.mkdir(parents=True)
    (g.parent / "info.json").write_text('{"gpu": "NVIDIA H200"}')
    rows = lambda ms: pd.DataFrame({"signature": ["64→1 k3 8³→8³", "64→64 k3 8³→8³"], "pass": ["weight gradient"] * 2,
                                    "ms": ms, "tflops": [1.0, 2.0], "isolated_ms": [1.0, 1.0], "lost_ms": [0.0, 0.0]})
    pd.concat([rows([3.0, 1.0]).assign(config="bf16-graphs"), rows([0.5, 1.0]).assign(config="fast-tconv")]).to_csv(
        g / "layers.csv", index=False)
    t = kernels.TILES
    probe = pd.DataFrame({"shape": ["64→1 k3 8³"] * 3, "pass": ["weight gradient"] * 3, "min_mb": [10.0] * 3,
                          "impl": ["cuDNN", "Triton", "Triton"], "candidate": [-1, 0, 1], "ms": [2.0, 0.5, 0.1],
                          "conv_tile": [None, t.conv_tile, t.conv_tile * 2]})
    probe.to_csv(g / "thin_convs.csv", index=False)
    ly = fast_tables.layer_totals(tmp_path / "results", ["h200"]).iloc[0]
    assert (ly["config"], ly["thin in bf16-graphs (ms)"], ly["thin convolutions (ms)"]) == ("fast-tconv", 3.0, 0.5)
    tc = fast_tables.thin_convs(tmp_path / "results", ["h200"])
    assert tc["ms_triton"].tolist() == [0.5] and tc["speedup"].tolist() == [4.0]  # the package's tiles, not the fastest
    assert len(fast_tables.layer_costs(tmp_path / "results", ["h200"], "all")) == 4
    assert set(fast_tables.layer_costs(tmp_path / "results", ["h200"], "bf16-graphs")["config"]) == {"bf16-graphs"}


def test_the_roofline_state_adds_up():
    """The whole-step rooflines (committed for both GPUs): kernel time = bound + gap, the convolutions' share of the
    gap a part of the whole, every category's bound under its time; the checks count what the formula gives."""
    RR, RW = fast_tables.ceilings(COMMITTED, GPUS), fast_tables.roofline(COMMITTED, GPUS, "roofline")
    gap = fast_tables.roofline_gap(RW, RR)
    st = fast_tables.roofline_state(gap)
    assert set(st["config"]) == {"bf16-graphs", "fast"} and set(st["gpu_slug"]) == set(GPUS)
    assert (st["at the bounds (ms)"] < st["kernel time (ms)"]).all()
    assert (st["kernel time (ms)"] - st["at the bounds (ms)"] - st["above them (ms)"]).abs().max() < 1e-9
    assert st["convolutions' share of the gap"].between(0, 1, inclusive="neither").all()
    assert (gap["bound_fraction"] <= 1 + 1e-9).all()
    checks = fast_tables.roofline_checks(COMMITTED, GPUS, fast_tables.roofline(COMMITTED, GPUS, "paper"))
    tflop = checks[checks["check"].str.startswith("paper window: longest")]
    assert len(tflop) and (tflop["value"] == f"{2 * 128**3 * 64 * 64 * 27 / 1e12:.3f}").all()


def test_the_fastest_sampler_says_whether_its_samples_were_checked(tmp_path):
    """A sampler's speed counts with its samples checked on a trained checkpoint: against the FP32
    model's DDPM 250 (quality/sampler_numerics.csv), else against its own DDPM 250
    (quality/samplers.csv), else not at all; chapter 10's targets table says which holds for each GPU's fastest
    sampler, and sets it against the targets at batch 1 and from the smallest batch that meets them."""
    import pandas as pd

    sb = quality_tables.sample_bench(COMMITTED, GPUS)
    t = quality_tables.sampling_targets(COMMITTED, sb, "h200")
    h200 = t[t["gpu_slug"] == "h200"].set_index("sampler")
    best = h200["configuration"].iloc[0]
    numerics = quality_tables.sampler_summary(quality_tables.sampler_numerics(COMMITTED, "h200"))
    mine = numerics[numerics["config"] == best].set_index(["sampler", "steps"])["matches_ddpm250"]
    for (smp, steps), label in ((("ddpm", 250), "DDPM 250"), (("ddim", 50), "DDIM 50 (η = 1)")):
        verb = "matches" if mine[(smp, steps)] == "yes" else "does not match"
        assert f"{label} against FP32 DDPM 250: {verb}" in h200["samples judged"].iloc[0]
    ddpm = h200.loc["DDPM 250"]
    assert (ddpm["met"] == "yes") == (ddpm["s a volume"] <= ddpm["target (s)"] == 4.0)
    assert ddpm["kernels alone (s)"] == pytest.approx(250 * ddpm["kernel ms a step"] / 1000)
    rows = quality_tables.fastest_rows(COMMITTED, t)
    fast = rows[(rows["gpu_slug"] == "h200") & (rows["sampler"] == "ddpm")]
    assert ddpm["met from batch"] == fast[fast["s_per_volume_median"] <= 4.0]["batch"].min()
    checked = set(quality_tables.samplers(COMMITTED, "h200")["config"].dropna())
    g = tmp_path / "results" / "h200"
    (g / "quality").mkdir(parents=True)
    raw = pd.read_csv(COMMITTED / "h200" / "sample_bench.csv")
    raw[raw["config"].isin(checked)].to_csv(g / "sample_bench.csv", index=False)  # no sampler_numerics.csv here
    (g / "quality" / "samplers.csv").write_text((COMMITTED / "h200" / "quality" / "samplers.csv").read_text())
    root = tmp_path / "results"
    t = quality_tables.sampling_targets(root, quality_tables.sample_bench(root, ["h200"]), "h200")
    assert t["configuration"].iloc[0] in checked and set(t["samples judged"]) == {"against its own DDPM 250"}
    raw[~raw["config"].isin(checked)].to_csv(g / "sample_bench.csv", index=False)
    t = quality_tables.sampling_targets(root, quality_tables.sample_bench(root, ["h200"]), "h200")
    assert t["configuration"].iloc[0] not in checked and set(t["samples judged"]) == {"not judged"}


def test_stretch_tables_compare_the_same_gpus_rows_and_judge_parity_against_the_band(tmp_path):
    """Issue 40's levers: the step times of fast and its lever rungs from one GPU's bench rows, the
    fastest rung against that GPU's target, the knobs each adds, and each parity seed against the
    FP32 baseline's band (here the same GPU's)."""
    import pandas as pd

    g = tmp_path / "results" / "h100-80gb-hbm3"
    (g / "quality").mkdir(parents=True)
    (g / "fast_path" / "fp8_forward").mkdir(parents=True)
    cols = pd.read_csv(COMMITTED / "h200" / "bench.csv", nrows=1).columns
    pd.DataFrame([dict(zip(cols, [None] * len(cols)), gpu="NVIDIA H100 80GB HBM3", config=c, model="whole-head",
                       size="128x128x128", batch=1, step_ms_median=ms, grad_accum=1)
                  for c, ms in (("fast", 52.0), ("fast-fp8fwd", 45.0), ("fast-skipgrad", 51.5))]).to_csv(g / "bench.csv", index=False)
    rows = lambda cfg, seed, loss: [{"config": cfg, "seed": seed, "size": 64, "step": s, "subject": "a", "t": 1,
                                     "loss": 0.8 if s == 0 else loss} for s in (0, 1000)]
    base = [r for seed, loss in ((0, 0.150), (1, 0.151), (2, 0.152)) for r in rows("baseline", seed, loss)]
    pd.DataFrame(base).to_csv(g / "quality" / "parity_heldout.csv", index=False)
    fp8 = [r for seed, loss in ((0, 0.151), (1, 0.30)) for r in rows("fast-fp8fwd", seed, loss)]
    pd.DataFrame(fp8).to_csv(g / "fast_path" / "fp8_forward" / "parity_heldout.csv", index=False)
    st = stretch.state(tmp_path / "results", ["h100-80gb-hbm3"]).iloc[0]
    assert (st["fast (ms)"], st["fastest rung"], st["its step (ms)"], st["saved (ms)"], st["stretch target (ms)"]) == \
        (52.0, "fast-fp8fwd", 45.0, 7.0, 44.0)
    assert st["met"] == "no"  # 45 ms against 44
    assert stretch.lever_kernels(tmp_path / "results", ["h100-80gb-hbm3"], stretch.FP8_FORWARD).empty  # no tables
    register_gpus(tmp_path / "results")  # as the chapters' loader does (tables.load): names from bench.csv
    par = stretch.parity(tmp_path / "results", ["h100-80gb-hbm3"])
    assert par["inside_band"].tolist() == [True, False] and set(par["band_gpu"]) == {"H100 80GB HBM3"}
    steps = stretch.lever_steps(tmp_path / "results", ["h100-80gb-hbm3"]).set_index("config")
    assert steps.loc["fast-fp8fwd", "adds"] == "fp8_train_convs" and steps.loc["fast", "adds"] == "—"
    assert steps.loc["fast-skipgrad", "vs_fast_ms"] == pytest.approx(-0.5)
    assert steps.loc["fast-fp8fwd", "above_target_ms"] == pytest.approx(1.0)


def test_what_remains_is_the_best_profiled_rung_against_fasts_bounds():
    """On the committed H100 store: the best lever rung with profiler tables is set against fast's
    per-category roofline bounds, and its total row adds the categories up."""
    rem = stretch.remaining(COMMITTED, ["h100-80gb-hbm3"])
    if rem.empty:
        pytest.skip("the committed store has no ncu roofline of fast or no lever tables")
    steps = stretch.lever_steps(COMMITTED, ["h100-80gb-hbm3"]).set_index("config")["step_ms"]
    best = rem["best"].iloc[0]
    profiled = {p.parent.name for p in (COMMITTED / "h100-80gb-hbm3").glob("fast-*/torch_step_kernels.parquet")}
    assert best == min((c for c in stretch.LEVER_RUNGS if c in profiled and c in steps), key=steps.get)
    cats, total = rem[rem["category"] != "all kernels"], rem[rem["category"] == "all kernels"].iloc[0]
    for col in ("bound_ms", "fast_ms", "best_ms", "above_bound_ms"):
        assert total[col] == pytest.approx(cats[col].sum())
    assert rem["above_bound_ms"].to_numpy() == pytest.approx((rem["best_ms"] - rem["bound_ms"]).to_numpy())
