"""The loop-vs-bench table (medddpm/train/loop.py) and the facts the book's loop and scaling prose quote."""
import pandas as pd
import pytest
import torch

from medddpm.train import loop
from medddpm.profiling.bench import COLUMNS as BENCH_COLUMNS, bench
from medddpm.core.config import MODEL_PRESETS, TrainConfig, run_config
from medddpm.data.nifti import pair_files
from medddpm.data.volumes import VolumeDataset
from medddpm.core.errors import InputError
from medddpm.core.io import append_rows
from medddpm.train.trainer import Trainer

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def runs(phantoms, tmp_path_factory):
    root = tmp_path_factory.mktemp("loop")
    ds = VolumeDataset(pair_files(phantoms / "images", phantoms / "masks"), "whole-head", 1, (16, 16, 16))
    for accum in (1, 2):
        cfg = TrainConfig(grad_accum=accum, log_every=1, save_every=100, lr=1e-3)
        Trainer(ds, MODEL_PRESETS["tiny"], cfg, run_config("opt1"), CPU, root / f"a{accum}", (16, 16, 16)).fit(3, False)
    row = bench(MODEL_PRESETS["tiny"], run_config("opt1"), (16, 16, 16), CPU, steps=1, warmup=0, grad_accum=2)["row"]
    append_rows(root / "bench.csv", [row], BENCH_COLUMNS)
    return root


def test_table_pairs_each_run_with_its_bench_row(runs):
    df = loop.table([runs / "a1", runs / "a2"], loop.bench_rows([runs / "bench.csv"]))
    assert list(df.columns) == loop.COLUMNS and list(df["grad_accum"]) == [1, 2]
    a1, a2 = df.iloc[0], df.iloc[1]
    assert a1["data"] == "host" and a1["world_size"] == 1 and a1["ratio"] != a1["ratio"]  # no bench row: NaN
    bench_row = pd.read_csv(runs / "bench.csv").iloc[0]
    assert a2["bench_ms"] == pytest.approx(bench_row["step_ms_median"] / 2, abs=0.01)
    assert a2["ratio"] == pytest.approx(a2["loop_ms_per_micro_batch"] / a2["bench_ms"], rel=1e-3)
    timing = pd.read_csv(runs / "a2" / "timing.csv")["ms_per_step"].iloc[1:]
    assert a2["loop_ms_per_micro_batch"] == pytest.approx(timing.median() / 2, abs=0.01)


def test_table_refuses_what_is_not_a_timed_run(runs, tmp_path):
    with pytest.raises(InputError, match="not a timed train run"):
        loop.table([tmp_path], [])
    assert loop.main(["table", str(tmp_path), "--bench", str(runs / "bench.csv"), "--out", str(tmp_path / "x.csv")]) == 2
    assert not (tmp_path / "x.csv").exists()


def test_loop_and_scaling_tables_mark_their_targets(tmp_path):
    """The loop's rows say whether they keep within 3 % of their benchmark, the several-GPU rows whether they reach
    97 %; a one-GPU row has no verdict."""
    from medddpm.report import fast_tables

    g = tmp_path / "h200" / "loop"
    g.mkdir(parents=True)
    pd.DataFrame({"gpu_slug": ["h200", "h200"], "config": ["opt1", "bf16-graphs"], "grad_accum": [1, 2],
                  "data": ["device", "device"], "loop_ms_per_micro_batch": [231.7, 61.0],
                  "bench_ms": [232.8, 58.8], "ratio": [0.995, 1.037]}).to_csv(g / "loop_vs_bench.csv", index=False)
    assert fast_tables.loop_vs_bench(tmp_path, ["h200"])["within_3pct"].tolist() == [True, False]
    m = tmp_path / "h200-x2"
    m.mkdir()
    pd.DataFrame({"config": "bf16-graphs", "grad_accum": 1, "world_size": [1, 2, 2], "step_ms_median": [60.0, 61.7, 64.0],
                  "scaling_efficiency": [1.0, 0.9716, 0.9375]}).to_csv(m / "scaling.csv", index=False)
    sc, _ = fast_tables.scaling(tmp_path)
    assert sc["reaches_97pct"].isna().tolist() == [True, False, False] and sc["reaches_97pct"].iloc[1:].tolist() == [True, False]
