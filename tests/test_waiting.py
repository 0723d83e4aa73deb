"""What a user waits for (medddpm.profiling.waiting): a command timed from process start, and two
runs' files compared bit for bit."""
import pandas as pd

from medddpm.profiling.waiting import COLUMNS, main, option


def test_a_sample_command_is_timed_and_two_runs_write_the_same_files(ixi16, ixi_checkpoint, tmp_path, capsys):
    csv, same = tmp_path / "time_to_result.csv", tmp_path / "same_files.csv"
    cmd = ["sample", "--checkpoint", str(ixi_checkpoint), "--masks", str(ixi16 / "val" / "masks"), "--steps", "2",
           "--quiet", "--device", "cpu"]
    for k in (1, 2):
        assert main(["run", "--out", str(csv), "--cache", "cold", "--volumes", "1", "--", *cmd,
                     "--out", str(tmp_path / f"s{k}")]) == 0
    rows = pd.read_csv(csv)
    assert list(rows.columns) == COLUMNS and len(rows) == 2 and (rows["rc"] == 0).all()
    assert (rows["config"] == "default").all() and (rows["wall_s"] > 0).all()
    assert main(["compare", str(tmp_path / "s1"), str(tmp_path / "s2"), "--out", str(same), "--what", "twice"]) == 0
    row = pd.read_csv(same).iloc[0]
    assert row["files"] == 1 and row["identical"] == 1 and row["max_abs_diff"] == 0
    assert main(["compare", str(tmp_path / "s1"), str(ixi16), "--out", str(same), "--what", "x"]) == 2
    # a failing command is a row too, with its exit code
    assert main(["run", "--out", str(csv), "--cache", "warm", "--volumes", "1", "--", *cmd,
                 "--out", str(tmp_path / "s1")]) == 1
    assert pd.read_csv(csv)["rc"].iloc[-1] == 2
    assert option(["sample", "--config", "fast"], "--config", "default") == "fast"
