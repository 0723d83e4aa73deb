"""torchrun + DDP on CPU (gloo): equivalence with gradient accumulation, exact resume, sharded
sampling, and a bad input or a lost rank stopping every rank."""
import os
import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from medddpm.run.distributed import RankError, World, draw_seed, torchrun_args
from medddpm.core.errors import InputError
from medddpm.train.checkpoint import CHECKPOINT, load_checkpoint


def cpu_env():
    """The ranks' environment: one thread each, and the Triton kernels' PyTorch reference (the
    interpreter that conftest turns on for the kernel tests would take minutes here)."""
    return {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "OMP_NUM_THREADS": "1"}


def medddpm(*args, check=True):
    proc = start(*args)
    out, err = proc.communicate(timeout=600)
    p = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def train_args(phantoms, out, *extra):
    """A tiny model at 8³ (the 16³ phantoms resampled): `fast`'s bf16 3D convolutions on a CPU take about 14× longer
    at 16³, and these runs test how ranks reduce and agree, not the numerics of a size. One subject is held out and
    judged at every step by both weights, so every run also shares the held-out evaluation between its ranks."""
    return ["train", "--images", phantoms / "images", "--masks", phantoms / "masks", "--model", "tiny", "--size", "8",
            "--out", out, "--quiet", "--save-every", "2", "--ema-start", "1", "--lr", "1e-3", "--held-out", "1",
            "--eval-every", "1", "--eval-weights", "both", *extra]


def train(phantoms, out, *extra, check=True):
    return medddpm(*train_args(phantoms, out, *extra), check=check)


def start(*args):
    """``python -m medddpm ARGS`` started, not awaited (``finish``)."""
    return subprocess.Popen([sys.executable, "-m", "medddpm", *map(str, args)], env=cpu_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(procs):
    """Wait for every process of ``start``; each must succeed."""
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), [err for _, err in outs]


@pytest.fixture(scope="module")
def runs(phantoms, tmp_path_factory):
    """The runs the tests compare, started together: each is mostly a process start and a rendezvous, so
    running them at once costs about the longest of them."""
    root = tmp_path_factory.mktemp("ddp")
    finish([
        start(*train_args(phantoms, root / "two", "--steps", "3", "--grad-accum", "1", "--nproc", "2")),
        start(*train_args(phantoms, root / "one", "--steps", "3", "--grad-accum", "2")),
        # DistributedDataParallel's buckets instead of the flat all-reduce (TF32 means nothing on a CPU)
        start(*train_args(phantoms, root / "ddp", "--steps", "3", "--grad-accum", "1", "--nproc", "2", "--config", "opt1-ddp")),
        # three gradient buckets (fast-b3), each all-reduced from a hook inside the backward pass
        start(*train_args(phantoms, root / "buckets", "--steps", "3", "--grad-accum", "1", "--nproc", "2", "--config",
                          "fast-b3")),
        start(*train_args(phantoms, root / "buckets-one", "--steps", "3", "--grad-accum", "2", "--config", "fast")),
        # fast: the network whole and one flat buffer all-reduced in bf16 after the backward
        start(*train_args(phantoms, root / "rbf16", "--steps", "3", "--grad-accum", "1", "--nproc", "2", "--config", "fast")),
        # two "machines" on localhost, one rank each, meeting through torchrun's c10d rendezvous
        *two_nodes(phantoms, root / "nodes", "--steps", "3", "--grad-accum", "1"),
    ])
    return root


def two_nodes(phantoms, out, *extra):
    """The same ``train --nproc 1 --nnodes 2 --rdzv-endpoint`` command started twice, as on two machines."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = train_args(phantoms, out, *extra, "--nproc", "1", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}",
                      "--rdzv-id", f"test-{port}")
    return [start(*args) for _ in range(2)]


def _states(path):
    ckpt = load_checkpoint(path / CHECKPOINT)
    return ckpt, {**{f"model.{k}": v for k, v in ckpt["model"].items()}, **{f"ema.{k}": v for k, v in ckpt["ema"].items()}}


@pytest.mark.parametrize("run", ["two", "ddp", "buckets", "nodes"])
def test_two_ranks_equal_one_process_with_two_micro_batches(runs, run):
    """Flat all-reduce (the default), DDP's buckets, fast's gradient buckets reduced during the
    backward, and two nodes all average exactly what accumulation sums."""
    two, a = _states(runs / run)
    one, b = _states(runs / ("buckets-one" if run == "buckets" else "one"))
    assert two["config"]["world_size"] == 2 and two["config"]["global_batch"] == 2 == one["config"]["global_batch"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)  # bit-exact: the same sums in the same order
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5)
    assert two["config"]["knobs"]["grad_sync"] == ("ddp" if run == "ddp" else "flat")
    assert two["config"]["knobs"]["grad_buckets"] == (3 if run == "buckets" else 1)
    log = (runs / run / "log.csv").read_text().splitlines()
    assert log[0] == "step,loss,global_batch,data" and log[-1].endswith(",2,host") and len(log) == 4


def _moments(ckpt):
    """Adam's first moments and Muon's momenta (the default recipe's two parts), flattened into one vector."""
    opt = ckpt["optimizer"]
    parts = [opt] if "state" in opt else list(opt.values())
    return torch.cat([v.flatten() for p in parts for s in p["state"].values() for k, v in s.items()
                      if k in ("exp_avg", "momentum")])


def test_a_bf16_reduction_averages_the_rounded_gradients(runs):
    """grad_reduce "bf16" (fast's, one flat buffer): the ranks' gradients rounded to bf16 and averaged (the optimizer's first
    moments within bf16's rounding of the exact fp32 reduction's, not equal to them), the weights in fp32."""
    narrow, wide = load_checkpoint(runs / "rbf16" / CHECKPOINT), load_checkpoint(runs / "buckets" / CHECKPOINT)
    assert narrow["config"]["knobs"]["grad_reduce"] == "bf16" and wide["config"]["knobs"]["grad_reduce"] == "fp32"
    assert narrow["config"]["knobs"]["grad_buckets"] == 1 and narrow["config"]["knobs"]["name"] == "fast"
    np.testing.assert_allclose(narrow["losses"], wide["losses"], rtol=1e-3)
    a, b = _moments(narrow), _moments(wide)
    assert 0 < (a - b).norm() <= 1e-2 * b.norm()
    assert all(v.dtype == torch.float32 for v in narrow["model"].values())


def test_the_ranks_share_the_held_out_evaluation_and_find_one_processs_losses(runs):
    """Each rank evaluates its share of the (subject, t) triples and the losses are summed: the
    held-out table and best.pt of two ranks are one process's (the same weights, evaluated in
    other batches: equal to FP32 rounding)."""
    import pandas as pd

    two, one = (pd.read_csv(runs / r / "heldout.csv") for r in ("two", "one"))
    assert len(two) == len(one) == 4 * 2 * 6 and (two["loss"] > 0).all()  # steps 0-3 × model, ema × 6 t
    assert two[["step", "weights", "subject", "t"]].equals(one[["step", "weights", "subject", "t"]])
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-5)
    assert (runs / "two" / "best.pt").exists()


def test_rank_zero_alone_writes(runs):
    assert sorted(p.name for p in (runs / "two").iterdir()) == ["best.pt", "checkpoint.pt", "heldout.csv", "log.csv",
                                                                 "timing.csv"]


def test_resume_with_the_same_ranks_is_exact_and_another_world_is_refused(phantoms, runs, tmp_path, capsys):
    from medddpm.cli import main

    train(phantoms, tmp_path / "r", "--steps", "2", "--grad-accum", "1", "--nproc", "2")
    train(phantoms, tmp_path / "r", "--steps", "3", "--grad-accum", "1", "--nproc", "2", "--resume")
    _, a = _states(tmp_path / "r")
    _, b = _states(runs / "two")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    capsys.readouterr()  # one process, in this one: refused before it trains
    code = main([str(x) for x in train_args(phantoms, tmp_path / "r", "--steps", "4", "--grad-accum", "1", "--resume")])
    err = capsys.readouterr().err
    assert code == 2 and "trained with 2" in err and len(err.strip().splitlines()) == 1, err


def test_bad_input_stops_every_rank_with_one_line(phantoms, tmp_path, capsys):
    """A bad mask found by the ranks: one line, exit 2, no checkpoint. Launch options refused before
    anything starts (in this process: no rank would run)."""
    import shutil

    from medddpm.cli import main

    data = tmp_path / "data"
    shutil.copytree(phantoms, data)
    (data / "masks" / "phantom_002.nii.gz").write_bytes(b"garbage")
    p = medddpm("train", "--images", data / "images", "--masks", data / "masks", "--model", "tiny", "--size", "16",
                "--steps", "1", "--out", tmp_path / "r", "--quiet", "--nproc", "2", check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "phantom_002" in lines[0], p.stderr
    assert not (tmp_path / "r" / CHECKPOINT).exists()
    capsys.readouterr()
    for extra, says in ((["--nproc", "0"], "--nproc must be >= 1"), (["--nnodes", "2"], "give --nproc"),
                        (["--nproc", "1", "--nnodes", "2"], "go together"),
                        (["--nproc", "1", "--nnodes", "0", "--rdzv-endpoint", "h:1"], "--nnodes must be >= 1")):
        code = main(["train", "--images", str(data / "images"), "--masks", str(data / "masks"), "--model", "tiny",
                     "--steps", "1", "--out", str(tmp_path / "r"), *extra])
        err = capsys.readouterr().err
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r" / CHECKPOINT).exists()


def test_sampling_is_sharded_and_writes_the_files_of_one_process(phantoms, runs, tmp_path):
    """The same command in one process and on 2 ranks writes bit-identical files (each mask's noise from its own
    seeded generator; the same command twice: test_waiting; a batch's: test_cli)."""
    common = ["sample", "--checkpoint", runs / "one" / CHECKPOINT, "--masks", phantoms / "masks", "--sampler", "ddim",
              "--steps", "3", "--eta", "1", "--quiet"]
    medddpm(*common, "--out", tmp_path / "two", "--nproc", "2")
    medddpm(*common, "--out", tmp_path / "one")
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "two").iterdir()) and len(names) == 3
    for n in names:
        one, two = (nib.load(str(tmp_path / d / n)).get_fdata() for d in ("one", "two"))
        assert np.array_equal(one, two)


def test_each_rank_reads_its_share_and_a_bad_mask_stops_all_before_any_write(phantoms, runs, tmp_path):
    """Under --nproc each rank reads only its own masks (r, r + W, …); a bad one in rank 1's share
    stops both ranks with one line, before rank 0 has written anything."""
    import shutil

    from medddpm.sample.sampler import read_masks

    masks = tmp_path / "masks"
    shutil.copytree(phantoms / "masks", masks)
    jobs = read_masks(masks, None, "tiny", (16, 16, 16), world=World(1, 2, 1))
    assert [j.cond is not None for j in jobs] == [False, True, False] and jobs[1].cond.dtype == torch.int8
    assert set(jobs[1].cond.unique().tolist()) == {-1, 1}
    (masks / "phantom_001.nii.gz").write_bytes(b"garbage")  # rank 1's share of three
    p = medddpm("sample", "--checkpoint", runs / "one" / CHECKPOINT, "--masks", masks, "--sampler", "ddim", "--steps",
                "2", "--quiet", "--out", tmp_path / "out", "--nproc", "2", check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "phantom_001" in lines[0], p.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def _agree_worker(rank, port, mode, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    world = World.from_env()
    world.init(torch.device("cpu"), timeout_s=30)
    try:
        if mode == "agree":
            world.agree(InputError("bad mask on rank 1") if rank == 1 else None)
        elif rank == 1:  # "die": rank 1 vanishes without a word
            os._exit(0)
        else:
            world.mean(torch.ones(1))
        queue.put((rank, "no error"))
    except Exception as exc:  # noqa: BLE001 - the test reads the type and message
        queue.put((rank, f"{type(exc).__name__}: {exc}"))
    finally:
        if mode == "agree":
            world.close()


@pytest.mark.parametrize("mode", ["agree", "die"])
def test_one_rank_failing_or_dying_stops_the_others(mode):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = 29500 + os.getpid() % 1000 + (0 if mode == "agree" else 1)
    procs = [ctx.Process(target=_agree_worker, args=(r, port, mode, queue)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=120) for _ in range(2 if mode == "agree" else 1))
    for p in procs:
        p.join(timeout=60)
    if mode == "agree":
        assert got[1] == "InputError: bad mask on rank 1"
        assert got[0] == "RankError: rank 1 stopped the run: bad mask on rank 1"
    else:
        assert got[0].startswith("RankError: rank 0: lost contact with the other ranks")


def test_helpers():
    assert torchrun_args(2, ["train", "--nproc", "2", "--steps", "3"]) == [
        "--standalone", "--nproc-per-node=2", "-m", "medddpm", "train", "--steps", "3"]
    assert torchrun_args(4, ["train", "--nproc=4", "--nnodes", "2", "--rdzv-endpoint", "h:29400", "--steps", "3"],
                         2, "h:29400", "job") == [
        "--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=h:29400", "--rdzv-id=job", "--nproc-per-node=4",
        "-m", "medddpm", "train", "--steps", "3"]
    assert World(0, 2, 0).draw(3, 2, 1) == 14 and World(1, 2, 1).draw(0, 1, 0) == 1
    assert World(1, 2, 1).device("cuda") == "cuda:1" and World().device("cuda:3") == "cuda:3"
    with pytest.raises(InputError, match="use --device cuda"):
        World(1, 2, 1).device("cuda:0")
    assert draw_seed(0, 1) != draw_seed(0, 2) and draw_seed(0, 1) == draw_seed(0, 1) < 2**63
    with pytest.raises(RankError):
        raise RankError("x")


@pytest.mark.parametrize("visible, local, sees", [(None, 2, "2"), ("4,5,6", 1, "5"), ("0", 1, "0")])
def test_a_sampling_rank_sees_only_its_own_gpu(monkeypatch, visible, local, sees):
    """own_gpu_only: under torchrun a rank keeps only its LOCAL_RANK's GPU of the launcher's visible
    ones (all, without the variable), and runs on cuda:0 once CUDA counts that one GPU; outside
    torchrun, with fewer GPUs than ranks, or where CUDA still counts several, nothing changes."""
    from medddpm.run import distributed

    monkeypatch.delenv(distributed.OWN_GPU, raising=False)
    for key, value in {"WORLD_SIZE": "3", "RANK": str(local), "LOCAL_RANK": str(local), "CUDA_VISIBLE_DEVICES": visible}.items():
        monkeypatch.delenv(key, raising=False) if value is None else monkeypatch.setenv(key, value)
    distributed.own_gpu_only()
    world = World.from_env()
    if visible == "0":  # one GPU for two ranks: left for the launcher's check to refuse
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0" and not world.own_gpu
        return
    assert os.environ["CUDA_VISIBLE_DEVICES"] == sees and world.own_gpu
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert world.device("cuda") == "cuda:0" and world.device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)  # CUDA had started before: the variable came too late
    assert world.device("cuda") == f"cuda:{local}"
    distributed.own_gpu_only()  # once only: a second call keeps the rank's GPU
    assert os.environ["CUDA_VISIBLE_DEVICES"] == sees
    monkeypatch.setenv("WORLD_SIZE", "x")  # a bad torchrun environment: left for World.from_env to refuse
    monkeypatch.delenv(distributed.OWN_GPU)
    distributed.own_gpu_only()
    assert distributed.OWN_GPU not in os.environ
    monkeypatch.setenv(distributed.OWN_GPU, "1")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv(distributed.OWN_GPU)
    assert not World.from_env().own_gpu


def test_exposed_communication_and_scaling_table(runs):
    import pandas as pd

    from medddpm.profiling.scaling import COLUMNS, busy_us, exposed_comm, kernel_sums, table

    k = pd.DataFrame({"name": ["conv", "ncclDevKernel_AllReduce", "gn", "ncclDevKernel_AllReduce"],
                      "start_us": [0.0, 5.0, 20.0, 30.0], "duration_us": [10.0, 10.0, 5.0, 4.0]})
    assert exposed_comm(k) == {"comm_us": 14.0, "exposed_us": 9.0}  # 5 of the first hidden by conv
    assert busy_us(k) == 24.0  # 0–15 (conv and the first all-reduce overlap), 20–25, 30–34: 10 idle of 34
    sums = kernel_sums(k, steps=2)
    assert sums["name"].tolist() == ["ncclDevKernel_AllReduce", "conv", "gn"]
    assert sums["launches_per_step"].tolist() == [1.0, 0.5, 0.5] and sums["us_per_step"].tolist() == [7.0, 5.0, 2.5]
    df = table([runs / "two", runs / "one"], "cpu-x2")
    assert list(df.columns) == COLUMNS and sorted(df["world_size"]) == [1, 2]
    one = df[df["world_size"] == 1].iloc[0]
    assert one["scaling_efficiency"] == 1.0 and one["volumes_per_s"] > 0
    assert df[df["world_size"] == 2]["scaling_efficiency"].isna().all()  # grad-accum differs: no 1-GPU partner


def test_scaling_rows_from_a_measurement_log(tmp_path):
    from medddpm.profiling.scaling import COLUMNS, table_from_log

    log = tmp_path / "log.txt"
    log.write_text("steady state: 50.0 ms/step (median of 9 read-back intervals after the first; x)\n"
                   "  [rc=0, 9 s] python3 -m medddpm train --config fast --size 128 --grad-accum 1 --nproc 1 --out a\n"
                   "steady state: 99.0 ms/step (median of 9 read-back intervals after the first; y)\n"
                   "  [rc=124, 9 s] python3 -m medddpm train --config fast --size 128 --grad-accum 1 --nproc 4 --out b\n"
                   "steady state: 52.0 ms/step (median of 9 read-back intervals after the first; z)\n"
                   "  [rc=0, 9 s] python3 -m medddpm train --config fast --size 128 --grad-accum 1 --nproc 2 --out c\n")
    df = table_from_log(log, "g-x4", {"torch": "t", "cuda": "c", "nccl": ""})
    assert list(df.columns) == COLUMNS and list(df["world_size"]) == [1, 2]  # the failed run gives no row
    assert list(df["step_ms_median"]) == [50.0, 52.0] and df["scaling_efficiency"].iloc[1] == round(50 / 52, 4)
    assert df["volumes_per_s"].iloc[1] == round(2 / 0.052, 3) and set(df["size"]) == {"128x128x128"}


def test_a_rank_variant_scales_against_its_one_gpu_twin():
    """fast-rbf16 on one GPU is fast (how ranks reduce means nothing there): its efficiency is fast's
    one-GPU time over its own; a configuration that also changes what one GPU runs has no twin."""
    from medddpm.profiling.scaling import _with_efficiency, one_gpu_twin

    assert [one_gpu_twin(c) for c in ("fast-rbf16", "fast-flat", "fast-b3", "opt1-ddp", "fast", "fast-skipgrad",
                                      "mine")] == ["fast", "fast", "fast", "opt1", "fast", "fast-skipgrad", "mine"]
    row = dict(gpu="g", size="128x128x128", micro_batch=1, grad_accum=1)
    df = _with_efficiency([{**row, "world_size": 1, "config": "fast", "step_ms_median": 50.0},
                           {**row, "world_size": 2, "config": "fast-rbf16", "step_ms_median": 51.0},
                           {**row, "world_size": 2, "config": "fast-skipgrad", "step_ms_median": 51.0}])
    eff = dict(zip(df["config"], df["scaling_efficiency"]))
    assert eff["fast-rbf16"] == round(50 / 51, 4) and eff["fast"] == 1.0 and np.isnan(eff["fast-skipgrad"])


@pytest.mark.parametrize("config", ["bf16-ndhwc"])
def test_ddp_runs_channels_last_configurations(phantoms, tmp_path, config):
    """NDHWC under DDP (gradients copied into the buckets, not views of them); opt12 takes the same path in FP32."""
    train(phantoms, tmp_path / "r", "--steps", "1", "--grad-accum", "1", "--nproc", "2", "--config", config)
    ckpt = load_checkpoint(tmp_path / "r" / CHECKPOINT)
    assert ckpt["config"]["knobs"]["name"] == config and ckpt["config"]["world_size"] == 2
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("config", ["fast", "fast-b3", "fast-rbf16"])
def test_fast_on_two_gpus_equals_one_gpu_with_two_micro_batches(tmp_path, config):
    """fast on 2 ranks (one flat bf16 all-reduce after the backward; fast-b3 and fast-rbf16: three buckets
    all-reduced inside the backward, in fp32 or bf16; all captured in the step's CUDA graph) trains what one
    GPU trains with two micro-batches, within bf16's tolerance, over the eager warm-up steps, the capture and the replays; without the all-reduce the
    optimizer's first moments would differ by the other rank's gradient."""
    from medddpm.data.nifti import write_phantoms
    from medddpm.run.engine import GRAPH_WARMUP

    write_phantoms(tmp_path / "data", n=3, size=32, seed=2)
    steps = GRAPH_WARMUP + 5
    common = ["train", "--images", tmp_path / "data" / "images", "--masks", tmp_path / "data" / "masks", "--model",
              "tiny", "--size", "32", "--quiet", "--ema-start", "1", "--lr", "1e-3", "--steps", steps, "--log-every",
              "1", "--config", config, "--device", "cuda"]
    env = {**os.environ, **{"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}}
    for out, extra in (("two", ["--nproc", "2", "--grad-accum", "1"]), ("one", ["--grad-accum", "2"])):
        p = subprocess.run([sys.executable, "-m", "medddpm", *map(str, common), "--out", str(tmp_path / out), *extra],
                           capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr
    two, one = load_checkpoint(tmp_path / "two" / CHECKPOINT), load_checkpoint(tmp_path / "one" / CHECKPOINT)
    assert two["config"]["world_size"] == 2 and two["step"] == one["step"] == steps
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=2e-2)
    moments = [_moments(c).float() for c in (two, one)]
    assert (moments[0] - moments[1]).norm() <= 0.05 * moments[1].norm()
    assert all(torch.isfinite(v).all() for v in two["model"].values())


def test_scaling_line_quotes_fast_on_the_machine_of_the_most_gpus():
    """Today's fast on 1 → N GPUs from the machine that ran it on the most GPUs; no such rows: no line."""
    import pandas as pd

    from medddpm.report.fast_tables import scaling_line

    assert scaling_line(pd.DataFrame()) is None
    now = pd.DataFrame({"machine": "m", "config": "fast", "grad_accum": 1, "world_size": [1, 2, 4],
                        "step_ms_median": [50.0, 51.0, 51.4], "scaling_efficiency": [1.0, 50 / 51, 50 / 51.4]})
    two = now.iloc[:2].assign(machine="a-two", step_ms_median=[50.0, 53.0], scaling_efficiency=[1.0, 50 / 53])
    assert scaling_line(pd.concat([two, now])) == "50.0 → 51.0 / 51.4 ms/step on 1 → 2 / 4 GPUs (98.0 % / 97.3 %, m)"
    assert scaling_line(now.iloc[:1]) is None  # one GPU alone is no scaling
