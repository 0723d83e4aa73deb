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
from medddpm.train.trainer import CHECKPOINT, load_checkpoint


def medddpm(*args, check=True):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "medddpm", *map(str, args)], capture_output=True, text=True, env=env)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def train(phantoms, out, *extra, check=True):
    return medddpm("train", "--images", phantoms / "images", "--masks", phantoms / "masks", "--model", "tiny",
                   "--size", "16", "--out", out, "--quiet", "--save-every", "2", "--ema-start", "1",
                   "--lr", "1e-3", *extra, check=check)


@pytest.fixture(scope="module")
def runs(phantoms, tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    train(phantoms, root / "two", "--steps", "3", "--grad-accum", "1", "--nproc", "2")
    train(phantoms, root / "one", "--steps", "3", "--grad-accum", "2")
    # DistributedDataParallel's buckets instead of the flat all-reduce (TF32 means nothing on a CPU)
    train(phantoms, root / "ddp", "--steps", "3", "--grad-accum", "1", "--nproc", "2", "--config", "opt1-ddp")
    return root


def _states(path):
    ckpt = load_checkpoint(path / CHECKPOINT)
    return ckpt, {**{f"model.{k}": v for k, v in ckpt["model"].items()}, **{f"ema.{k}": v for k, v in ckpt["ema"].items()}}


@pytest.mark.parametrize("run", ["two", "ddp"])
def test_two_ranks_equal_one_process_with_two_micro_batches(runs, run):
    """Flat all-reduce (the default) and DDP's buckets both average exactly what accumulation sums."""
    two, a = _states(runs / run)
    one, b = _states(runs / "one")
    assert two["config"]["world_size"] == 2 and two["config"]["global_batch"] == 2 == one["config"]["global_batch"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)  # bit-exact: the same sums in the same order
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5)
    assert two["config"]["knobs"]["grad_sync"] == ("ddp" if run == "ddp" else "flat")
    log = (runs / run / "log.csv").read_text().splitlines()
    assert log[0] == "step,loss,global_batch,data" and log[-1].endswith(",2,host") and len(log) == 4


def test_rank_zero_alone_writes(runs):
    assert sorted(p.name for p in (runs / "two").iterdir()) == ["checkpoint.pt", "log.csv", "timing.csv"]


def test_resume_with_the_same_ranks_is_exact_and_another_world_is_refused(phantoms, runs, tmp_path):
    train(phantoms, tmp_path / "r", "--steps", "2", "--grad-accum", "1", "--nproc", "2")
    train(phantoms, tmp_path / "r", "--steps", "3", "--grad-accum", "1", "--nproc", "2", "--resume")
    _, a = _states(tmp_path / "r")
    _, b = _states(runs / "two")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    p = train(phantoms, tmp_path / "r", "--steps", "4", "--grad-accum", "1", "--resume", check=False)
    assert p.returncode == 2 and "trained with 2" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_bad_input_stops_every_rank_with_one_line(phantoms, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(phantoms, data)
    (data / "masks" / "phantom_002.nii.gz").write_bytes(b"garbage")
    p = medddpm("train", "--images", data / "images", "--masks", data / "masks", "--model", "tiny", "--size", "16",
                "--steps", "1", "--out", tmp_path / "r", "--quiet", "--nproc", "2", check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "phantom_002" in lines[0], p.stderr
    assert not (tmp_path / "r" / CHECKPOINT).exists()
    p = medddpm("train", "--images", data / "images", "--masks", data / "masks", "--model", "tiny", "--steps", "1",
                "--out", tmp_path / "r", "--nproc", "0", check=False)
    assert p.returncode == 2 and "--nproc must be >= 1" in p.stderr


def test_sampling_is_sharded_and_equals_one_process(phantoms, runs, tmp_path):
    common = ["sample", "--checkpoint", runs / "one" / CHECKPOINT, "--masks", phantoms / "masks", "--sampler", "ddim",
              "--steps", "3", "--eta", "1", "--quiet"]
    medddpm(*common, "--out", tmp_path / "two", "--nproc", "2")
    medddpm(*common, "--out", tmp_path / "one", "--batch", "2")
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "two").iterdir()) and len(names) == 3
    for n in names:
        a = nib.load(str(tmp_path / "one" / n)).get_fdata()
        b = nib.load(str(tmp_path / "two" / n)).get_fdata()
        np.testing.assert_allclose(a, b, atol=1e-5)


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
    assert World(0, 2, 0).draw(3, 2, 1) == 14 and World(1, 2, 1).draw(0, 1, 0) == 1
    assert World(1, 2, 1).device("cuda") == "cuda:1" and World().device("cuda:3") == "cuda:3"
    with pytest.raises(InputError, match="use --device cuda"):
        World(1, 2, 1).device("cuda:0")
    assert draw_seed(0, 1) != draw_seed(0, 2) and draw_seed(0, 1) == draw_seed(0, 1) < 2**63
    with pytest.raises(RankError):
        raise RankError("x")


def test_exposed_communication_and_scaling_table(runs):
    import pandas as pd

    from medddpm.profiling.scaling import COLUMNS, exposed_comm, table

    k = pd.DataFrame({"name": ["conv", "ncclDevKernel_AllReduce", "gn", "ncclDevKernel_AllReduce"],
                      "start_us": [0.0, 5.0, 20.0, 30.0], "duration_us": [10.0, 10.0, 5.0, 4.0]})
    assert exposed_comm(k) == {"comm_us": 14.0, "exposed_us": 9.0}  # 5 of the first hidden by conv
    df = table([runs / "two", runs / "one"], "cpu-x2")
    assert list(df.columns) == COLUMNS and sorted(df["world_size"]) == [1, 2]
    one = df[df["world_size"] == 1].iloc[0]
    assert one["scaling_efficiency"] == 1.0 and one["volumes_per_s"] > 0
    assert df[df["world_size"] == 2]["scaling_efficiency"].isna().all()  # grad-accum differs: no 1-GPU partner


@pytest.mark.parametrize("config", ["opt12", "bf16-ndhwc"])
def test_ddp_runs_channels_last_configurations(phantoms, tmp_path, config):
    """NDHWC under DDP (gradients copied into the buckets, not views of them)."""
    train(phantoms, tmp_path / "r", "--steps", "1", "--grad-accum", "1", "--nproc", "2", "--config", config)
    ckpt = load_checkpoint(tmp_path / "r" / CHECKPOINT)
    assert ckpt["config"]["knobs"]["name"] == config and ckpt["config"]["world_size"] == 2
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())
