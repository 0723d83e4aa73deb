import json
import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest

from medddpm.profiling.bench import COLUMNS
from medddpm.core.io import append_rows
from medddpm.cli import main
from medddpm.core.errors import InputError


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, needle):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err


def test_summary_json(capsys):
    code, out, _ = run(capsys, "summary", "--model", "whole-head", "--json")
    s = json.loads(out)
    assert code == 0 and s["parameters"] == 40_226_433 and s["forward_flops"] == 5_536_663_142_400
    assert s["input_shape"] == [1, 3, 128, 128, 128]
    code, out, _ = run(capsys, "summary", "--model", "tiny", "--size", "32", "--json")
    assert json.loads(out)["output_shape"] == [1, 1, 32, 32, 32]


def test_train_sample_end_to_end(capsys, phantoms, tmp_path):
    run_dir = tmp_path / "run"
    code, out, err = run(capsys, "train", "--images", str(phantoms / "images"), "--masks", str(phantoms / "masks"),
                         "--model", "tiny", "--steps", "2", "--out", str(run_dir), "--size", "16", "--quiet")
    assert code == 0, err
    assert (run_dir / "checkpoint.pt").exists() and (run_dir / "log.csv").exists()
    code, out, err = run(capsys, "train", "--images", str(phantoms / "images"), "--masks", str(phantoms / "masks"),
                         "--model", "tiny", "--steps", "3", "--out", str(run_dir), "--size", "16", "--quiet", "--resume")
    assert code == 0 and "step 3" in out
    code, out, err = run(capsys, "sample", "--checkpoint", str(run_dir / "checkpoint.pt"), "--masks",
                         str(phantoms / "masks"), "--out", str(tmp_path / "s"), "--sampler", "ddim", "--steps", "3", "--quiet")
    assert code == 0, err
    for m in sorted((phantoms / "masks").iterdir()):
        out_img, mask = nib.load(str(tmp_path / "s" / m.name)), nib.load(str(m))
        assert out_img.shape == mask.shape and np.allclose(out_img.affine, mask.affine)
        assert out_img.get_data_dtype() == np.float32
    # a second run into the same folder refuses rather than overwrite
    code, _, err = run(capsys, "sample", "--checkpoint", str(run_dir / "checkpoint.pt"), "--masks",
                       str(phantoms / "masks"), "--out", str(tmp_path / "s"), "--sampler", "ddim", "--steps", "3")
    assert_one_line_error(code, err, "already holds")
    # --out naming a file, and a resume under another configuration: one line each, nothing written
    (tmp_path / "file.nii.gz").write_bytes(b"keep")
    code, _, err = run(capsys, "sample", "--checkpoint", str(run_dir / "checkpoint.pt"), "--masks",
                       str(phantoms / "masks"), "--out", str(tmp_path / "file.nii.gz"), "--sampler", "ddim", "--steps", "3")
    assert_one_line_error(code, err, "is a file")
    assert (tmp_path / "file.nii.gz").read_bytes() == b"keep"
    before = (run_dir / "checkpoint.pt").read_bytes()
    code, out, err = run(capsys, "train", "--images", str(phantoms / "images"), "--masks", str(phantoms / "masks"),
                         "--model", "tiny", "--steps", "4", "--out", str(run_dir), "--size", "16", "--quiet", "--resume",
                         "--config", "opt1")
    assert_one_line_error(code, err, "trained with --config baseline, not opt1; resume with --config baseline")
    assert len(err) < 300 and (run_dir / "checkpoint.pt").read_bytes() == before


def test_bad_inputs_give_one_line_and_exit_2(capsys, phantoms, tmp_path):
    base = ["train", "--model", "tiny", "--steps", "1", "--size", "16", "--quiet"]
    code, _, err = run(capsys, *base, "--images", str(tmp_path / "missing"), "--masks", str(phantoms / "masks"),
                       "--out", str(tmp_path / "r"))
    assert_one_line_error(code, err, "does not exist")
    code, _, err = run(capsys, *base, "--images", str(phantoms / "images"), "--masks", str(phantoms / "masks"),
                       "--out", str(tmp_path / "r"), "--device", "cuda")
    assert_one_line_error(code, err, "no CUDA GPU")
    code, _, err = run(capsys, *base, "--images", str(phantoms / "images"), "--masks", str(phantoms / "masks"),
                       "--out", str(tmp_path / "r"), "--model", "nope")
    assert_one_line_error(code, err, "unknown model 'nope'")
    code, _, err = run(capsys, *base, "--images", str(phantoms / "images"), "--masks", str(phantoms / "masks"),
                       "--out", str(tmp_path / "r"), "--size", "15")
    assert_one_line_error(code, err, "divisible by 2")
    assert not (tmp_path / "r").exists()  # nothing half-written


def test_corrupt_volume_fails_before_training(capsys, phantoms, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(phantoms, data)
    (data / "images" / "phantom_001.nii.gz").write_bytes(b"garbage")
    code, _, err = run(capsys, "train", "--images", str(data / "images"), "--masks", str(data / "masks"), "--model",
                       "tiny", "--steps", "1", "--size", "16", "--out", str(tmp_path / "r"), "--quiet")
    assert_one_line_error(code, err, "phantom_001")
    assert not (tmp_path / "r" / "checkpoint.pt").exists()


def test_image_and_mask_in_different_spaces_fail_before_training(capsys, phantoms, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(phantoms, data)
    path = data / "images" / "phantom_001.nii.gz"
    img = nib.load(str(path))
    lps = np.diag([-1.0, -1.0, 1.0, 1.0]) @ img.affine  # same voxels, now claimed to be LPS
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj), lps), str(path))
    code, _, err = run(capsys, "train", "--images", str(data / "images"), "--masks", str(data / "masks"), "--model",
                       "tiny", "--steps", "1", "--size", "16", "--out", str(tmp_path / "r"), "--quiet")
    assert_one_line_error(code, err, "not in the same space")
    assert not (tmp_path / "r").exists()


def test_sample_with_bad_mask_writes_nothing(capsys, phantoms, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    assert run(capsys, "train", "--images", str(phantoms / "images"), "--masks", str(phantoms / "masks"), "--model",
               "tiny", "--steps", "1", "--size", "16", "--out", str(run_dir), "--quiet")[0] == 0
    masks = tmp_path / "masks"
    shutil.copytree(phantoms / "masks", masks)
    lab = np.zeros((16, 16, 16), np.uint8)
    lab[0, 0, 0] = 9
    nib.save(nib.Nifti1Image(lab, np.eye(4)), str(masks / "zz_bad.nii.gz"))
    code, _, err = run(capsys, "sample", "--checkpoint", str(run_dir / "checkpoint.pt"), "--masks", str(masks),
                       "--out", str(tmp_path / "s"), "--sampler", "ddim", "--steps", "2")
    assert_one_line_error(code, err, "unknown label values [9]")
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").iterdir())


def test_sample_config_and_batch(capsys, phantoms, tmp_path):
    run_dir = tmp_path / "run"
    assert run(capsys, "train", "--images", str(phantoms / "images"), "--masks", str(phantoms / "masks"), "--model",
               "tiny", "--steps", "1", "--size", "16", "--out", str(run_dir), "--quiet")[0] == 0
    base = ["sample", "--checkpoint", str(run_dir / "checkpoint.pt"), "--masks", str(phantoms / "masks"),
            "--sampler", "ddim", "--steps", "2", "--quiet", "--eta", "1"]
    for extra, needle in ((["--batch", "4"], "--batch 4 is larger than the 3 mask(s)"),
                          (["--config", "nope"], "--config 'nope' is not a run configuration"),
                          (["--batch", "0"], "--batch must be >= 1"),
                          (["--device", "cuda"], "no CUDA GPU")):
        code, _, err = run(capsys, *base, "--out", str(tmp_path / "bad"), *extra)
        assert_one_line_error(code, err, needle)
        assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").iterdir())
    # a batch of 3 and one mask at a time give the same volumes (per-mask seeds), in any configuration
    assert run(capsys, *base, "--out", str(tmp_path / "b3"), "--batch", "3")[0] == 0
    assert run(capsys, *base, "--out", str(tmp_path / "b1"), "--config", "opt12")[0] == 0
    for f in sorted((tmp_path / "b3").iterdir()):
        a, b = (nib.load(str(d / f.name)).get_fdata() for d in (tmp_path / "b3", tmp_path / "b1"))
        np.testing.assert_allclose(a, b, atol=1e-4)
        assert a.dtype == np.float64 and nib.load(str(f)).get_data_dtype() == np.float32


def test_bench_sample_cpu_rows(capsys, tmp_path):
    from medddpm.profiling.sample_bench import COLUMNS as SAMPLE_COLUMNS

    out = tmp_path / "sample_bench.csv"
    code, stdout, err = run(capsys, "bench-sample", "--model", "tiny", "--size", "16", "--config", "baseline",
                            "--sampler", "ddim", "--steps", "2", "--repeats", "2", "--batch", "2", "--device", "cpu",
                            "--out", str(out), "--json")
    assert code == 0, err
    rows = json.loads(stdout)
    assert rows[0]["steps"] == 2 and rows[0]["batch"] == 2 and len(rows[0]["s_per_volume"]) == 2
    assert rows[0]["s_per_volume_min"] <= rows[0]["s_per_volume_median"] <= rows[0]["s_per_volume_max"]
    assert out.read_text().splitlines()[0].split(",") == SAMPLE_COLUMNS
    code, _, err = run(capsys, "bench-sample", "--model", "tiny", "--size", "16", "--sampler", "ddpm", "--steps", "5",
                       "--device", "cpu")
    assert_one_line_error(code, err, "runs all 250 steps")
    code, _, err = run(capsys, "bench-sample", "--model", "tiny", "--size", "16", "--device", "cpu", "--config",
                       "baseline", "--out", str(tmp_path / "other.csv"), "--steps", "1", "--repeats", "1")
    assert code == 0
    append_rows(tmp_path / "bench.csv", [], COLUMNS)
    code, _, err = run(capsys, "bench-sample", "--model", "tiny", "--size", "16", "--device", "cpu", "--config",
                       "baseline", "--out", str(tmp_path / "bench.csv"), "--steps", "1", "--repeats", "1")
    assert_one_line_error(code, err, "not the sample_bench columns")


def test_bench_cpu_rows(capsys, tmp_path):
    out = tmp_path / "bench.csv"
    code, stdout, err = run(capsys, "bench", "--model", "tiny", "--size", "16", "--config", "baseline,opt1",
                            "--steps", "1", "--warmup", "0", "--device", "cpu", "--out", str(out), "--json")
    assert code == 0, err
    rows = json.loads(stdout)
    assert [r["config"] for r in rows] == ["baseline", "opt1"]
    assert rows[0]["tf32_conv"] is False and rows[1]["tf32_conv"] is True and rows[1]["tf32_matmul"] is True
    lines = out.read_text().splitlines()
    assert lines[0].split(",") == COLUMNS and len(lines) == 3
    code, stdout, err = run(capsys, "bench", "--model", "tiny", "--size", "16", "--config", "bf16-graphs", "--steps", "1",
                            "--warmup", "0", "--device", "cpu", "--grad-accum", "2", "--out", str(out))
    assert code == 0 and "2 micro-batch(es)" in stdout and out.read_text().splitlines()[-1].endswith(",2")
    code, _, err = run(capsys, "bench", "--model", "tiny", "--size", "16", "--grad-accum", "0", "--device", "cpu")
    assert_one_line_error(code, err, "--grad-accum must be >= 1")
    code, _, err = run(capsys, "bench", "--model", "tiny", "--size", "16", "--config", "bogus", "--device", "cpu")
    assert_one_line_error(code, err, "unknown configuration 'bogus'")


def test_bench_csv_with_other_columns_is_refused(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="not the bench columns"):
        append_rows(p, [], COLUMNS)
    assert p.read_text() == "a,b\n1,2\n"


def test_info_json(capsys):
    code, out, _ = run(capsys, "info", "--json")
    info = json.loads(out)
    assert code == 0 and {"torch", "cuda", "cudnn", "gpu", "tf32_conv", "tf32_matmul"} <= set(info)


def test_console_script_usage_error():
    p = subprocess.run([sys.executable, "-m", "medddpm", "train"], capture_output=True, text=True)
    assert p.returncode == 2 and "required" in p.stderr


def test_device_defaults_to_the_gpu_when_there_is_one(monkeypatch):
    import argparse

    import torch

    from medddpm import cli

    for has_gpu, expected in ((True, "cuda"), (False, "cpu")):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: has_gpu)
        a = argparse.Namespace(device=None)
        cli.default_device(a)
        assert a.device == expected
    a = argparse.Namespace(device="cuda:1")
    cli.default_device(a)
    assert a.device == "cuda:1"  # what the user gave stays
    for command in ("train", "sample", "bench", "bench-sample"):
        args = cli.parser().parse_args([command, "--help"][:1] + {"train": ["--images", "i", "--masks", "m", "--steps",
                                        "1", "--out", "o"], "sample": ["--checkpoint", "c", "--masks", "m", "--out", "o"]
                                        }.get(command, []))
        assert args.device is None  # resolved by default_device, not by argparse's default


def test_train_with_held_out_subjects_reports_their_loss(capsys, phantoms, tmp_path):
    out = tmp_path / "run"
    base = ["train", "--images", str(phantoms / "images"), "--masks", str(phantoms / "masks"), "--model", "tiny",
            "--size", "16", "--device", "cpu", "--quiet", "--out", str(out)]
    code, stdout, _ = run(capsys, *base, "--steps", "2", "--held-out", "1", "--eval-every", "1")
    assert code == 0 and "held-out loss at step 2" in stdout and "lowest of the EMA" in stdout
    assert (out / "heldout.csv").exists() and (out / "best.pt").exists()
    code, _, err = run(capsys, *base, "--steps", "2", "--eval-every", "5")
    assert_one_line_error(code, err, "--eval-every needs --held-out")
    code, _, err = run(capsys, *base, "--steps", "2", "--eval-weights", "both")
    assert_one_line_error(code, err, "--eval-weights needs --held-out")
    n = len(list((phantoms / "images").iterdir()))
    code, _, err = run(capsys, *base[:-1], str(tmp_path / "x"), "--steps", "2", "--held-out", str(n))
    assert_one_line_error(code, err, f"--held-out must be in [1, {n - 1}]")
    code, _, err = run(capsys, *base[:-1], str(tmp_path / "y"), "--steps", "2", "--time-limit", "0")
    assert_one_line_error(code, err, "--time-limit must be > 0")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_append_rows_adds_new_columns_to_an_older_table_and_refuses_another(tmp_path):
    p = tmp_path / "t.csv"
    append_rows(p, [{"a": 1, "b": 2}], ["a", "b"])
    append_rows(p, [{"a": 3, "b": 4, "c": 5}], ["a", "b", "c"])
    assert p.read_text().splitlines() == ["a,b,c", "1,2,", "3,4,5"]
    with pytest.raises(InputError, match="not the bench columns"):
        append_rows(p, [{"a": 1, "d": 2}], ["a", "d"])
    assert p.read_text().splitlines()[-1] == "3,4,5"


def test_sampling_refuses_a_negative_eta(capsys, tmp_path):
    code, _, err = run(capsys, "bench-sample", "--model", "tiny", "--size", "16", "--device", "cpu", "--eta", "-1")
    assert_one_line_error(code, err, "--eta must be >= 0")


def test_configs_lists_the_user_names_and_on_request_the_ablations(capsys):
    from medddpm.core.config import CONFIGS, USER_CONFIGS

    code, out, _ = run(capsys, "configs", "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert code == 0 and list(rows) == list(USER_CONFIGS)
    assert rows["fast"]["use"] == "train, sample" and rows["fast-fp8"]["use"] == "sample"
    assert rows["opt1"]["on a CPU"] == "as on a GPU" and "reference path" in rows["fast"]["on a CPU"]
    assert rows["opt1"]["GPU"] == "not needed" and rows["fast"]["GPU"] == "for its speed levers"
    code, out, _ = run(capsys, "configs", "--all", "--json")
    every = {r["name"]: r for r in json.loads(out)}
    assert set(CONFIGS) <= set(every) and every["fast-w16"]["use"] == "sample"
    assert every["bf16"]["what"] == "tf32, precision=bf16"
    assert main(["train", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "fast-fp8" not in help_text and "medddpm configs --all" in help_text
    assert "opt1 = the paper's OPT1: TF32 tensor cores" in help_text


def test_parcellation_masks_train_and_sample_through_the_stored_map(capsys, ixi16, ixi_checkpoint, tmp_path):
    import torch

    cfg = torch.load(ixi_checkpoint, weights_only=False)["config"]
    assert cfg["data_config"] == {"intensity": "percentile", "percentiles": (0.5, 99.5), "mask_labels": "brain=nonzero"}
    assert cfg["diffusion"]["prediction"] == "v" and cfg["diffusion"]["offset_noise"] == 0.1
    code, out, err = run(capsys, "sample", "--checkpoint", str(ixi_checkpoint), "--masks", str(ixi16 / "val" / "masks"),
                         "--out", str(tmp_path / "s"), "--sampler", "dpm2m-sde", "--steps", "2", "--quiet", "--device", "cpu")
    assert code == 0, err
    assert [p.name for p in (tmp_path / "s").iterdir()] == ["IXI015.nii.gz"]
    code, _, err = run(capsys, "sample", "--checkpoint", str(ixi_checkpoint), "--masks", str(ixi16 / "val" / "masks"),
                       "--out", str(tmp_path / "t"), "--quiet", "--device", "cpu", "--mask-labels", "brain=4")
    assert_one_line_error(code, err, "unmapped")
    assert not (tmp_path / "t").exists()


def test_parcellation_options_fail_early_with_one_line(capsys, ixi16, ixi_checkpoint, tmp_path):
    dev = ["--images", str(ixi16 / "dev" / "images"), "--masks", str(ixi16 / "dev" / "masks"), "--model", "tiny",
           "--steps", "1", "--size", "16", "--quiet", "--device", "cpu"]
    code, _, err = run(capsys, "train", *dev, "--out", str(tmp_path / "a"))
    assert_one_line_error(code, err, "--mask-labels")
    code, _, err = run(capsys, "train", *dev, "--out", str(tmp_path / "b"), "--mask-labels", "brian=nonzero")
    assert_one_line_error(code, err, "unknown name 'brian'")
    code, _, err = run(capsys, "train", *dev, "--out", str(tmp_path / "c"), "--mask-labels", "brain=nonzero",
                       "--percentiles", "1", "99")
    assert_one_line_error(code, err, "--intensity percentile")
    code, _, err = run(capsys, "train", *dev, "--out", str(tmp_path / "d"), "--mask-labels", "brain=nonzero",
                       "--offset-noise", "2")
    assert_one_line_error(code, err, "offset_noise")
    assert not any((tmp_path / d).exists() for d in "abcd")
    # resuming under another parameterization names what differs, in one line
    code, _, err = run(capsys, "train", *dev[:-5], "--steps", "3", "--size", "16", "--quiet", "--device", "cpu",
                       "--out", str(ixi_checkpoint.parent), "--resume", "--held-out", "1", "--mask-labels",
                       "brain=nonzero", "--intensity", "percentile", "--offset-noise", "0.1", "--prediction", "eps")
    assert_one_line_error(code, err, "prediction 'v' → 'eps'")


def test_train_defaults_to_v_prediction_and_resume_keeps_the_checkpoints_recipe(capsys, phantoms, tmp_path):
    """A new run predicts v (right on real brains); the paper's ε is `--prediction eps`; `--resume`
    without the option continues the checkpoint's own recipe, and against it is one clear error."""
    from medddpm.train.checkpoint import configs_from_checkpoint, load_checkpoint

    def train(out, *extra):
        return main(["train", "--images", str(phantoms / "images"), "--masks", str(phantoms / "masks"), "--model", "tiny",
                     "--size", "16", "--out", str(tmp_path / out), "--quiet", "--device", "cpu", "--grad-accum", "1",
                     *extra])

    def prediction(out):
        return configs_from_checkpoint(load_checkpoint(tmp_path / out / "checkpoint.pt"))[1].prediction

    assert train("v", "--steps", "1") == 0 and prediction("v") == "v"
    assert train("eps", "--steps", "1", "--prediction", "eps") == 0 and prediction("eps") == "eps"
    assert train("eps", "--steps", "2", "--resume") == 0 and prediction("eps") == "eps"
    capsys.readouterr()
    assert train("eps", "--steps", "3", "--resume", "--prediction", "v") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cannot resume" in err and "prediction" in err
    # --batch: volumes per micro-batch, kept in the checkpoint; a resume at another batch trains something else
    assert train("b2", "--steps", "1", "--batch", "2") == 0
    assert load_checkpoint(tmp_path / "b2" / "checkpoint.pt")["config"]["global_batch"] == 2
    capsys.readouterr()
    assert train("b2", "--steps", "2", "--resume", "--batch", "1") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cannot resume" in err and "batch_size" in err
    assert train("b0", "--steps", "1", "--batch", "0") == 2 and not (tmp_path / "b0").exists()
    assert "batch_size must be >= 1" in capsys.readouterr().err
    # --optimizer muon: kept in the checkpoint with both optimizers' states; --resume continues it, and refuses adam
    assert train("mu", "--steps", "1", "--optimizer", "muon") == 0 and train("mu", "--steps", "2", "--resume") == 0
    ckpt = load_checkpoint(tmp_path / "mu" / "checkpoint.pt")
    assert ckpt["config"]["train"]["optimizer"] == "muon" and set(ckpt["optimizer"]) == {"muon", "adam"}
    capsys.readouterr()
    assert train("mu", "--steps", "3", "--resume", "--optimizer", "adam") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cannot resume" in err and "optimizer" in err
    # the default is muon; a run of the earlier default (cosine: Adam alone) resumes as Adam
    assert load_checkpoint(tmp_path / "v" / "checkpoint.pt")["config"]["train"]["recipe"] == "muon"
    assert train("cos", "--steps", "1", "--recipe", "cosine") == 0 and train("cos", "--steps", "2", "--resume") == 0
    ckpt = load_checkpoint(tmp_path / "cos" / "checkpoint.pt")
    assert ckpt["config"]["train"]["optimizer"] == "adam" and ckpt["step"] == 2 and "state" in ckpt["optimizer"]
    # its summary line names the recipe and each value given on top of it
    capsys.readouterr()
    assert train("lr", "--steps", "1", "--lr", "1e-4") == 0
    assert "trained to step 1 (recipe muon with lr 0.0001);" in capsys.readouterr().out


def test_sigterm_stops_train_checkpointed_with_the_resume_command(phantoms, tmp_path):
    """Issue 77 item 5: SIGTERM (a scheduler's pre-emption) during `train` saves the step under way, prints one line
    with the command that continues it, and exits 143; that command continues the run."""
    import os
    import shlex
    import signal
    import time

    from medddpm.train.checkpoint import load_checkpoint

    run_dir = tmp_path / "run"
    argv = ["train", "--images", str(phantoms / "images"), "--masks", str(phantoms / "masks"), "--model", "tiny",
            "--size", "16", "--steps", "100000", "--out", str(run_dir), "--quiet", "--device", "cpu", "--save-every", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "medddpm", *argv], stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 120
    while not (run_dir / "checkpoint.pt").exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    lines = err.strip().splitlines()
    assert p.returncode == 143 and len(lines) == 1 and "stopped by SIGTERM" in lines[0], err
    step = load_checkpoint(run_dir / "checkpoint.pt")["step"]
    assert f"at step {step:,};" in lines[0]
    again = shlex.split(lines[0].split("continue with: ")[1])[1:]  # the printed command, less `medddpm`
    assert again.count("--resume") == 1
    again[again.index("--steps") + 1] = str(step + 1)
    assert main(again) == 0 and load_checkpoint(run_dir / "checkpoint.pt")["step"] == step + 1


def test_a_lost_rank_is_one_line_naming_it_and_the_resume_command(tiny_checkpoint, tmp_path):
    """Issue 77 item 1: the launcher's line for ranks that died by a signal: the lost one (not the survivors torchrun
    ends with SIGTERM), the checkpoint's step and the command that continues; gloo's closed connection is a lost
    contact, a rank's own fault is not."""
    import argparse
    import shutil

    from medddpm.cli import _lost_line
    from medddpm.run.distributed import lost_contact

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(tiny_checkpoint, run_dir / "checkpoint.pt")
    a = argparse.Namespace(command="train", out=str(run_dir), argv=["train", "--out", str(run_dir), "--nproc", "2"])
    line = _lost_line(a, {1: -9})
    assert line == (f"lost rank 1 (SIGKILL); {run_dir}/checkpoint.pt holds step 1; continue with: medddpm train --out "
                    f"{run_dir} --nproc 2 --resume")
    assert "before the first checkpoint" in _lost_line(argparse.Namespace(command="train", out=str(tmp_path / "none"),
                                                                           argv=[]), {0: -9})
    assert lost_contact(RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1"))
    assert not lost_contact(RuntimeError("CUDA out of memory"))


def test_a_full_disk_during_train_is_one_line_and_the_last_checkpoint_stays(phantoms, tmp_path, capsys, monkeypatch):
    """Issue 77 items 4 and 8: a checkpoint write that fails half-way (ENOSPC) ends `train` with one line and exit 2;
    the previous checkpoint loads, and no temporary file is left."""
    import errno
    import os

    import torch

    from medddpm.train.checkpoint import load_checkpoint

    run_dir = tmp_path / "run"
    argv = ["train", "--images", str(phantoms / "images"), "--masks", str(phantoms / "masks"), "--model", "tiny",
            "--size", "16", "--out", str(run_dir), "--quiet", "--device", "cpu"]
    assert main([*argv, "--steps", "1"]) == 0
    real_save = torch.save

    def full(obj, f, *a, **k):
        real_save({"half": torch.zeros(10)}, f)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
    monkeypatch.setattr(torch, "save", full)
    capsys.readouterr()
    code, _, err = run(capsys, *argv, "--steps", "2", "--resume")
    assert_one_line_error(code, err, "No space left on device")
    assert load_checkpoint(run_dir / "checkpoint.pt")["step"] == 1
    assert not [p.name for p in run_dir.iterdir() if p.name.startswith(".")]


def test_a_reader_that_closes_the_pipe_early_gets_no_traceback():
    """Issue 77 item 8: `medddpm … | head -1`: the command stops quietly (141, as a shell reports SIGPIPE)."""
    p = subprocess.Popen([sys.executable, "-m", "medddpm", "configs", "--all"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()  # before the first line: every write meets a closed pipe
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err


def _documented_commands() -> list[tuple[str, str]]:
    """Every full `medddpm …` command in the README's and the book's ```bash blocks (continuations joined, comments
    dropped), with its file; synopsis lines (`[option]`, `...`, a shell variable standing for the options) left out."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = []
    for path in [root / "README.md", *sorted((root / "book").glob("*.md"))]:
        for block in re.findall(r"```bash\n(.*?)```", path.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                command = re.search(r"(?:^|\s)(?:-m )?medddpm (\S.*)$", line.split(" #")[0].strip())
                if command and not line.lstrip().startswith("#") and not re.search(r"\[|\.\.\.|…|\$args", line):
                    found.append((path.name, command.group(1)))
    return found


def test_every_documented_command_parses_as_written():
    """A command copied from the README or the book is accepted by medddpm's parser as it stands (a train line
    without --steps is refused at once; shell variables read as 1)."""
    import re
    import shlex

    from medddpm.cli import parser

    commands = _documented_commands()
    assert len(commands) >= 15 and any(c.startswith("train ") and "--nproc 4" in c for _, c in commands)
    for where, command in commands:
        try:
            parser().parse_args([re.sub(r"\$\w+", "1", a) for a in shlex.split(command)])
        except SystemExit:
            pytest.fail(f"{where}: `medddpm {command}` does not parse")
