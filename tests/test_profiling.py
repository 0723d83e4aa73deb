"""Profiling: parsers and figure metrics on real ncu exports (tests/fixtures/ncu, captured on an
H200) and on the committed results, plus the ncu wrapper's error paths with a fake ncu."""
import json
import stat
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medddpm.cli import main
from medddpm.profiling import metrics as M
from medddpm.profiling.categories import abbreviation, category, conv_pass, short_name
from medddpm.core.config import run_config
from medddpm.profiling.ncu import (STEP_SETS, ProfilerError, check_output, flop_paths, ncu_command, profile_config,
                                   progress, roofline_metrics, step_metrics)
from medddpm.core.errors import InputError
from medddpm.profiling.store import check_one_setup, gpus, load_bench, load_table, setups_held, update_env
from medddpm.profiling.tidy import METRICS, nvtx_path, parse_raw, tidy, to_number
from medddpm.profiling.torchprof import kernels_only, window_coverage

FIX = Path(__file__).parent / "fixtures" / "ncu"
RESULTS = Path(__file__).parents[1] / "data" / "results"


@pytest.fixture(scope="module")
def tables():
    return tidy(FIX / "tiny_raw.csv.gz", FIX / "tiny_details.csv.gz", FIX / "tiny_instances.csv.gz")


def test_numbers_and_nvtx():
    assert to_number("7,863") == 7863 and to_number("44,500,000,000") == 4.45e10
    assert np.isnan(to_number("")) and np.isnan(to_number("n/a")) and np.isnan(to_number("nan"))
    cell = '695  "<default domain>:train_step:none:none"  "<default domain>:forward:none:none" '
    assert nvtx_path(cell) == "train_step/forward"


def test_raw_page_of_a_real_export(tables):
    k = tables["kernels"]
    assert len(k) == 8 and list(k["id"]) == list(range(8))
    assert (k["nvtx"] == "train_step/forward").all()
    assert k["duration_ns"].tolist()[:2] == [2560.0, 2464.0]  # values as exported, commas removed
    assert k["instructions"].iloc[0] == 1988 and k["cycles"].iloc[0] == 5047
    # IPC ≈ instructions / (active cycles × SMs) is not exact, but must be positive and finite
    assert (k["ipc"] > 0).all() and k["l2_hit_pct"].between(0, 100).all()
    assert k["l1_hit_pct"].notna().all()  # the section-prefixed empty copy does not win
    for ours in METRICS:
        assert ours in k


def test_missing_nvtx_columns_and_units_row(tmp_path):
    rows = ['"ID","Kernel Name","gpu__time_duration.sum","smsp__inst_executed.sum"',
            '"","","ns","inst"', '"0","void k<int>(int)","1,024","2,000"']
    p = tmp_path / "raw.csv"
    p.write_text("==PROF== noise before the table\n" + "\n".join(rows) + "\n")
    k = parse_raw(p)
    assert k.loc[0, "duration_ns"] == 1024 and k.loc[0, "nvtx"] == "" and k.loc[0, "short_name"] == "k"
    assert np.isnan(k.loc[0, "ipc"])  # not collected → NaN, not an error


def _raw(tmp_path, name, units, values):
    rows = ['"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_read.sum.per_second",'
            '"sm__cycles_elapsed.avg.per_second"', ",".join(f'"{u}"' for u in ["", "", *units])]
    rows += [",".join(f'"{c}"' for c in [str(i), "void k<int>(int)", *v]) for i, v in enumerate(values)]
    p = tmp_path / name
    p.write_text("\n".join(rows) + "\n")
    return p


def test_units_row_is_honoured(tmp_path):
    """ncu's default --print-units auto: us/ms, Kbyte/Mbyte, Gbyte/second, Ghz all become base units."""
    durations_us = ["100.00", "120.00", "111.44", "110.00", "120.00"]  # 561.44 us in all
    auto = _raw(tmp_path, "auto.csv", ["us", "Mbyte", "Gbyte/second", "Ghz"],
                [[d, "1.50", "2.25", "1.98"] for d in durations_us])
    base = _raw(tmp_path, "base.csv", ["ns", "byte", "byte/s", "hz"],
                [[f"{float(d) * 1e3:,.0f}", "1,500,000", "2,250,000,000", "1,980,000,000"] for d in durations_us])
    a, b = parse_raw(auto), parse_raw(base)
    assert a["duration_ns"].sum() == pytest.approx(561_440)
    pd.testing.assert_frame_equal(a, b)
    mixed = _raw(tmp_path, "ms.csv", ["ms", "Kbyte", "byte/usecond", "cycle/nsecond"], [["0.5", "2", "3", "1.5"]])
    assert parse_raw(_raw(tmp_path, "k.csv", ["us", "%/Kbyte", "Kbyte/cycle", "hz"], [["1", "1.5", "2", "3"]])
                     ).iloc[0]["dram__bytes_read.sum"] == 1500  # ncu's base: 1.5 %/Kbyte → 1,500 %/byte
    k = parse_raw(mixed).iloc[0]
    assert (k["duration_ns"], k["dram__bytes_read.sum"]) == (500_000, 2000)
    assert (k["dram__bytes_read.sum.per_second"], k["sm__cycles_elapsed.avg.per_second"]) == (3e6, 1.5e9)


def test_real_exports_in_auto_and_base_units_give_the_same_tables():
    """The same 8 H200 kernels exported twice by ncu 2025.3 (--print-units auto and base; see
    tests/fixtures/ncu/README.md). Same columns and kernels; values agree to the rounding of the
    base export, which prints at most 2 decimals (0.23 where auto prints 0.227704)."""
    a, b = parse_raw(FIX / "units_auto.csv.gz"), parse_raw(FIX / "units_base.csv.gz")
    assert list(a.columns) == list(b.columns) and a["kernel"].tolist() == b["kernel"].tolist()
    assert a["duration_ns"].tolist() == b["duration_ns"].tolist() == [1888, 2432, 2496, 2752, 2784, 2848, 3168, 2432]
    numeric = [c for c in a.columns if a[c].dtype.kind == "f"]
    np.testing.assert_allclose(a[numeric].to_numpy(), b[numeric].to_numpy(), rtol=1e-3, atol=5e-3)
    # the units that needed a conversion all occur in the auto export: us, Kbyte, Mbyte, Gbyte/s, Ghz, sector/ns …
    assert a["dram__bytes.sum.per_second"].iloc[0] == pytest.approx(2_169_491_525, rel=1e-6)


def test_unknown_unit_is_refused_not_guessed(tmp_path):
    p = _raw(tmp_path, "odd.csv", ["us", "furlong", "byte/s", "hz"], [["1", "2", "3", "4"]])
    with pytest.raises(InputError, match=r"unknown unit.*'furlong' \(column 'dram__bytes_read.sum'\)"):
        parse_raw(p)


def test_zero_kernel_and_wrong_files_are_clear_errors(tmp_path):
    p = tmp_path / "empty.csv"
    p.write_text('"ID","Kernel Name","gpu__time_duration.sum"\n"","","ns"\n')
    with pytest.raises(ValueError, match="zero kernels"):
        parse_raw(p)
    q = tmp_path / "x.csv"
    q.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not an ncu CSV"):
        parse_raw(q)


def test_rules_and_instances(tables):
    rules = tables["rules"]
    assert {"id", "rule", "type", "speedup_pct"} <= set(rules.columns)
    assert rules["speedup_pct"].dropna().between(0, 100).all()
    assert not rules.duplicated().any()
    ins = tables["instructions"]
    assert set(ins["class"]) >= {"Integer", "Floating Point", "Control", "Load/Store"}
    per_kernel = ins.groupby("id")
    np.testing.assert_allclose(per_kernel["share"].sum(), 1.0)
    # the class counts add up to the kernel's executed instructions
    totals = per_kernel["count"].sum()
    k = tables["kernels"].set_index("id")
    np.testing.assert_allclose(totals, k.loc[totals.index, "instructions"])


@pytest.mark.parametrize("name,short,cat,abbr", [
    ("sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw_tilesize256x64x8_execute_kernel__5x_cudnn",
     None, "convolution/GEMM", "KN1"),
    ("sm90_xmma_fprop_implicit_gemm_tf32f32_nhwc_execute_kernel", None, "convolution/GEMM", "KN2"),
    ("void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<float, float>(long, float, const T1 *, T2 *, T2 *)",
     "RowwiseMomentsCUDAKernel", "normalization", "KN3"),
    ("void at::native::elementwise_kernel<128, 2, lambda>(int, T3)", "elementwise_kernel", "elementwise", "KN4"),
    ("void cudnn::ops::nhwcToNchwKernel<float, float, float, true, false>(cudnn::ops::nhwc2nchw_params_t<T3>, const T1 *, T2 *)",
     "nhwcToNchwKernel", "layout transform", "KN5"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, T2, T3)",
     "vectorized_elementwise_kernel", "elementwise", None),
    ("void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda lambda>(int)", None, "copy", None),
    ("void at::native::(anonymous namespace)::ComputeInternalGradientsCUDAKernel<float>(long)", None, "normalization", None),
    ("void at::native::reduce_kernel<512, 1, ReduceOp<float>>(T3)", "reduce_kernel", "reduction", None),
    ("_bwd_dx_kernel", "_bwd_dx_kernel", "normalization", None),  # medddpm/net/kernels.py's GroupNorm
    ("_stats_kernel", "_stats_kernel", "normalization", None),
])
def test_categories_and_abbreviations(name, short, cat, abbr):
    if short:
        assert short_name(name) == short
    assert category(name) == cat
    got = abbreviation(name)
    if abbr:
        assert got == abbr
    else:
        assert got.startswith("KX-") and got == abbreviation(name)  # stable


def test_figure_metrics_on_real_export(tables):
    k, r, ins = tables["kernels"], tables["rules"], tables["instructions"]
    mix = M.kernel_mix(k)
    assert mix["share"].sum() == pytest.approx(1.0)
    pr = M.priority_scores(k, r)
    assert (pr["priority"] >= 0).all()
    assert pr["priority"].sum() <= k["duration_ns"].sum()  # speedups are clamped to [0, 1]
    stack = M.ipc_stack(k, ins, top=3)
    assert stack["id"].nunique() == 3
    np.testing.assert_allclose(stack.groupby("id")["ipc_part"].sum(), stack.groupby("id")["ipc"].first())
    s = M.report_summary(k)
    assert s["kernels"] == 8 and s["ipc_geomean"] > 0 and s["stall_long_scoreboard"] > 0
    assert M.instruction_mix(ins)["share"].sum() == pytest.approx(1.0)


def test_conv_pass_reads_the_pass_from_cudnn_names():
    assert conv_pass("sm80_xmma_wgrad_implicit_gemm_indexed_bf16bf16_bf16f32_f32_nhwckrsc_nhwc") == "weight gradient"
    assert conv_pass("sm90_xmma_dgrad_implicit_gemm_bf16bf16") == "data gradient"
    assert conv_pass("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32") == "forward convolution"
    assert conv_pass("RowwiseMomentsCUDAKernel") is None


def test_priority_takes_the_largest_rule_not_the_sum():
    k = pd.DataFrame({"id": [0, 1], "category": ["a", "b"], "duration_ns": [100.0, 100.0]})
    r = pd.DataFrame({"id": [0, 0, 1, 1], "type": ["OPT", "OPT", "OPT", "INF"], "speedup_pct": [30, 50, 250, 90.0]})
    out = M.priority_scores(k, r).set_index("category")["priority"]
    assert out["a"] == 50 and out["b"] == 100  # max(30, 50) %; 250 % clamped to 1; INF ignored


def test_normalization_and_geomean():
    s = pd.DataFrame({"gpu": ["g", "g"], "config": ["baseline", "opt1"], "cycles": [10.0, 4.0], "ipc_geomean": [2.0, 1.0]})
    n = M.normalized(s).set_index("config")
    assert n.loc["opt1", "cycles"] == pytest.approx(0.4) and n.loc["baseline", "ipc_geomean"] == 1
    assert M.geomean(pd.Series([1.0, 4.0, np.nan, 0.0])) == pytest.approx(2.0)


def test_window_coverage():
    first = pd.DataFrame({"duration_us": [1.0] * 200})
    step = pd.DataFrame({"duration_us": [2.0] * 150})
    c = window_coverage(first, step)
    assert c["window_kernels"] == 100 and c["coverage"] == pytest.approx(100 / 300)


def test_user_annotations_are_not_kernels():
    names = ["void f<4>(x)::{lambda()#1}", "Optimizer.step#Adam.step", "sm90_xmma_fprop", "Optimizer.zero_grad#SGD.zero_grad"]
    k = kernels_only(pd.DataFrame({"name": names, "duration_us": [1.0, 9.0, 2.0, 3.0], "launch": range(4)}))
    assert k["name"].tolist() == [names[0], names[2]] and k["launch"].tolist() == [0, 1]


def test_results_store_loads_every_gpu():
    found = gpus(RESULTS)
    assert {"h200", "h100-80gb-hbm3"} <= set(found)
    bench = load_bench(RESULTS)
    from medddpm.core.config import CONFIGS, LADDER, PAPER_CONFIGS

    assert set(PAPER_CONFIGS) <= set(bench["config"]) <= set(CONFIGS)
    for g in ("h200", "h100-80gb-hbm3"):  # the whole ladder on both GPUs, and fast at batch 1, 2 and 4
        assert set(LADDER) <= set(bench[bench["gpu_slug"] == g]["config"])
        assert set(bench[(bench["gpu_slug"] == g) & (bench["config"] == "bf16-graphs")]["batch"]) == {1, 2, 4}
    step = load_table("torch_step_kernels", RESULTS)
    assert set(step["gpu_slug"]) >= {"h200", "h100-80gb-hbm3"} and (step["duration_us"] > 0).all()
    with pytest.raises(ValueError, match="no results for GPU"):
        load_bench(RESULTS, only=["v100"])


def test_committed_paper_mode_reports_are_the_papers_window():
    """The committed ncu exports re-tidy to the committed tables (no GPU needed), and each ran
    with the paper's options and the configuration's own TF32 setting."""
    metas = sorted(RESULTS.glob("*/*/ncu_paper_meta.json"))
    assert len(metas) >= 10  # five configurations × H100, H200
    for path in metas:
        folder, config = path.parent, path.parent.name
        k = parse_raw(folder / "ncu_paper_ncu_raw.csv.gz")
        assert len(k) == 100, path  # --launch-skip 10 --launch-count 100
        stored = pd.read_parquet(folder / "ncu_paper_kernels.parquet")
        np.testing.assert_allclose(k["duration_ns"], stored["duration_ns"])
        meta = json.loads(path.read_text())
        assert "--launch-skip 10 --launch-count 100" in meta["command"] and "--clock-control none" in meta["command"]
        assert meta["config"] == config and meta["settings"]["tf32_conv"] is (config in ("opt1", "opt12", "pytorch-default"))


def test_committed_step_reports_see_the_step_torch_profiler_sees():
    """ncu step mode (kernel replay) and torch.profiler recorded the same steady-state step: the
    same kernels in number and, within 5 %, the same summed kernel time — on every GPU × config."""
    from medddpm.report.tables import step_agreement

    a = step_agreement(RESULTS, gpus(RESULTS))
    assert len(a) >= 10
    assert (a["ncu_kernels"] == a["torch_kernels"]).all()
    assert a["time_ratio"].between(0.95, 1.05).all()
    for path in RESULTS.glob("*/*/ncu_step_meta.json"):
        meta = json.loads(path.read_text())
        assert meta["passes_max"] == 1 and "--profile-from-start off" in meta["command"] and meta["kernels"] > 1000


def test_update_env_merges(tmp_path):
    update_env(tmp_path, commands={"a": "x"}, ncu="1")
    env = update_env(tmp_path, commands={"b": "y"})
    assert env == {"commands": {"a": "x", "b": "y"}, "ncu": "1"}


def test_ncu_command_lines():
    paper = ncu_command("ncu", "paper", Path("r"), ["python", "w"])
    s = " ".join(paper)
    for opt in ("--set full", "--call-stack", "--nvtx", "--launch-skip 10", "--launch-count 100",
                "--target-processes all", "--clock-control none", "--export r"):
        assert opt in s
    step = " ".join(ncu_command("ncu", "step", Path("r"), ["python"]))
    assert "--profile-from-start off" in step and "--nvtx-include" not in step and "gpu__time_duration.sum" in step
    with pytest.raises(ValueError, match="--mode"):
        ncu_command("ncu", "bogus", Path("r"), [])
    few = ncu_command("ncu", "step", Path("r"), ["python"], max_kernels=30)
    assert few[few.index("--launch-count") + 1] == "30"
    with pytest.raises(ValueError, match="--max-kernels"):
        ncu_command("ncu", "step", Path("r"), ["python"], max_kernels=0)


def test_step_sets_grow_and_carry_what_the_figures_need():
    sizes = [len(step_metrics(n)) for n in ("core", "lean", "standard", "full")]
    assert sizes == sorted(sizes) and len(set(sizes)) == 4
    assert "sass__inst_executed_per_opcode_category" in step_metrics("full")
    assert "sass__inst_executed_per_opcode_category" not in step_metrics("lean")
    assert {"gpu__time_duration.sum", "smsp__inst_executed.sum", "gpc__cycles_elapsed.max"} <= set(step_metrics("lean"))
    assert set(STEP_SETS) == {"core", "lean", "standard", "full"}
    with pytest.raises(ValueError, match="--step-set"):
        step_metrics("everything")


def test_roofline_mode_counts_the_pipe_of_each_configuration():
    assert [flop_paths(run_config(c)) for c in ("baseline", "opt1", "opt12", "pytorch-default", "bf16", "bf16-graphs")] == \
        [("fp32",), ("tf32",), ("tf32",), ("tf32",), ("bf16",), ("bf16",)]
    fast = set(roofline_metrics(["bf16"]))
    assert {"gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
            "sm__ops_path_tensor_src_bf16_dst_fp32.sum"} <= fast
    assert not any("tf32" in m or "sass" in m for m in fast)  # one path a run: one counter pass
    assert "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum" in roofline_metrics(["fp32"])
    cmd = " ".join(ncu_command("ncu", "roofline", Path("r"), ["python"], metrics=roofline_metrics(["tf32"])))
    assert "--profile-from-start off" in cmd and "--target-processes application-only" in cmd and "tf32" in cmd
    with pytest.raises(ValueError, match="FLOP paths"):
        roofline_metrics(["fp8"])


def test_progress_counts_kernels_and_passes():
    log = """==PROF== Connected to process 1 (python3)
==PROF== Profiling "void at::native::vectorized_elementwise_kernel<4, ..." - 0: 0%....50%....100% - 9 passes
==PROF== Profiling "sm90_xmma_fprop" - 1: 0%....50%....100% - 12 passes
==PROF== Profiling "k" - 2: 0%....50%....100% - 1 pass
==PROF== Profiling "k" - 3: 0%....50"""
    assert progress(log) == {"kernels_logged": 4, "passes_min": 1, "passes_max": 12}
    assert progress("") == {"kernels_logged": 0, "passes_min": None, "passes_max": None}


@pytest.mark.parametrize("text,code,needle", [
    ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission", 1, "ERR_NVGPUCTRPERM"),
    ("==WARNING== No kernels were profiled.", 0, "zero kernels"),
    ("==ERROR== something broke", 9, "exit code 9"),
])
def test_ncu_failures_are_named(text, code, needle):
    with pytest.raises(ProfilerError, match=needle):
        check_output(text, code)


def _fake_ncu(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "ncu"
    p.write_text("#!/usr/bin/env bash\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return p


def test_profile_failure_leaves_nothing_behind(tmp_path):
    ncu = _fake_ncu(tmp_path, 'echo "==ERROR== ERR_NVGPUCTRPERM" >&2; exit 1\n')
    out = tmp_path / "res"
    out.mkdir()
    with pytest.raises(ProfilerError, match="ERR_NVGPUCTRPERM"):
        profile_config(str(ncu), "step", "tiny", "baseline", 16, 1, out)
    assert [p.name for p in (out / "baseline").iterdir()] == [] and not list(out.glob(".ncu-*"))


def test_profile_with_a_fake_ncu_that_replays_real_exports(tmp_path):
    """The whole path (run, export, tidy, move into place) with an ncu that returns our fixtures."""
    body = f'''
if [ "$1" = "--import" ]; then
  case "$*" in
    *print-metric-instances*) zcat {FIX}/tiny_instances.csv.gz;;
    *details*) zcat {FIX}/tiny_details.csv.gz;;
    *) zcat {FIX}/tiny_raw.csv.gz;;
  esac
  exit 0
fi
while [ $# -gt 0 ]; do if [ "$1" = "--export" ]; then touch "$2.ncu-rep"; fi; shift; done
echo '{{"config": "baseline", "settings": {{"tf32_conv": false}}}}'
'''
    ncu = _fake_ncu(tmp_path, body)
    out = tmp_path / "res"
    out.mkdir()
    meta = profile_config(str(ncu), "step", "tiny", "baseline", 16, 1, out, step_set="full")
    assert meta["kernels"] == 8 and meta["settings"] == {"tf32_conv": False}
    names = sorted(p.name for p in (out / "baseline").iterdir())
    assert "ncu_step_kernels.parquet" in names and "ncu_step_instructions.parquet" in names
    assert not list(out.glob(".ncu-*"))
    # Roofline mode keeps its own tables beside step mode's, and records the counted pipe.
    meta = profile_config(str(ncu), "roofline", "tiny", "baseline", 16, 1, out)
    assert meta["flop_paths"] == ["fp32"] and "sass_thread_inst_executed_op_ffma" in meta["command"]
    assert {"ncu_roofline_kernels.parquet", "ncu_step_kernels.parquet"} <= {p.name for p in (out / "baseline").iterdir()}
    # A leaner set afterwards: the instruction-class table of the earlier run must not linger.
    meta = profile_config(str(ncu), "step", "tiny", "baseline", 16, 1, out, step_set="lean")
    names = sorted(p.name for p in (out / "baseline").iterdir())
    assert meta["step_set"]["name"] == "lean" and "ncu_step_kernels.parquet" in names
    assert "ncu_step_instructions.parquet" not in names and "ncu_step_ncu_instances.csv.gz" not in names


def test_profile_cli_without_ncu(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("NCU", raising=False)
    code = main(["profile", "--gpu-label", "x", "--out", str(tmp_path / "r"), "--configs", "baseline", "--model", "tiny", "--size", "16"])
    err = capsys.readouterr().err
    assert code == 2 and "ncu (Nsight Compute CLI) was not found" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_ncu_tidy_cli(capsys, tmp_path):
    code = main(["ncu-tidy", "--raw", str(FIX / "tiny_raw.csv.gz"), "--details", str(FIX / "tiny_details.csv.gz"),
                 "--instances", str(FIX / "tiny_instances.csv.gz"), "--out", str(tmp_path), "--csv"])
    assert code == 0
    assert pd.read_parquet(tmp_path / "kernels.parquet").shape[0] == 8
    assert (tmp_path / "rules.csv").exists()
    code = main(["ncu-tidy", "--raw", str(tmp_path / "nope.csv"), "--out", str(tmp_path)])
    assert code == 2 and "does not exist" in capsys.readouterr().err


def test_timeout_kills_ncu_says_how_far_it_got_and_writes_nothing(tmp_path):
    ncu = _fake_ncu(tmp_path, 'echo "==PROF== Profiling \\"a\\" - 0: 0%....100% - 3 passes"\n'
                              'echo "==PROF== Profiling \\"b\\" - 1: 0%....100% - 3 passes"\nsleep 30\n')
    out = tmp_path / "res"
    out.mkdir()
    with pytest.raises(ProfilerError, match="ran past 1 s after 2 kernels"):
        profile_config(str(ncu), "step", "tiny", "baseline", 16, 1, out, timeout_s=1)
    assert [p.name for p in (out / "baseline").iterdir()] == [] and not list(out.glob(".ncu-*"))


def _folder_at_128(tmp_path):
    folder = tmp_path / "gpu-x"
    (folder / "baseline").mkdir(parents=True)
    pd.DataFrame([{"gpu": "X", "config": "baseline", "model": "tiny", "size": "128x128x128", "batch": 1,
                   "step_ms_median": 10.0}]).to_csv(folder / "bench.csv", index=False)
    (folder / "baseline" / "ncu_paper_meta.json").write_text(json.dumps({"model": "tiny", "size": 128}))
    return folder


def test_a_gpu_folder_holds_one_model_and_size(tmp_path):
    folder = _folder_at_128(tmp_path)
    assert setups_held(folder) == {"tiny at 128x128x128"}
    check_one_setup(folder, "tiny", 128)  # the same setup: fine
    check_one_setup(tmp_path / "new", "tiny", 16)  # an empty or missing folder: fine
    for model, size in [("tiny", 16), ("whole-head", 128)]:
        with pytest.raises(InputError, match="would mix them"):
            check_one_setup(folder, model, size)


def test_profile_cli_refuses_to_mix_sizes_before_writing(capsys, tmp_path):
    folder = _folder_at_128(tmp_path)
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    code = main(["profile", "--gpu-label", "x", "--out", str(folder), "--configs", "baseline", "--model", "tiny",
                 "--size", "16"])
    err = capsys.readouterr().err
    assert code == 2 and "tiny at 128x128x128" in err and len(err.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


def test_bench_rerun_replaces_and_speedups_compare_like_with_like(tmp_path):
    from medddpm.report.tables import bench

    folder = tmp_path / "gpu-x"
    folder.mkdir()
    rows = [("baseline", "128x128x128", 100.0), ("opt1", "128x128x128", 25.0), ("baseline", "128x128x128", 80.0),
            ("baseline", "32x32x32", 10.0), ("opt1", "32x32x32", 10.0)]
    pd.DataFrame([{"gpu": "X", "config": c, "model": "m", "size": s, "batch": 1, "step_ms_median": ms}
                  for c, s, ms in rows]).to_csv(folder / "bench.csv", index=False)
    b = bench(tmp_path, ["gpu-x"]).set_index(["config", "size"])
    assert len(b) == 4 and b.loc[("baseline", "128x128x128"), "step_ms_median"] == 80.0  # the rerun wins
    assert b.loc[("opt1", "128x128x128"), "speedup_vs_baseline"] == 80.0 / 25.0
    assert b.loc[("opt1", "32x32x32"), "speedup_vs_baseline"] == 1.0


def test_mixes_share_out_within_each_group():
    k = pd.DataFrame({"gpu_slug": ["a", "a", "a", "b"], "category": ["conv", "conv", "norm", "norm"],
                      "duration_ns": [2.0, 4.0, 2.0, 5.0]})
    m = M.kernel_mix(k, group=["gpu_slug"]).set_index(["gpu_slug", "category"])["share"]
    assert m["a", "conv"] == 0.75 and m["a", "norm"] == 0.25 and m["b", "norm"] == 1.0
    assert M.kernel_mix(k)["category"].tolist() == ["norm", "conv"]  # 7 vs 6 ns over all: largest first
    ins = pd.DataFrame({"gpu_slug": ["a", "a", "b"], "id": [0, 1, 0], "class": ["FP", "INT", "FP"], "count": [1.0, 3.0, 2.0]})
    im = M.instruction_mix(ins, group=["gpu_slug"])
    assert im.groupby("gpu_slug")["share"].sum().tolist() == [1.0, 1.0]
    assert M.instruction_mix(ins, kernel_ids=[1])["class"].tolist() == ["INT"]


def test_dominant_instruction_mix_is_the_kernel_with_most_time():
    k = pd.DataFrame({"id": [0, 1, 2], "short_name": ["conv", "norm", "conv"], "duration_ns": [3.0, 5.0, 3.0]})
    ins = pd.DataFrame({"id": [0, 1, 2], "class": ["FP", "INT", "UD"], "count": [1.0, 9.0, 3.0]})
    d = M.dominant_instruction_mix(k, ins)
    assert set(d["kernel"]) == {"conv"} and d.set_index("class")["share"].to_dict() == {"UD": 0.75, "FP": 0.25}


def test_profile_queue_checks_every_job_first_and_reports_skips(tmp_path):
    import subprocess
    import sys

    script = [sys.executable, str(Path(__file__).parents[1] / "scripts" / "profile_queue.py"), "--gpu-label", "x",
              "--out", str(tmp_path / "r")]
    bad = subprocess.run(script + ["paper:opt1", "bogus:opt1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "bad job 'bogus:opt1'" in bad.stderr and not (tmp_path / "r").exists()
    bad = subprocess.run(script + ["--need", "paper240", "paper:opt1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "MODE=SECONDS" in bad.stderr
    skipped = subprocess.run(script + ["--budget", "0", "paper:opt1"], capture_output=True, text=True)
    assert skipped.returncode == 1
    log = [json.loads(line) for line in (tmp_path / "r" / "queue_log.jsonl").read_text().splitlines()]
    assert log == [{"job": "paper:opt1", "left_s": 0, "result": "skipped: not enough time left"}]


def test_inductor_kernels_are_not_taken_for_layout_transforms():
    assert category("triton_red_fused__to_copy_add_convolution_permute_0") == "Triton reduction"
    assert category("triton_per_fused_native_group_norm_1") == "Triton reduction"
    assert category("triton_poi_fused__to_copy__unsafe_view_add_clone_2") == "Triton pointwise"
    assert category("void cudnn::engines_precompiled::nchwToNhwcKernel<float>(int)") == "layout transform"


def _roof_kernels(**extra) -> pd.DataFrame:
    """Three kernels: a bf16 tensor GEMM, an FP32 FFMA kernel and a copy (no FLOPs)."""
    k = pd.DataFrame({"id": [0, 1, 2], "short_name": ["gemm", "ffma", "copy"],
                      "category": ["convolution/GEMM", "convolution/GEMM", "copy"],
                      "duration_ns": [1e6, 2e6, 1e6], "gpu_slug": "g", "config": "c",
                      "dram__bytes_read.sum": [1e9, 2e9, 4e9], "dram__bytes_write.sum": [1e9, 0.0, 4e9],
                      "sm__ops_path_tensor_src_bf16_dst_fp32.sum": [4e11, 0.0, 0.0]})
    return k.assign(**extra)


def test_roofline_points_count_flops_bytes_and_pipes():
    k = _roof_kernels(**{"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": [0.0, 5e10, 0.0],
                         "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum": [0.0, 1e9, 0.0],
                         "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum": [0.0, 0.0, 0.0]})
    p = M.roofline_points(k, ["gpu_slug", "config"]).set_index("short_name")
    assert p.loc["gemm", "flops"] == 4e11 and p.loc["gemm", "intensity"] == 200
    assert p.loc["gemm", "tflops"] == pytest.approx(400)  # 4e11 FLOP in 1 ms
    assert p.loc["ffma", "flops"] == 2 * 5e10 + 1e9  # FFMA counts two FLOPs, FADD one
    assert p.loc["copy", "flops"] == 0 and p.loc["copy", "intensity"] == 0  # bytes but no FLOPs
    assert list(p["path"]) == ["bf16 tensor", "FP32", "FP32"]
    assert p["share"].sum() == pytest.approx(1) and p.loc["ffma", "share"] == pytest.approx(0.5)
    assert p["fp32_counted"].all()


def test_roofline_points_read_paper_mode_rates_and_refuse_reports_without_dram():
    # --set full reports the FP32 counters as per-cycle rates: count = rate × the unit's elapsed cycles
    k = _roof_kernels(**{"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum.per_cycle_elapsed": [0.0, 100.0, 0.0],
                         "smsp__cycles_elapsed.avg": [1e6, 1e6, 1e6]})
    p = M.roofline_points(k).set_index("short_name")
    assert p.loc["ffma", "flops"] == 2 * 100.0 * 1e6
    assert not p["fp32_counted"].any()  # FADD/FMUL missing: said, not guessed
    with pytest.raises(ValueError, match="DRAM"):
        M.roofline_points(k.drop(columns=["dram__bytes_read.sum"]))


def test_a_table_is_read_once_per_version_of_its_file_and_callers_get_their_own_copy(tmp_path):
    """load_table's parquet cache: the same file read twice is one read; a rewritten file is read
    again; a caller that modifies what it got changes nothing for the next one."""
    from medddpm.profiling import store

    folder = tmp_path / "h100" / "fast"
    folder.mkdir(parents=True)
    (folder.parent / "env.json").write_text("{}")  # what marks a GPU's folder
    pd.DataFrame({"name": ["a", "b"], "us": [1.0, 2.0]}).to_parquet(folder / "t.parquet")
    store._parquet.cache_clear()
    first = load_table("t", tmp_path)
    first.loc[0, "us"] = 99.0
    again = load_table("t", tmp_path)
    assert store._parquet.cache_info().misses == 1 and list(again["us"]) == [1.0, 2.0]
    pd.DataFrame({"name": ["a"], "us": [3.0]}).to_parquet(folder / "t.parquet")
    assert list(load_table("t", tmp_path)["us"]) == [3.0] and store._parquet.cache_info().misses == 2
