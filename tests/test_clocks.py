"""profiling.clocks: nvidia-smi logs reduced to the busy samples' clocks per GPU."""
from medddpm.profiling.clocks import clock_table, read_log

HEADER = ("timestamp, index, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], "
          "temperature.gpu, utilization.gpu [%], clocks_event_reasons.active\n")


def _log(tmp_path, rows):
    path = tmp_path / "clocks-fast-2.csv"
    path.write_text(HEADER + "".join(f"2026/11/26 10:00:00.000, {i}, {sm}, 2619, {w}, {t}, {u}, {r}\n"
                                     for i, sm, w, t, u, r in rows))
    return path


def test_busy_samples_only_and_reasons_or_ed(tmp_path):
    path = _log(tmp_path, [(0, 345, 70.1, 40, 0, "0x0000000000000001"),  # idle: not the run's work
                           (0, 1740, 330.5, 57, 100, "0x0000000000000000"),
                           (0, 1760, 340.0, 58, 98, "0x0000000000000004"),
                           (1, 1900, 350.0, 52, 100, "0x0000000000000000"),
                           (1, 1920, 352.0, 51, 95, "0x0000000000000020")])
    t = clock_table({"fast-2": path}).set_index("gpu_index")
    assert list(t.index) == [0, 1]
    assert t.loc[0, "busy_samples"] == 2 and t.loc[0, "sm_mhz_median"] == 1750
    assert t.loc[0, "event_reasons"] == "0x4" and t.loc[1, "event_reasons"] == "0x20"
    assert t.loc[1, "temp_c_max"] == 52 and t.loc[0, "power_w_median"] == (330.5 + 340.0) / 2


def test_units_in_values_and_a_gpu_never_busy(tmp_path):
    path = _log(tmp_path, [(0, "1500 MHz", "300.00 W", 50, "100 %", "0x0"), (1, "345 MHz", "70 W", 40, "0 %", "0x0")])
    df = read_log(path)
    assert df["sm"].tolist() == [1500, 345] and df["util"].tolist() == [100, 0]
    assert clock_table({"r": path})["gpu_index"].tolist() == [0]


def test_reason_names():
    from medddpm.profiling.clocks import reason_names

    assert reason_names("0x4") == ["software power cap"]
    assert reason_names(0x24) == ["software power cap", "software thermal slowdown"]
    assert reason_names("0x0") == [] and reason_names("0x1000") == ["0x1000"]


def test_clock_facts_read_fast_on_one_gpu_and_two_ranks_in_every_folder(tmp_path):
    """report.fast_facts.clock_facts: each folder whose clocks.csv holds fast-1 and fast-2, the
    earlier run folders before the machines' current ones; a folder missing one of them is skipped."""
    import pandas as pd

    from medddpm.report.fast_facts import clock_facts

    row = lambda run, i, mhz: {"run": run, "gpu_index": i, "sm_mhz_median": mhz, "power_w_median": 690.0}  # noqa: E731
    (tmp_path / "m-x2").mkdir()
    (tmp_path / "m-x4" / "old").mkdir(parents=True)
    pd.DataFrame([row("fast-1", 0, 1830), row("fast-2", 1, 1800), row("fast-2", 0, 1792)]).to_csv(
        tmp_path / "m-x2" / "clocks.csv", index=False)
    pd.DataFrame([row("fast-1", 0, 1830), row("fast-2", 0, 1815), row("fast-2", 1, 1830)]).to_csv(
        tmp_path / "m-x4" / "old" / "clocks.csv", index=False)
    pd.DataFrame([row("opt1-1", 0, 1980)]).to_csv(tmp_path / "m-x4" / "clocks.csv", index=False)
    f = clock_facts(tmp_path)
    assert f["clocks_hosts"] == ("`m-x4/old/` one GPU 1830 MHz at 690 W, 2 ranks 1815 / 1830 MHz at 690 / 690 W; "
                                 "`m-x2/` one GPU 1830 MHz at 690 W, 2 ranks 1792 / 1800 MHz at 690 / 690 W")
    # a rank that kept its one-GPU clock on 2 ranks is named, with the folder's 2-GPU efficiency where it has one
    assert f["clocks_kept"] == "`m-x4/old/`"
    pd.DataFrame([{"config": "fast", "world_size": 2, "grad_accum": 1, "scaling_efficiency": 0.9629}]).to_csv(
        tmp_path / "m-x4" / "old" / "scaling.csv", index=False)
    assert clock_facts(tmp_path)["clocks_kept"] == "`m-x4/old/` (96.3 % at 2 GPUs)"
    assert clock_facts(tmp_path, "opt1")["clocks_hosts"].startswith("—")
