"""The book's data layer: the paper's transcribed numbers, tables from the committed results,
the notebook runner and the rendered-HTML check."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medddpm.profiling import metrics as M
from medddpm.profiling.store import load_table
from medddpm.report import fast_tables, paper, quality_tables, tables

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "data" / "results"


def test_paper_values_are_tidy_and_sourced():
    v = paper.values(ROOT)
    assert list(v.columns) == ["figure", "gpu", "config", "subject", "metric", "value", "value_high", "qualifier",
                               "unit", "source"]
    assert (v["source"].str.contains("§") | v["source"].str.startswith("Abstract")).all()
    assert pd.to_numeric(v["value"], errors="coerce").notna().all()
    assert set(v["gpu"]) <= {"V100", "A100", "H100", "all"}
    assert set(v["config"]) <= {"baseline", "opt1", "opt2", "opt12", "all"}
    assert not v.duplicated(["figure", "gpu", "config", "subject", "metric"]).any()
    # the §6.1 numbers the issues quote
    n = paper.values(ROOT, figure="§6.1", gpu="H100", config="opt1").set_index("metric")["value"]
    assert n.to_dict() == {"norm_cycles": 0.39, "norm_instructions": 0.18, "norm_ipc": 0.95}


def test_paper_tables():
    t1 = paper.table("table1", ROOT)
    assert list(t1.columns) == ["feature", "H100", "A100", "V100"]
    assert t1.set_index("feature").loc["L2 Cache", "H100"] == "50 MB"
    assert len(paper.table("table2", ROOT)) == 8


@pytest.mark.parametrize("slug,gpu", [("h100-80gb-hbm3", "H100"), ("a100-sxm4-40gb", "A100"), ("h200", None)])
def test_paper_gpu(slug, gpu):
    assert paper.paper_gpu(slug) == gpu


def test_repo_root_is_found_from_a_subfolder(monkeypatch):
    monkeypatch.chdir(ROOT / "notebooks")
    assert paper.results_dir() == ROOT / "data" / "results"


def test_tables_from_committed_results():
    G = tables.select_gpus(RESULTS, None)
    assert G == sorted(G) and "h200" in G
    assert tables.select_gpus(RESULTS, "h200") == ["h200"]
    b = tables.bench(RESULTS, G)
    base = b[b["config"] == "baseline"]
    assert (base["speedup_vs_baseline"] == 1).all()
    c = tables.coverage(RESULTS, G)
    assert c["coverage"].between(0, 1).all() and (c["window_kernels"] == 100).all()
    w = tables.window_vs_step(RESULTS, ["h200"])
    sums = w.groupby(["gpu_slug", "config", "scope"])["share"].sum()
    np.testing.assert_allclose(sums, 1.0)
    props = tables.gpu_properties(RESULTS, G)
    assert props.set_index("gpu").loc["h200", "SMs"] == 132


def test_normalized_vs_paper_pairs_the_right_gpu():
    n = tables.normalized_vs_paper(RESULTS, ["h200", "h100-80gb-hbm3"])
    h200 = n[(n["gpu"] == "h200") & (n["config"] == "opt1")]
    assert set(h200["metric"]) == {"cycles", "instructions", "ipc"}
    assert h200["paper"].isna().all()  # the paper has no H200
    h100_base = n[(n["gpu"] == "h100-80gb-hbm3") & (n["config"] == "baseline")]
    assert (h100_base["measured"] == 1).all()


def test_abbreviations_cover_the_paper_table():
    k = tables.ncu_kernels(RESULTS, ["h200"])
    ab = tables.abbreviations(k[k["config"] == "baseline"])
    assert set(paper.table("table2", ROOT)["abbr"]) <= set(ab["abbr"])
    assert ab.loc[ab["abbr"] == "KN1", "duration_ms"].iloc[0] > 0  # sm80_xmma_fprop_implicit is measured


@pytest.mark.skipif(shutil.which("chromium") is None and not os.environ.get("CI"), reason="Debian chromium not installed")
def test_html_check_catches_a_broken_image(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(next((ROOT / "tests" / "fixtures").glob("*.png"), None) or _png(tmp_path), site / "ok.png")
    (site / "intro.html").write_text('<html><body><img src="ok.png"></body></html>')
    (site / "bad.html").write_text('<html><body><img src="missing.png"></body></html>')
    toc = tmp_path / "_toc.yml"
    toc.write_text("format: jb-book\nroot: intro\nchapters:\n  - file: bad\n  - file: gone\n")
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_book_html.py"), str(site), "--toc", str(toc)],
                       capture_output=True, text=True)
    assert p.returncode == 1
    assert "bad: image missing.png has natural size 0×0" in p.stderr and "gone: page missing" in p.stderr
    assert "book: 1 passed, 2 failed" in p.stdout


def _png(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = tmp_path / "dot.png"
    plt.figure(figsize=(1, 1)).savefig(path)
    return path


def test_chapters_are_thin_and_every_one_is_in_the_book_and_the_registry():
    """Issues 39 and 76: every chapter ≤ 200 lines of jupytext (prose and calls; logic lives in the
    package), listed in the book's table of contents (both copies) and, where it quotes facts, in
    ``report.chapters.CHAPTERS``."""
    from medddpm.report.chapters import CHAPTERS

    toc = (ROOT / "_toc.yml").read_text()
    assert (ROOT / "book" / "_toc.yml").read_text() == toc
    for nb in sorted((ROOT / "notebooks").glob("[0-9]*.py")):
        assert len(nb.read_text().splitlines()) <= 200, nb.name
        assert f"file: chapters/{nb.stem}\n" in toc or f"root: chapters/{nb.stem}\n" in toc, nb.name
        assert "{glue:text}" not in nb.read_text() or nb.stem in CHAPTERS, nb.name
    assert set(CHAPTERS) <= {nb.stem for nb in (ROOT / "notebooks").glob("[0-9]*.py")}


def test_notebooks_have_jupytext_headers_and_parameters():
    for nb in sorted((ROOT / "notebooks").glob("[0-9]*.py")):
        text = nb.read_text()
        assert "kernelspec:" in text and "format_name: percent" in text, nb
        assert '# %% tags=["parameters", "remove-cell"]' in text, nb
        for name in ("results_dir", "gpus", "measure", "size", "configs"):
            assert f"\n{name} = " in text, (nb, name)


def test_no_code_cell_shows_its_source_by_default():
    """The book shows no raw code: every code cell is folded (hide-input) or removed."""
    import jupytext

    for nb in sorted((ROOT / "notebooks").glob("[0-9]*.py")):
        for cell in jupytext.read(nb).cells:
            if cell.cell_type == "code":
                tags = set(cell.metadata.get("tags", []))
                assert tags & {"hide-input", "remove-input", "remove-cell"}, (nb.name, cell.source[:60])


def test_every_table_call_reaches_the_page():
    """A ``table(...)`` (or ``plots.no_data_text``-style) value is shown only as a cell's last
    top-level expression; inside an ``if``/``else`` it must go through ``display``, or the book
    silently drops the table."""
    import ast

    import jupytext

    for nb in sorted((ROOT / "notebooks").glob("[0-9]*.py")):
        for cell in jupytext.read(nb).cells:
            if cell.cell_type != "code" or "remove-cell" in cell.metadata.get("tags", []):
                continue
            tree = ast.parse("\n".join(l for l in cell.source.splitlines() if not l.lstrip().startswith(("%", "!"))))
            last = tree.body[-1] if tree.body else None
            for node in ast.walk(tree):
                bare = (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                        and isinstance(node.value.func, ast.Name) and node.value.func.id == "table")
                assert not bare or node is last, (nb.name, ast.unparse(node)[:80])


def test_papermill_reads_every_notebook_parameter():
    """papermill's own parser sees all five parameters with their defaults (an '=' inside a
    comment makes it skip the line, and then it warns 'unknown parameter' on every run)."""
    import jupytext
    from papermill.translators import PythonTranslator

    for nb in sorted((ROOT / "notebooks").glob("[0-9]*.py")):
        cell = next(c for c in jupytext.read(nb).cells if "parameters" in c.metadata.get("tags", []))
        params = {p.name: p.default for p in PythonTranslator.inspect(cell)}
        assert set(params) == {"results_dir", "gpus", "measure", "size", "configs"}, nb
        assert params["size"] == "128" and params["measure"] == "False", nb


def test_notebook_runner_hides_parameter_cells(tmp_path):
    import nbformat

    from medddpm.report.notebook import execute

    src = tmp_path / "01_x.py"
    src.write_text((ROOT / "notebooks" / "01_setup.py").read_text().split("# %% [markdown]")[0]
                   + '# %% tags=["parameters"]\nvalue = 1\n\n# %%\nprint(value * 2)\n')
    out = execute(src, tmp_path / "out" / "01_x.ipynb", {"value": 21})
    nb = nbformat.read(out, 4)
    tags = [c.metadata.get("tags", []) for c in nb.cells]
    assert any("injected-parameters" in t and "remove-cell" in t for t in tags)
    assert any("parameters" in t and "remove-cell" in t for t in tags)
    assert nb.cells[-1].outputs[0]["text"].strip() == "42"


def test_measuring_without_a_gpu_is_one_clear_error(tmp_path):
    p = subprocess.run(["bash", str(ROOT / "scripts" / "measure_gpu.sh"), str(tmp_path / "out"), "16"],
                       capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHON": sys.executable})
    assert p.returncode == 2 and "needs a CUDA GPU" in p.stderr
    assert not (tmp_path / "out").exists()


def test_ordered_puts_configs_in_the_papers_order():
    df = pd.DataFrame({"gpu": ["b", "a", "a", "a"], "config": ["opt1", "opt12", "baseline", "opt1"], "v": [1, 2, 3, 4]})
    out = tables.ordered(df, ["gpu", "config"])
    assert list(zip(out["gpu"], out["config"].astype(str))) == [("a", "baseline"), ("a", "opt1"), ("a", "opt12"), ("b", "opt1")]


def test_normalized_scopes_holds_window_and_whole_step():
    n = tables.normalized_scopes(RESULTS, ["h100-80gb-hbm3"])
    assert set(n["mode"]) == {"paper", "step"} and set(n["scope"]) == set(tables.SCOPES.values())
    base = n[n["config"] == "baseline"]
    np.testing.assert_allclose(base["measured"], 1.0)
    wide = tables.scope_pivot(n)
    assert ("cycles", "paper") in wide.columns and ("cycles", "whole step") in wide.columns
    assert wide.loc[("h100-80gb-hbm3", "opt1"), ("cycles", "paper")] == 0.39  # the paper's H100 value


def test_torch_kernels_drop_the_optimizer_annotation():
    t = tables.torch_kernels(RESULTS, ["h200"], "step")
    assert not t["name"].str.contains("Optimizer.step#", regex=False).any()
    b = t[t["config"] == "baseline"]
    assert b["launch"].tolist() == list(range(len(b)))


def test_measuring_ncu_runs_the_papers_window_and_a_whole_step(monkeypatch, tmp_path):
    from medddpm.report import measure

    calls = []
    monkeypatch.setattr(measure, "local_gpu_folder", lambda root: tmp_path / "gpu-x")
    monkeypatch.setattr(measure, "_run", calls.append)
    root, _ = measure.prepare(tmp_path, None, True, "ncu", 32, "baseline")
    modes = [argv[argv.index("--mode") + 1] for argv in calls]
    assert root == tmp_path and modes == ["paper", "step"]
    assert all(argv[argv.index("--size") + 1] == "32" for argv in calls)


def test_a_chapter_without_a_stage_says_where_its_data_comes_from_and_times_nothing(monkeypatch, tmp_path, capsys):
    from medddpm.report import measure

    calls = []
    monkeypatch.setattr(measure, "_run", calls.append)
    monkeypatch.setattr(measure, "local_gpu_folder", lambda root: calls.append("gpu") or tmp_path / "gpu-x")
    assert measure.render_only(tmp_path, None, False, "x.sh")[0] == tmp_path and not capsys.readouterr().out
    root, gpus = measure.render_only(tmp_path, None, True, "scripts/quality_measure.sh")
    assert root == tmp_path and gpus == [] and calls == []
    assert capsys.readouterr().out.strip().endswith("its data comes from scripts/quality_measure.sh")


def test_measuring_into_a_folder_of_another_size_stops_before_running(monkeypatch, tmp_path):
    from medddpm.core.errors import InputError
    from medddpm.report import measure

    folder = tmp_path / "gpu-x"
    folder.mkdir()
    (folder / "bench.csv").write_text("gpu,config,model,size,batch,step_ms_median\nX,baseline,whole-head,128x128x128,1,9\n")
    calls = []
    monkeypatch.setattr(measure, "local_gpu_folder", lambda root: folder)
    monkeypatch.setattr(measure, "_run", calls.append)
    for what in ("ncu", "end_to_end"):
        with pytest.raises(InputError, match="whole-head at 128x128x128"):
            measure.prepare(tmp_path, None, True, what, 32, "baseline")
    assert calls == []
    measure.prepare(tmp_path, None, True, "ncu", 128, "baseline")  # the size it holds: runs
    assert len(calls) == 2


def test_scope_pivot_for_a_gpu_the_paper_never_ran():
    wide = tables.scope_pivot(tables.normalized_scopes(RESULTS, ["h200"]))
    assert ("cycles", "paper") in wide.columns and wide[("cycles", "paper")].isna().all()
    assert wide.loc[("h200", "baseline"), ("cycles", "whole step")] == 1.0


def test_per_gpu_runs_a_figure_function_on_each_gpus_report():
    k = tables.ncu_kernels(RESULTS, ["h200", "h100-80gb-hbm3"])
    r = load_table("ncu_paper_rules", RESULTS, ["h200", "h100-80gb-hbm3"])
    prio = tables.per_gpu(M.priority_scores, k, r)
    assert set(prio["gpu"]) == {"h200", "h100-80gb-hbm3"}
    np.testing.assert_allclose(prio.groupby("gpu")["share"].sum(), 1.0)
    one = M.priority_scores(k[(k["gpu_slug"] == "h200") & (k["config"] == "baseline")],
                            r[(r["gpu_slug"] == "h200") & (r["config"] == "baseline")])
    pd.testing.assert_frame_equal(prio[prio["gpu"] == "h200"].drop(columns="gpu").reset_index(drop=True), one)
    assert tables.per_gpu(M.priority_scores, k, r.iloc[0:0]).empty


def test_metric_vs_paper_skips_relative_values_of_a_gpu_without_baseline():
    s = pd.DataFrame({"gpu": ["h100-x", "h100-x", "z"], "config": ["baseline", "opt1", "opt1"],
                      "warps_active": [4.0, 2.0, 3.0]})
    t = tables.metric_vs_paper(s, ["warps_active", "rel_warps_active"], "Fig 12")
    rel = t[t["metric"] == "rel_warps_active"].set_index("config")["measured"]
    assert rel.to_dict() == {"baseline": 1.0, "opt1": 0.5}  # 'z' has no baseline: no relative row
    assert len(t[t["metric"] == "warps_active"]) == 3 and set(t["paper GPU"]) == {"H100", "—"}


def test_ladder_from_committed_results():
    from medddpm.core.config import LADDER

    lad = fast_tables.ladder(RESULTS, ["h200"])
    assert list(lad["config"]) == [c for c in LADDER if c in set(lad["config"])]
    base = lad.set_index("config").loc["baseline"]
    assert base["speedup_vs_baseline"] == 1 and np.isnan(base["speedup_vs_previous"])
    # TFLOP/s = 3 × forward FLOPs (5.54 TFLOP at 128³) ÷ step time, and below the measured peak
    r = lad.set_index("config").loc["opt1"]
    assert r["tflops"] == pytest.approx(3 * 5_536_663_142_400 / (r["step_ms_median"] * 1e-3) / 1e12)
    assert (lad["peak_fraction"] < 1).all() and (lad["batch"] == 1).all()
    # the reproduction's tables keep the paper's five configurations only
    assert set(tables.bench(RESULTS, ["h200"], ["baseline", "opt1"])["config"]) == {"baseline", "opt1"}
    every_batch = tables.bench(RESULTS, ["h200"], ["bf16-graphs"], batch=None)
    assert sorted(every_batch["batch"]) == [1, 2, 4]
    assert set(tables.torch_kernels(RESULTS, ["h200"])["config"]) <= {"baseline", "opt1", "opt2", "opt12", "pytorch-default"}


def test_tables_for_readers_have_no_index_nan_or_slugs():
    import pandas as pd

    from medddpm.report.present import color, gpu_name, register_gpus, table

    register_gpus(RESULTS)
    df = pd.DataFrame({"gpu_slug": ["h100-80gb-hbm3", "h200"], "config": ["opt1", "bf16-graphs"],
                       "step_ms_median": [1240.4591, float("nan")], "batch": [1, 2], "channels_last": [False, True]},
                      index=[7, 9])
    html = table(df)._repr_html_()
    assert "H100 80GB HBM3" in html and "h100-80gb-hbm3" not in html and "nan" not in html.lower()
    assert "—" in html and "1,240.46" in html and ">7<" not in html and "step, ms (median)" in html
    assert "overflow-x:auto" in html  # wide tables scroll
    assert table(df.set_index("config"), index=True)._repr_html_().count("<th>") == 5
    assert gpu_name("h200 (paper)") == "H200 (paper)" and gpu_name("unknown-gpu") == "unknown-gpu"
    assert color("bf16-graphs") == color("bf16-graphs") != color("opt1") and color("other (rest)") == "#D0D0D0"
    assert color("h200") == color("H200") != color("H100 80GB HBM3") == color("H100 (paper)")
    from medddpm.report.present import sci

    assert sci(0.0013) == "1.3 × 10⁻³" and sci(8.2e8) == "8.2 × 10⁸" and sci(1.554e-05, 3) == "1.55 × 10⁻⁵"
    tiny = table(pd.DataFrame({"rel_l2": [1.554e-05]}), 4)._repr_html_()
    assert "10⁻⁵" in tiny and "e-05" not in tiny


def test_gpu_names_come_from_the_results_and_every_gpu_keeps_its_colour(tmp_path):
    """Issue 22: a GPU is named by what its results record, shortened alike for known and unknown
    GPUs, and gets the same colour in every build."""
    import json

    import pandas as pd

    from medddpm.report.present import GPU_PALETTE, color, gpu_color, gpu_name, register_gpus, short_gpu_name

    assert short_gpu_name("NVIDIA L40S") == "L40S" and short_gpu_name("NVIDIA H200") == "H200"
    assert short_gpu_name("NVIDIA H100 80GB HBM3") == "H100 80GB HBM3" and short_gpu_name("Tesla V100-SXM2-32GB") == "V100-SXM2-32GB"
    (tmp_path / "l40s").mkdir()
    (tmp_path / "l40s" / "info.json").write_text(json.dumps({"gpu": "NVIDIA L40S"}))
    (tmp_path / "rtx").mkdir()  # no info.json: the bench rows' name
    pd.DataFrame({"gpu": ["NVIDIA GeForce RTX 4090"], "config": ["opt1"]}).to_csv(tmp_path / "rtx" / "bench.csv", index=False)
    assert register_gpus(tmp_path) == {"l40s": "L40S", "rtx": "RTX 4090"}
    assert gpu_name("l40s") == "L40S" and gpu_name("rtx (paper)") == "RTX 4090 (paper)" and gpu_name("l40s-x4") == "4× L40S"
    assert color("l40s") == color("L40S") == gpu_color("L40S") in GPU_PALETTE  # fixed by the name
    assert gpu_color("H100 80GB HBM3") == gpu_color("H100") != gpu_color("H200")


def test_every_chapter_is_executed_again_on_an_incremental_build():
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("rerun_chapters", ROOT / "book" / "_ext" / "rerun_chapters.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    env = SimpleNamespace(found_docs={"intro", "chapters/01_setup", "chapters/06_beyond", "reproduce"})
    assert sorted(ext._chapters(None, env, set(), {"chapters/06_beyond"}, set())) == ["chapters/01_setup"]
    assert "rerun_chapters: book/_ext" in (ROOT / "_config.yml").read_text()


def test_loss_band_and_denoise_categories(tmp_path):
    import pandas as pd

    fp = tmp_path / "h200" / "fast_path"
    fp.mkdir(parents=True)
    (tmp_path / "h200" / "bench.csv").write_text("gpu\n")
    rows = [("baseline", 0, 0.40), ("baseline", 1, 0.42), ("bf16-graphs", 0, 0.41), ("bf16", 0, 0.45)]
    pd.DataFrame([{"config": c, "seed": s, "size": 64, "kind": "eval", "step": 50, "loss": v} for c, s, v in rows]
                 + [{"config": "bf16-graphs", "seed": 0, "size": 64, "kind": "train", "step": 1, "loss": 9.0}]
                 ).to_csv(fp / "loss_parity.csv", index=False)
    lp = fast_tables.loss_parity(tmp_path, ["h200"]).set_index(["config", "seed"])
    assert len(lp) == 4 and lp.loc[("bf16-graphs", 0), "inside_band"] and not lp.loc[("bf16", 0), "inside_band"]
    assert lp.loc[("bf16-graphs", 0), "band_seeds"] == 2 and lp.loc[("bf16", 0), "band_high"] == 0.42
    (tmp_path / "h200" / "sampling").mkdir()
    pd.DataFrame({"category": ["conv", "conv", "copy"], "short_name": ["a", "b", "c"], "launches_per_step": 1,
                  "ms_per_step": [1.0, 2.0, 0.5], "config": "bf16-graphs", "steps_profiled": 5}
                 ).to_csv(tmp_path / "h200" / "sampling" / "denoise_kernels.csv", index=False)
    per = quality_tables.denoise_categories(tmp_path, ["h200"])
    assert per.loc["conv", "bf16-graphs"] == 3.0 and list(per.index) == ["conv", "copy"]


def test_every_figure_has_a_numbered_caption():
    """A cell that draws a figure carries MyST-NB figure metadata (name + caption): the book numbers
    it and captions it; names are unique across the book."""
    import re

    import jupytext

    names = []
    for nb in sorted((ROOT / "notebooks").glob("[0-9]*.py")):
        for cell in jupytext.read(nb).cells:
            shown = "remove-cell" not in cell.metadata.get("tags", [])  # helpers defined in removed cells
            draws = "plots.finish(" in cell.source or "plots.paper_metrics(" in cell.source  # the latter calls finish
            if cell.cell_type == "code" and shown and draws:
                fig = cell.metadata.get("mystnb", {}).get("figure", {})
                assert fig.get("name") and len(fig.get("caption", "")) > 60, (nb.name, cell.source[:60])
                # MyST-NB wraps every output of the cell in the figure: tables belong in a cell of their own
                assert not re.search(r"(?<![\w.])(display|table)\(", cell.source), (nb.name, fig["name"])
                names.append(fig["name"])
    assert len(names) >= 20 and len(names) == len(set(names))


def test_subject_share_reads_categories_sums_and_kernel_names():
    k = pd.DataFrame({"kernel": ["sm80_xmma_fprop_a", "RowwiseMomentsCUDAKernel", "elementwise_kernel", "nhwcToNchw"],
                      "category": ["convolution/GEMM", "normalization", "elementwise", "layout transform"],
                      "duration_ns": [50.0, 20.0, 20.0, 10.0]})
    assert tables.subject_share(k, "convolution/GEMM", "duration_ns") == 0.5
    assert tables.subject_share(k, "normalization+elementwise+layout transform", "duration_ns") == 0.5
    assert tables.subject_share(k, "RowwiseMomentsCUDAKernel", "duration_ns") == 0.2
    assert np.isnan(tables.subject_share(k, "_5x_cudnn_volta_scudnn", "duration_ns"))  # another GPU's kernel
    t = k.rename(columns={"kernel": "name", "duration_ns": "duration_us"})  # torch.profiler's columns
    assert tables.subject_share(t, "sm80_xmma_fprop", "duration_us") == 0.5


def test_paper_values_beside_ours_in_one_long_table():
    row = pd.Series({"value": 73.0, "value_high": 80.0, "qualifier": "~"})
    assert paper.label(row) == "~73–80"
    assert paper.label(pd.Series({"value": 0.42, "value_high": np.nan, "qualifier": "="})) == "0.42"
    from medddpm.report.present import register_gpus

    register_gpus(RESULTS)  # the GPUs' recorded names, as every chapter reads them first (tables.select_gpus)
    T = tables.torch_kernels(RESULTS, ["h200"], "step")
    s8 = tables.kernel_shares_vs_paper(T, "Fig 8", "duration_us")
    paper8 = paper.values(ROOT, figure="Fig 8", metric="kernel_share_pct")
    assert (s8["series"].str.endswith("(paper)")).sum() == len(paper8)
    ours = s8[s8["series"] == "H200"].set_index("x")["value"]
    assert ours.between(0, 100).all() and "opt1: convolution/GEMM" in ours.index
    assert "baseline: _5x_cudnn_volta_scudnn" not in ours.index  # no V100 kernel here: a gap, not a zero
    K = tables.ncu_kernels(RESULTS, ["h200"], "paper")
    I = load_table("ncu_paper_instructions", RESULTS, ["h200"])
    s9 = tables.instruction_shares_vs_paper(K, I, ["Fig 9"], only_paper=True)
    assert set(s9.loc[s9["series"] == "H200", "x"]) <= set(s9.loc[s9["series"].str.endswith("(paper)"), "x"])
    cycles = tables.dominant_cycles_vs_paper(K)
    assert set(cycles["series"]) == {"H200", "V100 (paper)", "A100 (paper)", "H100 (paper)"}


def test_roofline_tables_from_the_committed_store():
    R = fast_tables.ceilings(RESULTS, ["h200", "h100-80gb-hbm3"])
    assert set(R["ceiling"]) == {"bf16 tensor", "TF32 tensor", "FP32"} and (R["tflops"] > 0).all()
    P = fast_tables.roofline(RESULTS, ["h200"], "paper", ["baseline", "opt1"])
    assert set(P["config"].astype(str)) == {"baseline", "opt1"} and len(P) == 200  # two 100-kernel windows
    conv = P[(P["config"] == "baseline") & (P["category"] == "convolution/GEMM")].nlargest(1, "duration_ns").iloc[0]
    # the FP32 counters add up to a 64→64 3³ convolution over 128³ voxels, within its epilogue
    assert conv["flops"] == pytest.approx(2 * 128**3 * 64 * 64 * 27, rel=0.01)
    S = fast_tables.roofline_summary(P, R).set_index("config")
    assert S["half_bound_share"].between(0, 1).all() and S.loc["opt1", "window_tflops"] > S.loc["baseline", "window_tflops"]
    H = fast_tables.roofline_highlights(P, R).set_index(["config", "what"])
    assert H.loc[("opt1", "conv"), "roof_tflops"] == R.set_index(["gpu_slug", "ceiling"]).loc[("h200", "TF32 tensor"), "tflops"]
    assert (H["compute_fraction"] <= 1.05).all()


def test_whole_step_roofline_counts_the_model_and_its_gap_to_the_roofs():
    """ncu roofline mode (one steady 128³ step, the configuration's own FLOP pipe): counted FLOPs
    against the model's analytic 3 × forward FLOPs, and the time above the roofline bound."""
    from medddpm.core.config import model_preset
    from medddpm.net.summary import summarize

    G = ["h200", "h100-80gb-hbm3"]
    P, R = fast_tables.roofline(RESULTS, G, "roofline"), fast_tables.ceilings(RESULTS, G)
    assert {(g, c) for g, c in P[["gpu_slug", "config"]].astype(str).drop_duplicates().itertuples(index=False)} == \
        {(g, c) for g in G for c in ("baseline", "opt1", "bf16-graphs", "fast")}
    step = 3 * summarize(model_preset("whole-head"), (128, 128, 128))["forward_flops"]
    counted = P.groupby(["gpu_slug", "config"], observed=True)["flops"].sum() / step
    # FP32, TF32 and bf16 counters each find the step's maths: 3 × forward (backward = data + weight
    # gradients) plus tile padding and (FP32 baseline) the elementwise FLOPs, never less
    assert counted.between(0.98, 1.15).all(), counted
    paths = P.groupby("config", observed=True)["path"].agg(lambda s: set(s) - {"FP32"})
    assert paths["bf16-graphs"] == paths["fast"] == {"bf16 tensor"} and paths["opt1"] == {"TF32 tensor"}
    assert paths["baseline"] == set()
    gap = fast_tables.roofline_gap(P, R)
    assert np.allclose(gap["time_ms"], gap["bound_ms"] + gap["gap_ms"])
    assert np.allclose(gap.groupby(["gpu_slug", "config"], observed=True)["gap_share"].sum(), 1)
    per = gap.groupby(["gpu_slug", "config"], observed=True)[["time_ms", "bound_ms"]].sum()
    assert (per["bound_ms"] < per["time_ms"]).all()
    assert per.loc[("h200", "bf16-graphs"), "time_ms"] == pytest.approx(P[(P["gpu_slug"] == "h200") & (P["config"] == "bf16-graphs")]
                                                                 ["duration_ns"].sum() / 1e6)
    assert fast_tables.roofline_gap(P.iloc[:0], R).empty


def test_plots_draw_paper_values_hatched_with_gaps(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from medddpm.report import plots

    data = pd.DataFrame({"x": ["a", "b", "a"], "series": ["H200", "H200", "H100 (paper)"], "value": [1.0, 2.0, 3.0],
                         "label": [None, None, "~3"]})
    ax = plots.bars(data, "x", "value", "t", "y")
    bars = [p for p in ax.patches]
    assert len(bars) == 3  # no bar where the paper gives no value for 'b'
    assert sum(1 for p in bars if p.get_hatch()) == 1
    assert [t.get_text() for t in ax.texts] == ["~3"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["H200", "H100 (paper)"]
    plots.rank_marks(ax, ["a", "b"], {"b": 1})
    assert "#1" in [t.get_text() for t in ax.texts] and ax.get_legend().get_texts()[-1].get_text() == "paper's rank"
    fig = plots.no_data("something")
    assert "something" in fig.axes[0].texts[0].get_text()
    P = fast_tables.roofline(RESULTS, ["h200"], "paper", ["opt1"])
    fig = plots.roofline(P, fast_tables.ceilings(RESULTS, ["h200"]), ["baseline", "opt1"])  # baseline absent: one panel
    assert len(fig.axes) == 1 and fig.axes[0].get_xscale() == "log"


def _store_csv(root, gpu, name, df):
    path = root / gpu / name
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False)


def test_heldout_curve_finds_where_the_loss_stopped_falling(tmp_path):
    rows = [{"step": s, "weights": w, "subject": j, "t": 1, "loss": v + 0.01 * j}
            for s, v in ((0, 0.8), (1000, 0.2), (2000, 0.1), (3000, 0.12)) for w in ("model", "ema") for j in (0, 1)]
    _store_csv(tmp_path, "g", "quality/converge_heldout.csv", pd.DataFrame(rows))
    curve = quality_tables.heldout_curve(tmp_path, "g")
    assert list(curve.columns) == ["step", "ema", "model"] and curve["ema"].iloc[0] == pytest.approx(0.805)
    low = quality_tables.plateau(curve)
    assert low["best_step"] == 2000 and low["last_step"] == 3000 and low["stopped"]
    assert low["rise"] == pytest.approx(0.125 / 0.105 - 1)
    assert not quality_tables.plateau(curve[curve["step"] <= 2000])["stopped"]  # still falling at its last point
    assert quality_tables.heldout_curve(tmp_path, "other").empty and quality_tables.plateau(pd.DataFrame()) is None


def test_sampler_tables_keep_the_newest_checkpoint_and_row(tmp_path):
    """samplers.csv is appended by every call: the newest checkpoint's newest row of each (run,
    seed, subject) counts, verdicts recomputed over all seeds; the summary has one row per run."""
    base = {"steps": 250, "eta": 1.0, "clip": True, "config": "bf16-graphs", "subject": "s", "brain_corr": 0.98,
            "psnr_db": 20.0, "ssim": 0.7, "background_std": 0.1, "matches_reference": "stale"}
    rows = [{**base, "sampler": "ddpm", "seed": 0, "background_mean": -0.1, "checkpoint": "old.pt"},
            {**base, "sampler": "real", "steps": 0, "eta": float("nan"), "config": "", "seed": 0,
             "background_mean": -0.9, "brain_corr": 1.0, "matches_reference": "", "checkpoint": "new.pt"},
            {**base, "sampler": "ddpm", "seed": 0, "background_mean": -0.5, "checkpoint": "new.pt"},
            {**base, "sampler": "ddpm", "seed": 0, "background_mean": -0.6, "checkpoint": "new.pt"},  # newer
            {**base, "sampler": "ddpm", "seed": 1, "background_mean": -0.8, "checkpoint": "new.pt"},
            {**base, "sampler": "ddim", "steps": 50, "seed": 0, "background_mean": -0.3, "checkpoint": "new.pt"}]
    _store_csv(tmp_path, "g", "quality/samplers.csv", pd.DataFrame(rows))
    s = quality_tables.samplers(tmp_path, "g")
    assert len(s) == 4 and set(s["checkpoint"]) == {"new.pt"}
    summary = quality_tables.sampler_summary(s).set_index(["sampler", "steps"])
    ddpm = summary.loc[("ddpm", 250)]
    assert ddpm["samples"] == 2 and ddpm["background"] == pytest.approx(-0.7) and ddpm["matches_ddpm250"] == "yes"
    assert ddpm["background_se"] == pytest.approx(s[s["sampler"] == "ddpm"]["background_mean"].std() / 2 ** 0.5)
    assert summary.loc[("ddim", 50), "matches_ddpm250"] == "no"  # −0.3 against −0.7
    assert quality_tables.samplers(tmp_path, "other").empty


def test_precision_tables_join_voxel_agreement_to_each_run_and_judge_against_fp32(tmp_path):
    """Issue 20 (FP8): each configuration's runs of the newest checkpoint, judged against the FP32
    baseline's DDPM 250, with their PSNR against the FP32 samples (mean and lowest); the probe's
    fastest FP8 plan per shape against bf16."""

    fp8 = "fast-w16-tnorm-tconv-fold-up-update-fp8"
    base = {"sampler": "ddpm", "steps": 250, "eta": 1.0, "clip": True, "subject": "s", "brain_corr": 0.98,
            "psnr_db": 20.0, "ssim": 0.7, "background_std": 0.1, "matches_reference": "", "checkpoint": "c.pt"}
    runs = [{**base, "config": "baseline", "seed": 0, "background_mean": -0.70},
            {**base, "config": "baseline", "seed": 1, "background_mean": -0.72},
            {**base, "config": fp8, "seed": 0, "background_mean": -0.55},
            {**base, "config": fp8, "seed": 1, "background_mean": -0.57}]  # 0.15 lighter: no match
    agree = [{k: base[k] for k in ("sampler", "steps", "eta", "clip", "subject", "checkpoint")} |
             {"config": fp8, "seed": seed, "reference": "baseline", "psnr_db": db, "ssim": 0.9}
             for seed, db in ((0, 30.0), (1, 40.0))]
    _store_csv(tmp_path, "g", "quality/precision.csv", pd.DataFrame(runs))
    _store_csv(tmp_path, "g", "quality/precision_agreement.csv", pd.DataFrame(agree))
    p = quality_tables.precision(tmp_path, "g").set_index("config")
    assert p.loc[fp8, "psnr_vs_fp32"] == pytest.approx(35.0) and p.loc[fp8, "psnr_vs_fp32_min"] == 30.0
    assert p.loc[fp8, "matches_ddpm250"] == "no" and p.loc["baseline", "matches_ddpm250"] == "yes"
    assert pd.isna(p.loc["baseline", "psnr_vs_fp32"])
    assert p.loc[fp8, "background_shift"] == pytest.approx(0.15) and p.loc[fp8, "background_shift_se"] == pytest.approx(0)
    probe = pd.DataFrame([{"impl": "torch bf16", "plan": "", "ms": 1.0, "rel_err": 0.002},
                          {"impl": "cudnn fp8", "plan": "a", "ms": 0.9, "rel_err": 0.04},
                          {"impl": "cudnn fp8", "plan": "b", "ms": 0.8, "rel_err": 0.04},
                          {"impl": "cudnn fp8", "plan": "c", "ms": float("nan"), "rel_err": float("nan")},
                          {"impl": "quantize input", "plan": "", "ms": 0.1, "rel_err": float("nan")}]).assign(
        cin=64, cout=64, side=128)
    _store_csv(tmp_path, "g", "sampling/fp8_convs.csv", probe)
    t = quality_tables.fp8_convs(tmp_path, "g").iloc[0]
    assert t["fp8_plan"] == "b" and t["speedup"] == pytest.approx(1.25)


def test_fig1_takes_the_fastest_configuration_with_samples():
    sl = pd.DataFrame({"source": ["mask", "real", "ddpm250-eta1-fast", "ddim50-eta1-fast", "ddim50-eta0-fast",
                                  "ddpm250-eta1-fast-w16", "ddim50-eta1-fast-w16"]})
    assert quality_tables.fig1_sources(sl, ("bf16-graphs", "fast-w16")) == {
        "mask": "mask", "real": "real image", "ddpm250-eta1-fast-w16": "DDPM 250 (fast-w16)",
        "ddim50-eta1-fast-w16": "DDIM 50, η = 1"}
    assert quality_tables.fig1_sources(sl[sl["source"].isin(["mask", "real"])], ("bf16-graphs",)) == {"mask": "mask", "real": "real image"}


def test_sample_bench_prefers_the_default_eta_and_reads_old_rows_as_eta_0(tmp_path):
    from medddpm.core.config import DEFAULT_ETA

    row = {"gpu": "G", "config": "bf16-graphs", "model": "whole-head", "size": "128x128x128", "batch": 1, "steps": 50,
           "sampler": "ddim"}
    old = pd.DataFrame([{**row, "s_per_volume_median": 1.0}, {**row, "sampler": "ddpm", "steps": 250,
                                                               "s_per_volume_median": 5.0}])
    _store_csv(tmp_path, "g", "sample_bench.csv", old)
    sb = quality_tables.sample_bench(tmp_path, ["g"])
    assert dict(zip(sb["sampler"], sb["eta"])) == {"ddim": 0.0, "ddpm": 1.0}
    new = pd.concat([old.assign(eta=[0.0, 1.0]), pd.DataFrame([{**row, "s_per_volume_median": 1.1, "eta": DEFAULT_ETA},
                                                               {**row, "s_per_volume_median": 0.9, "eta": 0.0}])])
    _store_csv(tmp_path, "g", "sample_bench.csv", new)
    ddim = quality_tables.sample_bench(tmp_path, ["g"]).query("sampler == 'ddim'")
    assert len(ddim) == 1 and ddim["eta"].iloc[0] == DEFAULT_ETA and ddim["s_per_volume_median"].iloc[0] == 1.1


def test_html_check_flags_raw_scientific_notation_and_issue_numbers_in_prose_only():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_book_html", ROOT / "scripts" / "check_book_html.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    page = ('<html><body><article><p>offset +8.5e-04 on average, as issue 21 asked; 8.5 × 10⁻⁴ is fine</p>'
            '<div class="cell_input docutils container"><div class="highlight"><pre>lr = 1e-4  # issue 3</pre></div>'
            '</div><p>version 2.11.0e and ISSUE-free text</p><code>1e-3</code></article></body></html>')
    failures = check.prose_failures("ch", page)
    assert len(failures) == 2
    assert "raw scientific notation" in failures[0] and "8.5e-04" in failures[0]
    assert "an issue number" in failures[1] and "issue 21" in failures[1]
    assert check.prose_failures("ch", "<p>8.5 × 10⁻⁴, 1,000 steps, 2e5x, kernel KX-08e5</p>") == []
    assert len(check.prose_failures("ch", "<p>a loss of -1e-3 here</p>")) == 1


def test_brats_workload_beside_whole_head(tmp_path):
    """Chapter 05's BraTS table: each workload's speed-up over its own FP32 baseline on the same
    GPU, TFLOP/s from 3 × the preset's forward FLOPs; a store without BraTS rows gives empty tables."""
    from medddpm.profiling.bench import COLUMNS
    from medddpm.core.io import append_rows
    from medddpm.report import workloads

    def row(config, model, size, ms):
        return {**{c: "" for c in COLUMNS}, "gpu": "G", "config": config, "model": model, "size": size, "batch": 1,
                "step_ms_median": ms, "grad_accum": 1}

    g = tmp_path / "g1"
    append_rows(g / "bench.csv", [row("baseline", "whole-head", "128x128x128", 1000.0), row("fast", "whole-head", "128x128x128", 50.0)], COLUMNS)
    assert workloads.side_by_side(tmp_path, ["g1"]).empty
    assert workloads.fig1_run(tmp_path, ["g1"]).empty and workloads.sampling(tmp_path, ["g1"]).empty
    append_rows(g / "brats" / "bench.csv", [row("baseline", "brats", "192x192x144", 4000.0), row("fast", "brats", "192x192x144", 200.0),
                                            row("fast", "brats", "192x192x144", 160.0)], COLUMNS)  # the newer row wins
    t = workloads.side_by_side(tmp_path, ["g1"]).set_index(["workload", "config"])
    assert t.loc[("BraTS 192²×144", "fast"), "speedup_vs_baseline"] == 25.0
    assert t.loc[("whole-head 128³", "fast"), "speedup_vs_baseline"] == 20.0
    flops = 3 * 21_258_180_493_312  # the reference's forward FLOPs of brats (test_model)
    assert abs(t.loc[("BraTS 192²×144", "fast"), "tflops"] - flops / 0.160 / 1e12) < 1e-6
    assert t.loc[("BraTS 192²×144", "fast"), "TFLOP a step"] == flops / 1e12


def test_the_readme_is_a_short_page_whose_headline_numbers_come_from_the_store():
    """Issue 64: the README reads in a minute (≤ 200 lines); its headline numbers are exactly
    ``headline.readme_lines`` of the committed store, each with its chapter, and its links resolve."""
    import re

    from medddpm.report.headline import readme_lines

    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    lines = readme_lines(ROOT / "data" / "results")
    section = text.split("## Headline numbers\n")[1].split("\n## ")[0]
    assert [ln for ln in section.splitlines() if ln.startswith("- ")] == lines and len(lines) >= 5
    assert all("[chapter " in ln for ln in lines)
    for link in re.findall(r"\]\(([^)#]+)\)", text):
        assert (ROOT / link).exists(), link


def test_the_store_names_its_runs_by_date_and_content_not_by_work_session():
    """Issue 64: a kept-apart run folder and a provenance key say what ran and when, never which
    working session ran it."""
    import json
    import re

    store = ROOT / "data" / "results"
    counter = re.compile(r"^session[_-]?\d+", re.IGNORECASE)
    assert not [p for p in store.rglob("*") if p.is_dir() and counter.match(p.name)]
    assert not [p for p in store.rglob("*") if re.search(r"session[_-]?\d+", p.name, re.IGNORECASE)]

    def keys(o):  # every key, at any depth
        if isinstance(o, dict):
            for k, v in o.items():
                yield k
                yield from keys(v)
        elif isinstance(o, list):
            for v in o:
                yield from keys(v)

    for prov in store.rglob("provenance*.json"):
        assert not [k for k in keys(json.loads(prov.read_text())) if counter.match(k) or k.lower() == "session"], prov
    anywhere = re.compile(rb"\bsession[ _-]?\d+", re.IGNORECASE)  # nor in a value, a table's cell or a log
    texts = [p for p in store.rglob("*") if p.suffix in {".json", ".csv", ".txt", ".log", ".jsonl", ".md"}]
    assert texts and not [p for p in texts if anywhere.search(p.read_bytes())]


def test_the_step_chapter_opens_on_todays_fast_step_per_gpu():
    """Issue 76: chapter 06's first table: per GPU, `fast`'s newest bench row against the 50 ms target, and its
    speed-ups, the same numbers as the bench rows."""
    from medddpm.report import fast_tables, tables

    store = ROOT / "data" / "results"
    G = tables.select_gpus(store, None)
    s = fast_tables.state(store, G).set_index("gpu_slug")
    b = tables.bench(store, G, ["opt1", "fast"])
    assert len(s) and set(s.index) == set(b[b["config"] == "fast"]["gpu_slug"])
    for g, row in s.iterrows():
        fast = b[(b["gpu_slug"] == g) & (b["config"] == "fast")]["step_ms_median"].iloc[-1]
        opt1 = b[(b["gpu_slug"] == g) & (b["config"] == "opt1")]["step_ms_median"].iloc[-1]
        assert row["fast step (ms)"] == fast and row["met"] == ("yes" if fast <= 50 else "no")
        assert abs(row["× OPT1 (the paper's best)"] - opt1 / fast) < 1e-9
    assert fast_tables.state(store, []).empty  # a store with no bench rows: no rows, the chapter says what is missing
