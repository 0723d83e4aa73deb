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
