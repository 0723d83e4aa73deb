"""What a user waits for (medddpm.profiling.waiting): a command timed from process start, and two
runs' files compared bit for bit."""
import pandas as pd

from medddpm.profiling.waiting import COLUMNS, main, option, phases, ran, sampler_ran


def test_a_sample_command_is_timed_and_two_runs_write_the_same_files(ixi16, ixi_checkpoint, tmp_path, capsys):
    csv, same = tmp_path / "time_to_result.csv", tmp_path / "same_files.csv"
    cmd = ["sample", "--checkpoint", str(ixi_checkpoint), "--masks", str(ixi16 / "val" / "masks"), "--sampler",
           "dpm2m-sde", "--steps", "2", "--quiet", "--device", "cpu"]
    for k in (1, 2):
        assert main(["run", "--out", str(csv), "--cache", "cold", "--volumes", "1", "--", *cmd,
                     "--out", str(tmp_path / f"s{k}")]) == 0
    rows = pd.read_csv(csv)
    assert list(rows.columns) == COLUMNS and len(rows) == 2 and (rows["rc"] == 0).all()
    assert (rows["config"] == "default").all() and (rows["wall_s"] > 0).all() and (rows["sampler"] == "dpm2m-sde").all()
    assert rows["ran"].isna().all()  # a CPU picks without saying so: the row does not guess
    # where the seconds went, as sample's timing line says: in order, and within the row's wall time
    from medddpm.profiling.waiting import PHASES

    t = rows[list(PHASES.values())]
    gpu_only = ["kernels_s", "captured_s"]  # Triton kernels and CUDA graphs: none on a CPU
    assert t[gpu_only].isna().all().all()
    t = t.drop(columns=gpu_only)  # on the process's clock: the imports first, then the command's phases in order
    assert t.notna().all().all() and (t.diff(axis=1).iloc[:, 1:] >= 0).all().all()
    assert (t["imports_s"] > 0.3).all() and (t["written_s"] <= rows["wall_s"] + 0.05).all()  # the line rounds to 0.1 s
    assert main(["compare", str(tmp_path / "s1"), str(tmp_path / "s2"), "--out", str(same), "--what", "twice"]) == 0
    row = pd.read_csv(same).iloc[0]
    assert row["files"] == 1 and row["identical"] == 1 and row["max_abs_diff"] == 0
    assert row["sampler"] == "default"  # compare names the sampler: sample's default unless given
    assert main(["compare", str(tmp_path / "s1"), str(tmp_path / "s2"), "--out", str(same), "--what", "twice",
                 "--sampler", "dpm2m-sde"]) == 0 and pd.read_csv(same)["sampler"].iloc[-1] == "dpm2m-sde"
    assert main(["compare", str(tmp_path / "s1"), str(ixi16), "--out", str(same), "--what", "x"]) == 2
    # a failing command is a row too, with its exit code
    assert main(["run", "--out", str(csv), "--cache", "warm", "--volumes", "1", "--", *cmd,
                 "--out", str(tmp_path / "s1")]) == 1
    assert pd.read_csv(csv)["rc"].iloc[-1] == 2 and pd.isna(pd.read_csv(csv)["ready_s"].iloc[-1])
    assert option(["sample", "--config", "fast"], "--config", "default") == "fast"
    # the configuration a GPU's `sample` picked, as its `config …` line says; a --config given is what ran
    said = "masks: …\nconfig fast-eager, not compiled: 1 volume(s) of 250 denoiser calls …\n"
    assert ran(["sample", "--masks", "m"], said) == "fast-eager" and ran(["sample", "--config", "bf16"], said) == "bf16"
    # the sampler it ran: --sampler, else the default its `sampler …` line names
    said = "sampler dpm2m-sde 12 logsnr η 1.3: the default for v-prediction checkpoints; …\n"
    assert sampler_ran(["sample", "--masks", "m"], said) == "dpm2m-sde" and sampler_ran(["sample"], "") == ""
    assert sampler_ran(["sample", "--sampler", "ddim"], said) == "ddim" and sampler_ran(["train"], said) == ""
    assert ran(["sample", "--masks", "m"], "config fast (100 volumes: …)") == "fast" and ran(["train"], said) == ""
    assert phases("x\ntiming: ready 4.1 s, first volume 9.8 s, last volume 12.0 s, written 12.5 s\n") == {
        "ready_s": 4.1, "first_volume_s": 9.8, "last_volume_s": 12.0, "written_s": 12.5}
    assert phases(said) == {}


def test_a_train_row_keeps_where_its_seconds_went_from_trains_own_timing_line(tmp_path, monkeypatch):
    """waiting.phases / main: `train` prints its timing line on stdout (`sample` on stderr); its row keeps ready (since
    the command started, as sample's) and how long its first step and its steady steps took; a sample's line is never
    read as train's nor the other way round."""
    from medddpm.profiling import waiting

    line = ("timing: ready 14.1 s, first step 9.9 s, steady steps 614.8 s (5,999 at 102.5 ms), held-out 177.3 s (9), "
            "checkpoints 1.1 s (1), 55.9 % of --time-limit in steady steps")
    assert phases(f"trained\n{line}\n", ["train", "--steps", "9"]) == {
        "ready_s": 14.1, "first_step_s": 9.9, "steady_steps_s": 614.8}
    assert phases(f"{line}\n") == {"ready_s": 14.1}  # read as sample's: only the phase both name
    assert phases("timing: ready 4.1 s, first volume 9.8 s\n", ["train"]) == {"ready_s": 4.1}
    monkeypatch.setattr(waiting, "timed", lambda argv: (20.0, 0, "a warning\n", f"trained to step 9\n{line}\n"))
    csv = tmp_path / "t.csv"
    assert main(["run", "--out", str(csv), "--cache", "cold", "--volumes", "9", "--", "train", "--steps", "9"]) == 0
    row = pd.read_csv(csv).iloc[0]
    assert list(pd.read_csv(csv).columns) == COLUMNS and row["wall_s"] == 20.0
    assert (row["ready_s"], row["first_step_s"], row["steady_steps_s"]) == (14.1, 9.9, 614.8)
    assert pd.isna(row["first_volume_s"]) and pd.isna(row["sampler"])


def test_the_chapters_facts_and_tables_read_the_rows_and_name_what_is_missing(tmp_path):
    """report.waiting: every row measured, with what a row written before the ``sampler`` and ``ran`` columns ran;
    the samplers of the first rows; the newest same-files check of each sampler; a store without the measurement
    reads '—' everywhere but the package's rule."""
    from medddpm.report import waiting

    folder = tmp_path / "gpu-a" / waiting.FOLDER
    folder.mkdir(parents=True)
    rows = [("sample --masks m1 --out a", "default", 1, "cold", 9.0), ("sample --masks m1 --out b", "default", 1, "warm", 4.5),
            ("sample --masks m100 --out c", "default", 100, "warm", 30.0),
            ("sample --masks m8 --out d --config fast", "fast", 8, "warm", 16.0),
            ("sample --masks m256 --out e --config fast --nproc 4", "fast", 256, "warm", 40.0),
            ("sample --masks m256 --out g --config fast --nproc 2", "fast", 256, "warm", 80.0),
            ("sample --masks m256 --out f --config fast --nproc 1", "fast", 256, "warm", 140.0)]
    pd.DataFrame([{"gpu": "G", "command": c, "config": cfg, "volumes": n, "cache": cache, "wall_s": w, "rc": 0,
                   "torch": "t", "cuda": "c", "date": "d"} for c, cfg, n, cache, w in rows]).to_csv(
        folder / "time_to_result.csv", index=False)
    f = waiting.facts(tmp_path, ["gpu-a"])
    assert f["tr_sampler"] == "`dpm2m-sde`"  # rows written before the sampler column ran the 12-step chain's solver
    assert f["tr_same"].startswith("—") and f["tr_gpu"] == "gpu-a"
    t = waiting.table(tmp_path, ["gpu-a"])
    assert len(t) == 7 and sorted(t["ranks"].unique()) == [1, 2, 4] and set(t["sampler"]) == {"dpm2m-sde"}
    # rows without the `ran` column ran what the rule of then picked: eager bf16 below 35 masks of the chain, fast from
    # there; a row that says what it ran keeps it
    assert list(waiting.rows(tmp_path, ["gpu-a"])["ran"]) == ["bf16", "bf16", "fast", "fast", "fast", "fast", "fast"]
    said = pd.read_csv(folder / "time_to_result.csv").assign(ran=None, sampler=None)
    said.loc[0, "ran"], said.loc[0, "sampler"] = "fast-eager", "ddpm"
    said.to_csv(folder / "time_to_result.csv", index=False)
    r = waiting.rows(tmp_path, ["gpu-a"])
    assert r.loc[0, "ran"] == "fast-eager" and r.loc[0, "sampler"] == "ddpm" and r.loc[1, "sampler"] == "dpm2m-sde"
    # the same comparison twice: the newest counts; another sampler's row under the same name is its own
    same = pd.DataFrame([{"gpu": "G", "what": "fast twice", "files": 8, "identical": k, "max_abs_diff": 0.0,
                          "mean_abs_diff": 0.0, "date": "d"} for k in (3, 8)])
    same.to_csv(folder / "same_files.csv", index=False)
    assert len(waiting.same_files(tmp_path, ["gpu-a"])) == 1
    assert waiting.facts(tmp_path, ["gpu-a"])["tr_same"] == "fast twice (`dpm2m-sde`): 8 of 8 files identical"
    pd.concat([same, same.iloc[:1].assign(sampler="ddpm")]).to_csv(folder / "same_files.csv", index=False)
    assert sorted(waiting.same_files(tmp_path, ["gpu-a"])["identical"]) == [3, 8]
    empty = waiting.facts(tmp_path, ["gpu-b"])
    assert all(v.startswith("—") for k, v in empty.items() if k not in waiting.STORE_FREE)


def test_a_training_runs_own_timing_line_under_a_limit_is_found_with_its_share(tmp_path):
    """limit_runs: the timing line `train` printed under --time-limit (kept as train-stdout.txt beside the run's
    held-out table) and its share of the limit in steady steps; a run without a limit is not among them."""
    from medddpm.report.waiting import limit_runs
    from medddpm.train.timing import timing_line

    train = tmp_path / "gpu" / "anatomy" / "train"
    for name, steady in (("v-s1-fast-128", 81.0), ("v-s2-fast", 79.94)):  # printed 79.9 %
        (train / name).mkdir(parents=True)
        line = timing_line({"first step": 10.0, "steady steps": steady}, ready_s=2.0, time_limit_s=100.0)
        (train / name / "train-stdout.txt").write_text(f"trained to step 9\n{line}\n")
    (train / "v-s3-fast").mkdir()
    (train / "v-s3-fast" / "train-stdout.txt").write_text(timing_line({"steady steps": 5.0}, ready_s=1.0) + "\n")
    runs = limit_runs(tmp_path, ["gpu"])
    assert list(runs["share"]) == [0.81, 0.799] and list(runs["run"]) == ["v-s1-fast-128", "v-s2-fast"]
    assert limit_runs(tmp_path, ["none"]).empty


def test_where_time_to_result_stands_takes_each_row_from_the_newest_run_of_the_newest_date_that_has_it(tmp_path):
    """waiting.state: DDPM 250 (today's default) and the 12-call chain are told apart by the sampler that ran, each row
    from the newest run of the GPU's newest date holding it; an older date's rows stay out of the first table."""
    import json

    import pandas as pd

    from medddpm.report import waiting

    def run(name, date, rows):
        folder = tmp_path / "h200" / "time_to_result" / f"{name}-{date}"
        folder.mkdir(parents=True)
        pd.DataFrame([{"command": f"sample --masks m{extra}", "sampler": s, "volumes": 1, "cache": c, "wall_s": w, "rc": 0}
                      for s, c, w, extra in rows]).to_csv(folder / "time_to_result.csv", index=False)
        (folder / "run.json").write_text(json.dumps({"kind": "sample-rows", "name": name, "date": date, "gpu": "H200",
                                                     "machine": "m", "commits": {}, "changed": "c", "kept": "k"}))

    run("warmup-every-config", "2026-01-01", [("ddpm", "cold", 30.0, "")])  # an older date: not today's
    run("default-rows", "2026-01-02", [("dpm2m-sde", "warm", 4.0, ""), ("dpm2m-sde", "cold", 12.0, ""),
                                       ("ddpm", "warm", 8.0, " --sampler ddpm")])
    run("ddpm-v-default", "2026-01-02", [("ddpm", "cold", 17.0, "")])
    s = waiting.state(tmp_path, ["h200"]).set_index("what")
    rows = {r[0]: r for r in waiting.STATE_ROWS}
    ddpm_warm, ddpm_cold, chain_warm, chain_cold, _ = (r[0] for r in waiting.STATE_ROWS)
    assert s.loc[ddpm_warm, "today (s)"] == 8.0 and s.loc[ddpm_warm, "run"] == "time_to_result/default-rows-2026-01-02"
    assert s.loc[ddpm_cold, "today (s)"] == 17.0 and s.loc[ddpm_cold, "met"] == ("no" if 17.0 > rows[ddpm_cold][3] else "yes")
    assert s.loc[chain_warm, "today (s)"] == 4.0 and s.loc[chain_cold, "today (s)"] == 12.0
    assert len(s) == 4  # no 100-mask row measured, and the older date's cold DDPM row is not read
    assert (s["where"] == "").all()  # rows without their timing line's phases say nothing of them
    # a newer date's rows with their phases: the sample row nearest the median speaks for its seconds; a train row
    # without its line's phases reads its first step from the timing.csv its run kept beside it
    folder = tmp_path / "h200" / "time_to_result" / "default-rows-2026-01-03"
    folder.mkdir(parents=True)
    pd.DataFrame([{"command": "sample --masks m", "sampler": "ddpm", "volumes": 1, "cache": "warm", "wall_s": w, "rc": 0,
                   "ready_s": 2.0 + k, "first_volume_s": w - 0.5} for k, w in enumerate((8.0, 9.0, 30.0))]
                 + [{"command": f"train --steps 100{extra}", "volumes": 100, "cache": c, "wall_s": w, "rc": 0, "ready_s": r,
                     "first_step_s": f} for c, w, r, f, extra in (("cold", 140.0, None, None, ""), ("warm", 40.0, 11.0, 9.5, ""),
                                                                  ("warm", 35.0, 10.0, 8.0, " --optimizer adam"))]
                 ).to_csv(folder / "time_to_result.csv", index=False)  # last, an A/B arm beside train's defaults
    pd.DataFrame({"step_from": [0, 1], "step_to": [1, 100], "ms_per_step": [120_000.0, 100.0]}).to_csv(
        folder / "timing128-cold.csv", index=False)
    (folder / "run.json").write_text(json.dumps({"kind": "sample-rows", "name": "default-rows", "date": "2026-01-03",
                                                 "gpu": "H200", "machine": "m", "commits": {}, "changed": "c", "kept": "k"}))
    s = waiting.state(tmp_path, ["h200"]).set_index("what")
    assert s.loc[ddpm_warm, "today (s)"] == 9.0 and s.loc[ddpm_warm, "where"] == "ready at 3.0 s, its first volume at 8.5 s"
    trains = s[s.index.str.startswith("`train")]
    assert list(trains["where"]) == ["ready at 11.0 s, its first step 9.5 s",
                                     "its first step 120.0 s (timing128-cold.csv)"]  # warm first, then cold
    assert list(trains["today (s)"]) == [40.0, 140.0]  # train's defaults, not the --optimizer arm after them
