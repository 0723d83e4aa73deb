"""The input pipeline (medddpm/data/pipeline.py): its memory rule, and that every pipeline — GPU or host
cache, loader workers — trains bit-identical weights, resumes across pipelines and stops cleanly on
a file that breaks in a worker."""
import dataclasses
import signal
from contextlib import contextmanager

import pytest
import torch

from medddpm.data import pipeline
from medddpm.core.config import MODEL_PRESETS, TrainConfig, run_config
from medddpm.data.nifti import pair_files
from medddpm.data.volumes import VolumeDataset
from medddpm.core.errors import InputError
from medddpm.train.checkpoint import CHECKPOINT, load_checkpoint
from medddpm.train.trainer import Trainer

CPU = torch.device("cpu")
SIZE = (16, 16, 16)
GIB = 2**30


def _trainer(phantoms, out, cache="auto", workers=0, **train):
    knobs = dataclasses.replace(run_config("baseline"), data_cache=cache, loader_workers=workers)
    ds = VolumeDataset(pair_files(phantoms / "images", phantoms / "masks"), "whole-head", 1, SIZE)
    cfg = TrainConfig(**{"save_every": 2, "ema_start_step": 1, "ema_every": 1, "lr": 1e-3, "log_every": 1,
                         "grad_accum": 2, **train})
    return Trainer(ds, MODEL_PRESETS["tiny"], cfg, knobs, CPU, out, SIZE)


def _weights(out):
    ckpt = load_checkpoint(out / CHECKPOINT)
    return ckpt, {**{f"m.{k}": v for k, v in ckpt["model"].items()}, **{f"e.{k}": v for k, v in ckpt["ema"].items()}}


@contextmanager
def _deadline(seconds):
    def fail(*_):
        raise TimeoutError(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_memory_rule():
    each = pipeline.subject_bytes(3, (128, 128, 128))
    assert each == 3 * 4 * 128**3  # 24 MiB: image + two mask channels, float32
    p = pipeline.plan("auto", 10, 3, (128,) * 3, CPU, ranks_here=1, host_bytes=4 * GIB)
    assert p.pipeline == "host" and p.cache_bytes == 10 * each and p.budget_bytes == 2 * GIB
    # each rank on the host keeps its own copy: the host budget is shared
    assert pipeline.plan("auto", 12, 3, (128,) * 3, CPU, ranks_here=8, host_bytes=4 * GIB).pipeline == "none"
    assert pipeline.plan("none", 10, 3, (128,) * 3, CPU, host_bytes=4 * GIB).pipeline == "none"
    with pytest.raises(InputError, match=r"data_cache host: 1000 subjects .* exceed 50% of the available host memory"):
        pipeline.plan("host", 1000, 3, (128,) * 3, CPU, ranks_here=1, host_bytes=4 * GIB)
    assert "fit neither cache" in pipeline.plan("auto", 1000, 3, (128,) * 3, CPU, 1, 4 * GIB).reason


@pytest.mark.parametrize("cache,workers,batch", [("none", 0, 1), ("none", 2, 1), ("none", 2, 2), ("host", 0, 2)])
def test_every_pipeline_trains_the_same_weights(phantoms, tmp_path, cache, workers, batch):
    ref = _trainer(phantoms, tmp_path / "ref", "host", batch_size=batch)
    assert ref.data.pipeline == "host" and ref._volumes is not None
    ref_losses = ref.fit(3, progress=False)
    run = _trainer(phantoms, tmp_path / "run", cache, workers, batch_size=batch)
    assert run.data.pipeline == cache
    assert run.fit(3, progress=False) == ref_losses
    (a_ckpt, a), (_, b) = _weights(tmp_path / "run"), _weights(tmp_path / "ref")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    assert a_ckpt["config"]["data"]["pipeline"] == cache
    log = (tmp_path / "run" / "log.csv").read_text().splitlines()
    assert log[0] == "step,loss,global_batch,data" and all(line.endswith(f",{cache}") for line in log[1:])


def test_resume_under_another_pipeline_is_exact(phantoms, tmp_path):
    straight = _trainer(phantoms, tmp_path / "a", "host").fit(4, progress=False)
    _trainer(phantoms, tmp_path / "b", "none", 2).fit(2, progress=False)
    again = _trainer(phantoms, tmp_path / "b", "host")
    again.resume()
    assert again.fit(4, progress=False) == straight


def test_a_file_broken_under_a_worker_stops_with_one_line(phantoms, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(phantoms, data)
    t = _trainer(data, tmp_path / "run", "none", 2, save_every=1)
    t.fit(1, progress=False)
    good = (tmp_path / "run" / CHECKPOINT).read_bytes()
    (data / "images" / "phantom_001.nii.gz").write_bytes(b"not a NIfTI file")  # broken after validation
    with _deadline(120), pytest.raises(InputError) as err:
        t.fit(6, progress=False)
    message = str(err.value)
    assert "phantom_001" in message and "\n" not in message and "Traceback" not in message
    assert (tmp_path / "run" / CHECKPOINT).read_bytes() == good or load_checkpoint(tmp_path / "run" / CHECKPOINT)
    assert not list((tmp_path / "run").glob("*.tmp")) and t._feed is None  # workers stopped


def test_the_feed_refuses_a_step_out_of_order(phantoms, tmp_path):
    t = _trainer(phantoms, tmp_path, "host")
    feed = t.feed(stop=2)
    assert len(feed.take(0)) == 2  # grad_accum 2: two micro-batches a step
    with pytest.raises(ValueError, match="at step 1, asked for step 5"):
        feed.take(5)
    t.close_feed()
