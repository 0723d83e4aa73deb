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


def test_the_chapters_facts_judge_the_targets_and_name_what_is_missing(tmp_path):
    """report.waiting: the rows of a store's GPU, the issue's targets met or missed, the sharded row
    against one GPU's; a store without the measurement reads '—' everywhere but the package's rule."""
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
    # rows written before the sampler column ran the default of then: the 12-step chain's solver
    assert f["tr_targets"] == ("1 mask warm, ≤ 5 s: met (4.5 s, dpm2m-sde); 1 mask cold, ≤ 15 s: met (9.0 s, dpm2m-sde); "
                               "100 masks warm, ≤ 25 s: missed (30.0 s, dpm2m-sde)") and f["tr_sampler"] == "`dpm2m-sde`"
    assert f["tr_per_volume"] == "0.15 s"
    assert f["tr_nproc"] == ("256 masks under `--config fast` (`dpm2m-sde`, ran `fast`), warm cache: one GPU 140.0 s (1.8 volumes/s); "
                             "2 ranks 80.0 s (3.2 volumes/s, 1.8×); 4 ranks 40.0 s (6.4 volumes/s, 3.5×)")
    assert f["tr_same"].startswith("—") and f["tr_fast8_cold"].startswith("—") and f["tr_profile_parts"].startswith("—")
    t = waiting.table(tmp_path, ["gpu-a"])
    assert len(t) == 7 and sorted(t["ranks"].unique()) == [1, 2, 4] and set(t["sampler"]) == {"dpm2m-sde"}
    # sharded rows of two commands: each its own part, newest first, each against the one-process row of its own
    # sampler; the default's 4-rank speed-up over one GPU judged against the 3×
    two = pd.read_csv(folder / "time_to_result.csv")
    extra = [("sample --masks m256 --out k --sampler ddpm", "default", 256, 400.0, "fast"),
             ("sample --masks m256 --out l --sampler dpm2m-sde", "default", 256, 90.0, "fast-eager"),
             ("sample --masks m256 --out m --sampler dpm2m-sde --nproc 4", "default", 256, 31.0, "fast-eager")]
    pd.concat([two, pd.DataFrame([{**two.iloc[0].to_dict(), "command": c, "config": cfg, "volumes": n, "wall_s": w,
                                   "cache": "warm", "ran": ran} for c, cfg, n, w, ran in extra])]).to_csv(
        folder / "time_to_result.csv", index=False)
    f3 = waiting.facts(tmp_path, ["gpu-a"])
    assert f3["tr_nproc"].startswith("256 masks by default (`dpm2m-sde`, ran `fast-eager`), warm cache: one GPU 90.0 s "
                                     "(2.8 volumes/s); 4 ranks 31.0 s (8.3 volumes/s, 2.9×); 256 masks under `--config fast`")
    assert f3["tr_targets"].endswith("256 masks warm on 4 ranks, ≥ 3× one GPU: missed (2.9×, dpm2m-sde, fast-eager)")
    # sharded runs of before the ranks saw only their own GPU: quoted apart, against today's one-GPU row
    before = folder / waiting.BEFORE_OWN_GPU
    before.mkdir(parents=True)
    pd.DataFrame([{**two.iloc[0].to_dict(), "command": extra[1][0] + " --nproc 2", "config": "default", "volumes": 256,
                   "wall_s": 60.0, "cache": "warm", "ran": "fast-eager"}]).to_csv(before / "time_to_result.csv", index=False)
    assert waiting.facts(tmp_path, ["gpu-a"])["tr_nproc_before"] == (
        "256 masks by default (`dpm2m-sde`, ran `fast-eager`), warm cache: one GPU 90.0 s (2.8 volumes/s); "
        "2 ranks 60.0 s (4.3 volumes/s, 1.5×)")
    assert f3["tr_nproc_before"].startswith("—")
    two.to_csv(folder / "time_to_result.csv", index=False)
    # a newer 8-mask row of another sampler is quoted with its name, and the per-volume cost still pairs
    # the 100-mask row with the 8-mask row of its own sampler
    more = pd.read_csv(folder / "time_to_result.csv")
    more.loc[len(more)] = {**more.iloc[3].to_dict(), "command": "sample --masks m8 --out h --config fast --sampler ddpm",
                           "wall_s": 90.0}
    more.to_csv(folder / "time_to_result.csv", index=False)
    f2 = waiting.facts(tmp_path, ["gpu-a"])
    assert f2["tr_fast8_warm"] == "90.0 s (`ddpm`, `fast`)" and f2["tr_per_volume"] == "0.15 s"
    # rows without the `ran` column ran what the rule of then picked: eager bf16 below 35 masks of the chain
    # (3 of DDPM 250), fast from there; a row that says what it ran is quoted with it
    assert list(waiting.rows(tmp_path, ["gpu-a"])["ran"]) == ["bf16", "bf16", "fast", "fast", "fast", "fast", "fast", "fast"]
    assert f2["tr_one_cold"] == "9.0 s (`dpm2m-sde`, `bf16`)"
    said = more.assign(ran=None)
    said.loc[0, "ran"] = "fast-eager"
    said.to_csv(folder / "time_to_result.csv", index=False)
    assert waiting.facts(tmp_path, ["gpu-a"])["tr_one_cold"] == "9.0 s (`dpm2m-sde`, `fast-eager`)"
    more.iloc[:-1].to_csv(folder / "time_to_result.csv", index=False)
    # the same comparison twice: the newest counts; a cProfile print of the 1-mask default, split
    same = pd.DataFrame([{"gpu": "G", "what": "fast twice", "files": 8, "identical": k, "max_abs_diff": 0.0,
                          "mean_abs_diff": 0.0, "date": "d"} for k in (3, 8)])
    same.to_csv(folder / "same_files.csv", index=False)
    # a row of another sampler under the same name is its own comparison, not the newest of the chain's
    assert len(waiting.same_files(tmp_path, ["gpu-a"])) == 1
    pd.concat([same, same.iloc[:1].assign(sampler="ddpm")]).to_csv(folder / "same_files.csv", index=False)
    assert sorted(waiting.same_files(tmp_path, ["gpu-a"])["identical"]) == [3, 8]
    same.to_csv(folder / "same_files.csv", index=False)
    (folder / "profile-sample-1-warm.txt").write_text(
        "         2117521 function calls (2062339 primitive calls) in 13.592 seconds\n"
        "   ncalls  tottime  percall  cumtime  percall filename:lineno(function)\n"
        "     1175    2.976    0.003    2.976    0.003 {built-in method builtins.compile}\n"
        "      121    2.876    0.024    2.880    0.024 /x/torch/_library/custom_ops.py:607(_register_to_dispatcher)\n"
        "        1    0.000    0.000    1.441    1.441 /w/medddpm/diffusion/gaussian.py:262(sample)\n")
    f = waiting.facts(tmp_path, ["gpu-a"])
    assert f["tr_same"] == "fast twice (`dpm2m-sde`): 8 of 8 files identical" and f["tr_profile_total"] == "13.6 s"
    assert f["tr_profile_parts"] == ("Python compiling source to bytecode 3.0 s; registering custom operators 2.9 s; "
                                     "sampling 1.4 s") and f["tr_profile_ops"] == "121"
    # a row of the current default sampler (written with the sampler column) is quoted among its own
    from medddpm.diffusion.solvers import REFERENCE

    rows = pd.read_csv(folder / "time_to_result.csv").assign(sampler="")
    new = rows.iloc[:1].assign(command="sample --masks m3 --out h --config fast", config="fast", volumes=3, wall_s=61.0,
                               sampler=REFERENCE.sampler)
    pd.concat([rows, new]).to_csv(folder / "time_to_result.csv", index=False)
    f = waiting.facts(tmp_path, ["gpu-a"])
    assert f["tr_default_rows"] == "3 masks, `--config fast`, cold: 61.0 s" and f["tr_sampler"] == "`dpm2m-sde`"
    # train's first 100 steps: the newest cold and warm rows, the warm run's read-backs, its cProfile split
    t = pd.read_csv(folder / "time_to_result.csv")
    train = t.iloc[:2].assign(command="train --images i --masks m --config fast --steps 100 --out t", config="fast",
                              volumes=100, cache=["cold", "warm"], wall_s=[120.0, 35.0], sampler=None)
    pd.concat([t, train]).to_csv(folder / "time_to_result.csv", index=False)
    pd.DataFrame({"step_from": [0, 50], "step_to": [50, 100], "ms_per_step": [430.0, 105.0]}).to_csv(
        folder / "train-timing-warm.csv", index=False)
    (folder / "profile-train-warm.txt").write_text(
        "         29605883 function calls (28330581 primitive calls) in 50.177 seconds\n"
        "       96/0    8.377    0.087    0.000          /x/torch/cuda/graphs.py:137(replay)\n"
        "        1    0.008    0.008    3.673    3.673 /x/torch/_functorch/partitioners.py:3449(min_cut_rematerialization_partition)\n")
    f = waiting.facts(tmp_path, ["gpu-a"])
    assert f["tr_train"] == ("120.0 s cold and 35.0 s warm; its steps 50–100 took 105.0 ms each, 430 ms each before, "
                             "so 100 steady steps would take 10.5 s")
    assert f["tr_train_parts"] == ("replaying the step's CUDA graph (the GPU's time) 8.4 s; AOT autograd's forward/backward "
                                   "partitioner 3.7 s (of 50.2 s under the profiler)")
    (folder / "train-cache-warm.txt").write_text(
        "LOG torch._functorch._aot_autograd.autograd_cache INFO Bypassing autograd cache due to: Unsupported x. \n"
        "COUNTER aot_autograd {'total': 1, 'autograd_cache_bypass': 1, 'ok': 1}\n"
        "COUNTER inductor {'extern_calls': 676, 'fxgraph_cache_hit': 2}\n")
    assert waiting.facts(tmp_path, ["gpu-a"])["tr_train_cache"] == ("AOT autograd's cache 1 bypass (“Unsupported x”); "
                                                                    "Inductor's graph cache 2 hits")
    # a warm run's cProfile after the cache change: against the earlier one, the parts no longer printed named
    assert f["tr_train_now"].startswith("—")
    after = folder / waiting.TRAIN_AFTER
    after.mkdir(parents=True)
    (after / "profile-train-warm.txt").write_text(
        "         13717208 function calls (13098340 primitive calls) in 34.235 seconds\n"
        "     96/0    8.194    0.085    0.000          /x/torch/cuda/graphs.py:137(replay)\n")
    pd.DataFrame({"step_from": [0, 50], "step_to": [50, 100], "ms_per_step": [476.5, 105.4]}).to_csv(
        after / "train-timing-warm.csv", index=False)
    assert waiting.facts(tmp_path, ["gpu-a"])["tr_train_now"] == (
        "34.2 s under the profiler (against 50.2 s before); replaying the step's CUDA graph (the GPU's time) 8.2 s; "
        "no longer among its costliest calls: AOT autograd's forward/backward partitioner; its own intervals (under the "
        "profiler): steps 0–50 476 ms a step, steps 50–100 105 ms a step")
    empty = waiting.facts(tmp_path, ["gpu-b"])
    assert all(v.startswith("—") for k, v in empty.items() if k not in waiting.STORE_FREE)


def test_the_phases_of_a_timed_row_and_the_changes_tried_against_main(tmp_path):
    """report.waiting.phases splits each newest `sample` row that has its timing line into the spans
    between its marks (rows without one are left out); ``tried`` sets each changed code's mean wall
    time beside main's, per call and command; either reads '—' without its rows."""
    from medddpm.report import waiting

    folder = tmp_path / "gpu-a" / waiting.FOLDER
    (folder / waiting.TRIED).mkdir(parents=True)
    base = {"gpu": "G", "config": "default", "ran": "fast-eager", "rc": 0, "torch": "t", "cuda": "c", "date": "d"}
    rows = pd.DataFrame([
        {**base, "command": "sample --masks m1 --out a", "sampler": "ddpm", "volumes": 1, "cache": "warm", "wall_s": 11.0,
         "ready_s": 0.7, "first_volume_s": 8.0, "last_volume_s": 8.0, "written_s": 8.4},
        {**base, "command": "sample --masks m256 --out b --nproc 4 --sampler dpm2m-sde", "sampler": "dpm2m-sde",
         "volumes": 256, "cache": "warm", "wall_s": 31.0, "ready_s": 3.5, "first_volume_s": 6.5, "last_volume_s": 24.0,
         "written_s": 24.5},
        {**base, "command": "sample --masks m8 --out c", "sampler": "ddpm", "volumes": 8, "cache": "warm", "wall_s": 50.0}])
    assert waiting.facts(tmp_path, ["gpu-a"])["tr_phases"].startswith("—")  # no time_to_result.csv yet
    rows.iloc[2:].to_csv(folder / "time_to_result.csv", index=False)  # a row written before the timing columns
    assert waiting.facts(tmp_path, ["gpu-a"])["tr_phases"].startswith("—")
    rows.to_csv(folder / "time_to_result.csv", index=False)
    f = waiting.facts(tmp_path, ["gpu-a"])
    assert f["tr_phases"] == (
        "1 mask by default, warm (`ddpm`), ran `fast-eager`, 11.0 s: outside the command's clock 2.6 s, checkpoint and "
        "masks read, denoiser built 0.7 s, the first volume's denoiser calls 7.3 s, the other volumes 0.0 s, the last "
        "files written 0.4 s; "
        "256 masks by default on 4 ranks, warm (`dpm2m-sde`), ran `fast-eager`, 31.0 s: outside the command's clock "
        "6.5 s, checkpoint and masks read, denoiser built 3.5 s, the first volume's denoiser calls 3.0 s, the other "
        "volumes 17.5 s, the last files written 0.5 s")
    # a row on the process's clock (imports_s): its marks in the order they fell (a graph captured at the second
    # volume, Knobs.capture_after), then the exit
    spans = waiting.spans(pd.Series({"wall_s": 9.0, "imports_s": 2.0, "ready_s": 2.5, "kernels_s": 3.0,
                                     "first_volume_s": 3.5, "captured_s": 4.0, "last_volume_s": 8.0, "written_s": 8.5}))
    assert [name for name, _ in spans] == [
        "Python's start and the imports", "checkpoint and masks read, denoiser built", "Triton kernels compiled or loaded",
        "the first volume's denoiser calls", "warm-up and the first CUDA graph's capture", "the other volumes",
        "the last files written", "the exit"]
    assert [round(sec, 6) for _, sec in spans] == [2.0, 0.5, 0.5, 0.5, 0.5, 4.0, 0.5, 0.5]
    assert f["tr_tried"].startswith("—")
    tried = pd.concat([rows.iloc[:2].assign(call="A", code="x changed", wall_s=[10.0, 30.0]),
                       rows.iloc[:2].assign(call="A", code="main abc", wall_s=[11.0, 33.0]),
                       rows.iloc[:1].assign(call="A", code="x changed", wall_s=12.0),
                       rows.iloc[2:].assign(call="B", code="y changed")])  # B: no main row of its command
    tried.to_csv(folder / waiting.TRIED / "time_to_result.csv", index=False)
    assert waiting.facts(tmp_path, ["gpu-a"])["tr_tried"] == (
        "call A (x changed; against main abc): 1 mask by default, warm (`ddpm`) 11.0 s against 11.0 s (2 and 1 run); "
        "256 masks by default on 4 ranks, warm (`dpm2m-sde`) 30.0 s against 33.0 s (1 and 1 run)")
    assert waiting.facts(tmp_path, ["gpu-b"])["tr_tried"].startswith("—")


def test_what_warmup_buys_the_next_sample_per_machine():
    """Issue 64: after `warmup` the first 1-mask `sample` against a warm run on the same machine, one
    clause per host, and whether it is within 10 %."""
    import pandas as pd

    from medddpm.report.waiting import after_warmup, tidy

    rows = []
    for host, (warm, after) in {"A": (12.0, 13.0), "B": (10.0, 12.0)}.items():
        for command, cache, wall, n in (("warmup --checkpoint c", "cold", 50.0, 0),
                                        ("sample --checkpoint c --masks m", "warmup", after, 1),
                                        ("sample --checkpoint c --masks m", "warm", warm, 1)):
            rows.append({"gpu": "NVIDIA H100 80GB HBM3", "gpu_slug": "h100-80gb-hbm3", "command": command,
                         "config": "default", "ran": "fast-eager" if n else "", "sampler": "ddpm" if n else "",
                         "volumes": n, "cache": cache, "wall_s": wall, "rc": 0, "host": host})
    text = after_warmup(tidy(pd.DataFrame(rows)))
    assert text.startswith("host A: `warmup` 50.0 s; then 1 mask by default (`fast-eager`) 13.0 s, against 12.0 s warm (+8 %, within")
    assert "host B:" in text and "(+20 %, outside the 10 % target)" in text
    assert after_warmup(tidy(pd.DataFrame())).startswith("—")


def test_rows_from_another_host_name_their_own_gpu_and_the_one_mask_targets():
    """Issue 64: the rows timed with Triton's key kept (``remembered_key``) came from a host that is
    not their store's: the fact names the rows' GPU, judges 1 mask warm and cold against the targets
    and says what `warmup` bought."""
    import pandas as pd

    from medddpm.report.waiting import remembered_key, tidy

    rows = [{"gpu": "NVIDIA H200", "gpu_slug": "h100-80gb-hbm3", "command": command, "config": "default",
             "ran": "fast-eager" if n else "", "sampler": "dpm2m-sde" if n else "", "volumes": n, "cache": cache,
             "wall_s": wall, "rc": 0, "ready_s": 0.5, "first_volume_s": 3.5, "written_s": 3.9}
            for command, cache, wall, n in (("sample --checkpoint c --masks m --out a", "cold", 26.7, 1),
                                            ("sample --checkpoint c --masks m --out b", "warm", 4.9, 1),
                                            ("warmup --checkpoint c", "cold", 40.9, 0),
                                            ("sample --checkpoint c --masks m --out c", "warmup", 5.2, 1))]
    text = remembered_key(tidy(pd.DataFrame(rows)))
    assert text.startswith("NVIDIA H200: 1 mask 4.9 s (met: 5 s) warm") and "26.7 s (missed: 15 s) cold" in text
    assert "then 1 mask by default (`fast-eager`) 5.2 s, against 4.9 s warm (+6 %, within the 10 % target)" in text
    assert remembered_key(tidy(pd.DataFrame())).startswith("—")


def test_a_training_runs_own_timing_line_under_a_limit_is_quoted_against_the_target(tmp_path):
    """limit_facts: the timing line `train` printed under --time-limit (kept as train-stdout.txt beside the
    run's held-out table), its GPUs from the run's env.json, and the 80 % target met or missed; a run
    without a limit, or a store without runs, quotes nothing."""
    import json

    from medddpm.report.waiting import limit_facts, limit_runs
    from medddpm.train.trainer import timing_line

    train = tmp_path / "gpu" / "anatomy" / "train"
    for name, steady in (("v-s1-fast-128", 81.0), ("v-s2-fast", 79.94)):  # printed 79.9 %: below the target
        (train / name).mkdir(parents=True)
        line = timing_line({"first step": 10.0, "steady steps": steady}, ready_s=2.0, time_limit_s=100.0)
        (train / name / "train-stdout.txt").write_text(f"trained to step 9\n{line}\n")
    (train / "v-s1-fast-128" / "env.json").write_text(json.dumps({"gpu": "NVIDIA H200", "gpus": 2}))
    (train / "v-s3-fast").mkdir()
    (train / "v-s3-fast" / "train-stdout.txt").write_text(timing_line({"steady steps": 5.0}, ready_s=1.0) + "\n")
    assert list(limit_runs(tmp_path, ["gpu"])["share"]) == [0.81, 0.799]
    said = limit_facts(tmp_path, ["gpu"])["tr_train_limit"]
    assert said.startswith("`v-s1-fast-128` on 2 × NVIDIA H200: ready 2.0 s")
    assert "81.0 % of --time-limit in steady steps (target ≥ 80 %: met)" in said and said.endswith("(target ≥ 80 %: missed)")
    assert limit_facts(tmp_path, ["none"])["tr_train_limit"].startswith("—")


def test_the_evaluation_cut_is_quoted_per_evaluation_and_checkpoint_from_both_runs_own_lines(tmp_path):
    """Chapter 15's before/after of the held-out changes: each run's seconds an evaluation and a checkpoint
    from its own timing line, and its share of the limit; a store without both runs quotes nothing."""
    from medddpm.report.waiting import EVAL_CUT, FOLDER, TRAIN_CLOCK, eval_cut
    from medddpm.train.trainer import timing_line

    for run, held, ckpt, steady in ((TRAIN_CLOCK, 64.0, 11.0, 213.0), (EVAL_CUT, 40.8, 3.0, 247.0)):
        folder = tmp_path / "gpu" / FOLDER / run
        folder.mkdir(parents=True)
        line = timing_line({"held-out": held, "held-out n": 10, "checkpoints": ckpt, "checkpoints n": 10,
                            "steady steps": steady, "steady steps n": 100}, ready_s=1.0, time_limit_s=300.0)
        (folder / "train64-stdout-warm.txt").write_text(f"trained\n{line}\nrc 0 wall 310.0 s\n")
    said = eval_cut(tmp_path, "gpu")
    assert said.startswith("6.4 s an evaluation, 1.10 s a checkpoint, 71 % of the limit")
    assert said.endswith(f"4.1 s an evaluation, 0.30 s a checkpoint, 82.3 % of the limit in steady steps (`{EVAL_CUT}`)")
    (tmp_path / "gpu" / FOLDER / EVAL_CUT / "train64-stdout-warm.txt").unlink()
    assert eval_cut(tmp_path, "gpu").startswith("—") and eval_cut(tmp_path, None).startswith("—")


def test_the_eager_kernels_are_quoted_against_fasts_by_category(tmp_path):
    """Chapter 15's evidence for the 100-mask target: each configuration's kernel milliseconds a call
    and the categories that differ most, from the two denoise_kernels tables; nothing without both."""
    import pandas as pd

    from medddpm.report.waiting import EAGER_KERNELS, FOLDER, eager_kernels

    folder = tmp_path / "gpu" / FOLDER / EAGER_KERNELS
    folder.mkdir(parents=True)
    for cfg, rows in (("fast-eager", [("convolution/GEMM", 12.0), ("elementwise", 4.0), ("copy", 1.5)]),
                      ("fast", [("convolution/GEMM", 11.5), ("Triton pointwise", 1.5)])):
        pd.DataFrame([{"category": c, "short_name": c, "ms_per_step": ms, "idle_ms_before": 0.1} for c, ms in rows]
                     ).to_csv(folder / f"denoise_kernels_{cfg}.csv", index=False)
    said = eager_kernels(tmp_path, "gpu")
    assert said.startswith("17.50 ms of kernels a call under `fast-eager` without its fused residual "
                           "(`fast-eager-unfused`) against 13.00 ms under `fast`")
    assert said.endswith("elementwise 4.00 against 0.00 ms, Triton pointwise 0.00 against 1.50 ms, copy 1.50 against "
                         "0.00 ms, convolution/GEMM 12.00 against 11.50 ms")
    (folder / "denoise_kernels_fast.csv").unlink()
    assert eager_kernels(tmp_path, "gpu").startswith("—")


def _timed_rows(rows: list[tuple]) -> "pd.DataFrame":
    import pandas as pd

    cols = ["config", "volumes", "cache", "wall_s", "kernels_s", "first_volume_s", "last_volume_s"]
    base = {"gpu": "G", "command": "sample --masks m --out o", "ran": "fast-eager", "sampler": "dpm2m-sde", "rc": 0,
            "torch": "t", "cuda": "c", "date": "d", "imports_s": 1.0, "ready_s": 2.0, "captured_s": 3.0, "written_s": 9.0}
    return pd.DataFrame([{**base, **dict(zip(cols, r))} for r in rows])


def test_the_fused_residual_is_quoted_against_the_unfused_sampler_on_one_machine(tmp_path):
    """The 100-mask rows of both configurations, their first-to-last-volume spans, the kernel
    milliseconds of a call (kernel rows only: an aten op's row repeats its kernels' time), the bias and
    residual adds and the new kernel, not the 1-mask rows; nothing without the op tables. The pool rows by their arm."""
    import pandas as pd

    from medddpm.report.waiting import FOLDER, FUSED_RESIDUAL, OVERLAP, POOL_TRIED, cold_arms, fused_residual, warm_arms

    folder = tmp_path / "gpu" / FOLDER / FUSED_RESIDUAL
    folder.mkdir(parents=True)
    _timed_rows([("default", 1, "cold", 19.0, 18.0, 18.5, 18.5), ("default", 1, "warm", 6.5, 5.8, 6.0, 6.0),
                 ("default", 1, "warm", 7.0, 6.0, 6.5, 6.5), ("default", 100, "warm", 33.0, 7.0, 7.5, 32.5),
                 ("fast-eager-unfused", 100, "warm", 36.0, 7.0, 7.0, 35.5)]).to_csv(folder / "time_to_result.csv",
                                                                                    index=False)
    for cfg, ops in (("fast-eager", [("aten::add_", 0.5), ("void elementwise_kernel<add>", 0.5), ("conv_kernel", 12.0),
                                     ("aten::cudnn_convolution", 12.0), ("_residual_kernel", 1.0)]),
                     ("fast-eager-unfused", [("aten::add_", 3.0), ("aten::add", 1.0), ("void elementwise_kernel<add>", 4.0),
                                             ("conv_kernel", 12.0), ("aten::cudnn_convolution", 12.0)])):
        pd.DataFrame([{"op": o, "shapes": "[]", "calls_per_step": 1.0, "ms_per_step": ms} for o, ms in ops]
                     ).to_csv(folder / f"ops_{cfg}.csv", index=False)
    first = fused_residual(tmp_path, "gpu")
    assert first == (
        "100 masks by default, warm: 33.0 s against 36.0 s under `fast-eager-unfused` on the same machine (25.0 "
        "against 28.5 s from the first volume to the last); a denoiser call's kernels 13.50 against 16.00 ms, of them "
        "the bias adds 0.50 against 3.00 ms, the residual adds 0.00 against 1.00 ms and the new kernel 1.00 ms")
    second = folder / "machine-2"
    second.mkdir()
    for f in folder.glob("*.csv"):
        (second / f.name).write_text(f.read_text())
    assert fused_residual(tmp_path, "gpu").endswith("; again on another machine of the same kind: 100 masks by default, "
                                                    "warm: 33.0 s against 36.0 s under `fast-eager-unfused` on the same "
                                                    "machine (25.0 against 28.5 s from the first volume to the last); a "
                                                    "denoiser call's kernels 13.50 against 16.00 ms, of them the bias adds "
                                                    "0.50 against 3.00 ms, the residual adds 0.00 against 1.00 ms and the "
                                                    "new kernel 1.00 ms")
    (second / "ops_fast-eager.csv").unlink()  # a machine without its tables: named as missing
    assert fused_residual(tmp_path, "gpu").startswith("—")
    pool = tmp_path / "gpu" / FOLDER / POOL_TRIED
    pool.mkdir(parents=True)
    _timed_rows([("default", 1, "cold", w, k, w - 0.5, w - 0.5) for w, k in ((22.0, 21.0), (15.0, 14.0), (20.0, 19.0))]
                ).to_csv(pool / "time_to_result.csv", index=False)
    assert cold_arms(tmp_path, "gpu", POOL_TRIED).startswith("—")  # which arm each row is: arms.csv
    pd.DataFrame({"row": [1, 2, 3], "arm": ["workers", "threads", "workers"]}).to_csv(pool / "arms.csv", index=False)
    assert cold_arms(tmp_path, "gpu", POOL_TRIED) == ("workers: 22.0, 20.0 s (Triton's kernels ready 19.0, 17.0 s after "
                                                      "`ready`); threads: 15.0 s (Triton's kernels ready 12.0 s after `ready`)")
    overlap = tmp_path / "gpu" / FOLDER / OVERLAP  # warm 100-mask rows by arm, and the arms' files compared
    overlap.mkdir(parents=True)
    _timed_rows([("default", 1, "cold", 12.0, 11.0, 11.5, 11.5), ("default", 100, "warm", 29.0, 3.0, 5.0, 28.5),
                 ("default", 100, "warm", 31.0, 3.0, 4.5, 30.5)]).to_csv(overlap / "time_to_result.csv", index=False)
    pd.DataFrame({"row": [1, 2, 3], "arm": ["new", "new", "old"]}).to_csv(overlap / "arms.csv", index=False)
    assert warm_arms(tmp_path, "gpu", OVERLAP).startswith("—")  # the files not compared: named as missing
    (overlap / "same_files.txt").write_text("new-h1 against old-h1: 100 of 100 files identical\ndistinct files: 100\n")
    assert warm_arms(tmp_path, "gpu", OVERLAP) == (
        "new: 29.0 s (23.5 s from the first volume to the last); old: 31.0 s (26.0 s from the first volume to the "
        "last); new-h1 against old-h1: 100 of 100 files identical; distinct files: 100")
    (overlap / "machine-2").mkdir()  # a second machine follows the first
    for f in overlap.glob("*.*"):
        (overlap / "machine-2" / f.name).write_text(f.read_text())
    assert warm_arms(tmp_path, "gpu", OVERLAP).endswith("; again on another machine of the same kind: new: 29.0 s (23.5 s "
                                                        "from the first volume to the last); old: 31.0 s (26.0 s from the "
                                                        "first volume to the last); new-h1 against old-h1: 100 of 100 "
                                                        "files identical; distinct files: 100")


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
