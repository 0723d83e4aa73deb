import math

import pytest
import torch

from medddpm.config import MODEL_PRESETS, TrainConfig, run_config
from medddpm.data import VolumeDataset, pair_files
from medddpm.errors import DivergedError, InputError
from medddpm.train import CHECKPOINT, Trainer, load_checkpoint, sample_order

CPU = torch.device("cpu")


def _trainer(phantoms, out, **train):
    ds = VolumeDataset(pair_files(phantoms / "images", phantoms / "masks"), "whole-head", 1, (16, 16, 16))
    cfg = TrainConfig(**{"save_every": 2, "ema_start_step": 2, "ema_every": 1, "lr": 1e-3, **train})
    return Trainer(ds, MODEL_PRESETS["tiny"], cfg, run_config("baseline"), CPU, out, (16, 16, 16))


def test_resume_continues_the_exact_loss_sequence(phantoms, tmp_path):
    straight = _trainer(phantoms, tmp_path / "a").fit(4, progress=False)
    first = _trainer(phantoms, tmp_path / "b")
    first.fit(2, progress=False)
    second = _trainer(phantoms, tmp_path / "b")
    second.resume()
    assert second.step == 2
    resumed = second.fit(4, progress=False)
    assert resumed == straight  # bit-identical on CPU
    a = load_checkpoint(tmp_path / "a" / CHECKPOINT)
    b = load_checkpoint(tmp_path / "b" / CHECKPOINT)
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=0)
        torch.testing.assert_close(a["ema"][k], b["ema"][k], rtol=0, atol=0)
    log = (tmp_path / "b" / "log.csv").read_text().splitlines()
    assert log[0] == "step,loss,global_batch,data" and len(log) == 5 and log[1].endswith(",2,host")


def test_checkpoint_holds_everything_needed(phantoms, tmp_path):
    t = _trainer(phantoms, tmp_path)
    t.fit(1, progress=False)
    ckpt = load_checkpoint(tmp_path / CHECKPOINT)
    assert {"step", "model", "ema", "optimizer", "config", "rng"} <= set(ckpt)
    assert ckpt["config"]["model"]["name"] == "tiny" and ckpt["config"]["knobs"]["tf32"] is False
    assert ckpt["config"]["train"]["grad_accum"] == 2 and ckpt["config"]["size"] == [16, 16, 16]
    assert not list(tmp_path.glob("*.tmp"))


def test_ema_follows_reference_rules(phantoms, tmp_path):
    t = _trainer(phantoms, tmp_path, ema_start_step=3, ema_every=1, ema_decay=0.5)
    t.fit(2, progress=False)  # before the start step the EMA is a copy of the model
    for e, p in zip(t.ema.parameters(), t.model.parameters()):
        torch.testing.assert_close(e, p)
    before = [p.detach().clone() for p in t.ema.parameters()]
    t.fit(3, progress=False)
    for b, e, p in zip(before, t.ema.parameters(), t.model.parameters()):
        torch.testing.assert_close(e, 0.5 * b + 0.5 * p)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(phantoms, tmp_path):
    t = _trainer(phantoms, tmp_path)
    t.fit(2, progress=False)
    good = (tmp_path / CHECKPOINT).read_bytes()
    with torch.no_grad():
        next(t.model.parameters()).fill_(float("nan"))
    with pytest.raises(DivergedError, match="loss became nan at step 3"):
        t.fit(6, progress=False)
    assert (tmp_path / CHECKPOINT).read_bytes() == good


def test_resume_refuses_another_configuration(phantoms, tmp_path):
    _trainer(phantoms, tmp_path).fit(1, progress=False)
    other = _trainer(phantoms, tmp_path, lr=5e-4)
    with pytest.raises(InputError, match="train config"):
        other.resume()


def test_data_order_is_a_permutation_per_epoch():
    order = [sample_order(5, 0, i) for i in range(10)]
    assert sorted(order[:5]) == list(range(5)) and sorted(order[5:]) == list(range(5))
    assert order == [sample_order(5, 0, i) for i in range(10)]


def test_grad_accum_validation():
    with pytest.raises(ValueError, match="grad_accum"):
        TrainConfig(grad_accum=0)
    assert math.isclose(TrainConfig().ema_decay, 0.995)
