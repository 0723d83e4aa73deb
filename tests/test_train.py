import math

import numpy as np
import pytest
import torch

from medddpm.core.config import MODEL_PRESETS, TrainConfig, run_config
from medddpm.data.nifti import pair_files
from medddpm.data.volumes import VolumeDataset
from medddpm.core.errors import DivergedError, InputError
from medddpm.train.checkpoint import CHECKPOINT, load_checkpoint
from medddpm.train.trainer import Trainer, sample_order

CPU = torch.device("cpu")



def _judged(heldout) -> str:
    """A heldout.csv without its wall-clock column (``seconds``, the training clock: never the same twice), whose
    clock runs forward from zero."""
    import pandas as pd

    h = pd.read_csv(heldout)
    assert (h["seconds"] >= 0).all() and h["seconds"].is_monotonic_increasing
    return h.drop(columns="seconds").to_csv(index=False)

def _trainer(phantoms, out, **train):
    pairs = pair_files(phantoms / "images", phantoms / "masks")
    held = train.get("held_out", 0)
    ds = VolumeDataset(pairs[:len(pairs) - held], "whole-head", 1, (16, 16, 16))
    cfg = TrainConfig(**{"save_every": 2, "ema_start_step": 2, "ema_every": 1, "lr": 1e-3, **train})
    return Trainer(ds, MODEL_PRESETS["tiny"], cfg, run_config("baseline"), CPU, out, (16, 16, 16),
                   held_out=tuple(pairs[len(pairs) - held:]))


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


def test_non_finite_weights_are_never_checkpointed(phantoms, tmp_path):
    """Issue 77 item 3: weights made non-finite by a step whose loss was still finite (an infinite gradient) stop the
    save with one error; the last good checkpoint stays, best.pt too."""
    t = _trainer(phantoms, tmp_path)
    t.fit(2, progress=False)
    good = (tmp_path / CHECKPOINT).read_bytes()
    with torch.no_grad():
        next(t.ema.parameters()).view(-1)[0] = float("inf")
    with pytest.raises(DivergedError, match="non-finite by step 2"):
        t.save()
    assert (tmp_path / CHECKPOINT).read_bytes() == good and sorted(p.name for p in tmp_path.iterdir()
                                                                   if p.name.startswith("."))  == []


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


def test_held_out_loss_is_evaluated_kept_and_resumed_exactly(phantoms, tmp_path):
    """Every eval_every steps, at step 0 and at the last step: both weights (eval_weights "both"),
    every (subject, t); the rows live in the checkpoint, so a resumed run writes the same
    heldout.csv; best.pt is the checkpoint of the EMA's lowest held-out loss."""
    import pandas as pd

    from medddpm.train.parity import HELDOUT_TIMESTEPS
    from medddpm.train.checkpoint import BEST
    from medddpm.train.trainer import HELDOUT

    straight = _trainer(phantoms, tmp_path / "a", held_out=1, eval_every=2, eval_weights="both")
    straight.fit(5, progress=False)
    h = pd.read_csv(tmp_path / "a" / HELDOUT)
    assert sorted(h["step"].unique()) == [0, 2, 4, 5] and set(h["weights"]) == {"model", "ema"}
    assert len(h) == 4 * 2 * len(HELDOUT_TIMESTEPS) and h["subject"].nunique() == 1
    ema = h[h["weights"] == "ema"].groupby("step")["loss"].mean()
    assert load_checkpoint(tmp_path / "a" / BEST)["step"] == ema.idxmin()
    first = _trainer(phantoms, tmp_path / "b", held_out=1, eval_every=2, eval_weights="both")
    first.fit(4, progress=False)  # stops at an evaluation: the resumed run does not evaluate step 4 again
    second = _trainer(phantoms, tmp_path / "b", held_out=1, eval_every=2, eval_weights="both")
    second.resume()
    second.fit(5, progress=False)
    assert _judged(tmp_path / "b" / HELDOUT) == _judged(tmp_path / "a" / HELDOUT)
    with pytest.raises(ValueError, match="held_out is 1 but 0 held-out pairs"):
        Trainer(straight.dataset, MODEL_PRESETS["tiny"], TrainConfig(held_out=1), run_config("baseline"), CPU,
                tmp_path / "c", (16, 16, 16))


def test_held_out_evaluates_the_ema_alone_by_default_and_a_shared_step_is_written_once(phantoms, tmp_path):
    """The default evaluates the weights sampled (the EMA's), the raw model's the same as with
    "both"; where best.pt and checkpoint.pt fall on one step the second is a link to the first,
    and a checkpoint of another step is a file of its own."""
    import os

    import pandas as pd

    from medddpm.train.checkpoint import BEST
    from medddpm.train.trainer import HELDOUT

    both = _trainer(phantoms, tmp_path / "a", held_out=1, eval_every=2, eval_weights="both")
    both.fit(4, progress=False)
    ema = _trainer(phantoms, tmp_path / "b", held_out=1, eval_every=2)
    ema.fit(4, progress=False)
    a, b = (pd.read_csv(tmp_path / run / HELDOUT).drop(columns="seconds") for run in "ab")  # seconds: a clock
    assert set(b["weights"]) == {"ema"}
    assert b.reset_index(drop=True).equals(a[a["weights"] == "ema"].reset_index(drop=True))
    best, last = tmp_path / "b" / BEST, tmp_path / "b" / CHECKPOINT
    assert load_checkpoint(best)["step"] == load_checkpoint(last)["step"] == 4 and os.path.samefile(best, last)
    ema.train_step()
    ema.save()  # step 5: no evaluation
    assert load_checkpoint(last)["step"] == 5 and load_checkpoint(best)["step"] == 4
    assert not os.path.samefile(best, last)
    with pytest.raises(ValueError, match="eval_weights must be one of ema, both"):
        TrainConfig(eval_weights="model")


def test_the_kept_evaluator_judges_each_evaluation_as_a_fresh_one_would(phantoms, tmp_path):
    """The trainer builds its FP32 evaluator once and copies each evaluation's weights into it: the
    losses of later evaluations, of either weights, are those of an evaluator built for them alone."""
    import pandas as pd

    from medddpm.train.heldout import cpu_state, held_out_loss

    t = _trainer(phantoms, tmp_path / "a", held_out=1, eval_every=2, eval_weights="both")
    t.fit(4, progress=False)
    kept = pd.DataFrame(t.heldout).query("step == 4")
    for weights, module in (("model", t.model), ("ema", t.ema)):
        fresh = held_out_loss(t.model_cfg, cpu_state(module), t._triples, CPU)
        assert np.array_equal(kept[kept["weights"] == weights]["loss"].to_numpy(), fresh["loss"].to_numpy())


def test_time_limit_stops_checkpointed_and_resume_finishes_the_same_run(phantoms, tmp_path):
    straight = _trainer(phantoms, tmp_path / "a", log_every=1).fit(4, progress=False)
    t = _trainer(phantoms, tmp_path / "b", log_every=1)
    t.fit(4, progress=False, time_limit_s=1e-9)
    assert t.stopped_early and t.step == 1 and load_checkpoint(tmp_path / "b" / CHECKPOINT)["step"] == 1
    rest = _trainer(phantoms, tmp_path / "b", log_every=1)
    rest.resume()
    assert rest.fit(4, progress=False) == straight and not rest.stopped_early
    with pytest.raises(InputError, match="--time-limit must be > 0"):
        rest.fit(6, progress=False, time_limit_s=0)


def test_a_resume_mismatch_names_what_differs_in_one_line():
    from medddpm.train.trainer import _difference

    assert _difference("train", {"lr": 1e-5, "seed": 0}, {"lr": 1e-4, "seed": 0}) == \
        "its train config differs (lr 1e-05 → 0.0001)"
    assert _difference("knobs", {"name": "fast", "tf32": True}, {"name": "opt1", "tf32": True}).startswith(
        "it was trained with --config fast, not opt1; resume with --config fast")
    assert _difference("size", [16, 16, 16], [32, 32, 32]) == "its size [16, 16, 16] differs from [32, 32, 32]"


def test_fit_says_where_its_seconds_went(phantoms, tmp_path):
    """Issue 64: the first step (read back at once), the held-out evaluations, the checkpoints and
    the steady steps, each with its count, add up to the fit's wall time; `train` prints them."""
    import re
    import time

    from medddpm.train.timing import timing_line

    t = _trainer(phantoms, tmp_path / "a", held_out=1, eval_every=2, save_every=3, log_every=1)
    t0 = time.perf_counter()
    t.fit(5, progress=False)
    wall = time.perf_counter() - t0
    p = t.phases
    assert (p["first step n"], p["steady steps n"], p["held-out n"], p["checkpoints n"]) == (1, 4, 4, 2)
    spent = p["first step"] + p["steady steps"] + p["held-out"] + p["checkpoints"]
    assert 0 < spent <= wall and spent > 0.9 * wall
    line = timing_line(p, 1.5, 100.0)
    assert re.fullmatch(r"timing: ready 1\.5 s, first step [0-9.]+ s, steady steps [0-9.]+ s \(4 at [0-9.]+ ms\), "
                        r"held-out [0-9.]+ s \(4\), checkpoints [0-9.]+ s \(2\), \d+\.\d % of --time-limit in steady steps",
                        line), line


def test_a_curriculums_steady_state_times_each_phase_apart():
    """A curriculum's steps on patches cost a fraction of a whole volume's: `train`'s steady-state line gives each
    phase's median apart (the first interval of each, a compilation, left out), where one median over both would
    report whichever phase had more intervals; a run without patches keeps the one median."""
    from pathlib import Path

    import pandas as pd

    from medddpm.core.config import TrainConfig
    from medddpm.train.timing import steady_line

    edges = [0, 1, 250, 500, 750, 1000, 1001, 1250, 1500]
    ms = [9000.0, 15.0, 15.0, 15.0, 15.0, 8000.0, 54.0, 54.0]  # patches to step 1,000, whole volumes after
    timing = pd.DataFrame({"step_from": edges[:-1], "step_to": edges[1:], "ms_per_step": ms})
    line = steady_line(timing, TrainConfig(patch_size=32, patch_steps=1000), Path("timing.csv"))
    assert line.startswith("steady state: 54.0 ms/step on whole volumes, 15.0 ms/step on 32³ patches"), line
    assert steady_line(timing, TrainConfig(), Path("timing.csv")).startswith("steady state: 15.0 ms/step (median of 7")
    early = timing[timing["step_to"] <= 750]  # stopped before whole volumes: the patches' median alone
    assert steady_line(early, TrainConfig(patch_size=32, patch_steps=1000), Path("t")).startswith("steady state: 15.0 ms/step (")
    assert steady_line(timing.iloc[:1], TrainConfig(), Path("t")) == ""


def test_a_stopped_run_judges_its_last_weights_and_resumes_exactly(phantoms, tmp_path):
    """Issue 77 item 7: a run stopped by --time-limit or by a signal (SIGTERM from a scheduler) evaluates its last
    weights before it picks best.pt and checkpoints them; the resumed run does not judge that step again and ends
    with the weights and the judged losses of an uninterrupted run."""
    import pandas as pd

    from medddpm.train.checkpoint import BEST
    from medddpm.train.trainer import HELDOUT

    straight = _trainer(phantoms, tmp_path / "a", held_out=1, eval_every=2, log_every=1)
    straight.fit(4, progress=False)
    for how, run in (("time", "b"), ("signal", "c")):
        t = _trainer(phantoms, tmp_path / run, held_out=1, eval_every=2, log_every=1)
        if how == "signal":
            t.signal = "SIGTERM"  # as the handler sets it: one process stops after the step under way
        t.fit(4, progress=False, time_limit_s=1e-9 if how == "time" else None)
        assert t.stopped_early and t.step == 1 and {r["step"] for r in t.heldout} == {0, 1}  # step 1: the last weights
        assert t.phases["held-out n"] == 2 and load_checkpoint(tmp_path / run / CHECKPOINT)["step"] == 1
        ema = pd.DataFrame(t.heldout).query("weights == 'ema'").groupby("step")["loss"].mean()
        assert load_checkpoint(tmp_path / run / BEST)["step"] == ema.idxmin()
        rest = _trainer(phantoms, tmp_path / run, held_out=1, eval_every=2, log_every=1)
        rest.resume()
        rest.fit(4, progress=False)
        h, a = (pd.read_csv(p / HELDOUT).drop(columns="seconds") for p in (tmp_path / run, tmp_path / "a"))
        assert sorted(h["step"].unique()) == [0, 1, 2, 4]
        assert h[h["step"] != 1].reset_index(drop=True).equals(a)
        for k, v in straight.model.state_dict().items():
            assert torch.equal(rest.model.state_dict()[k], v), k


def test_a_time_limit_ends_the_rates_decay_where_the_time_runs_out(phantoms, tmp_path):
    """Issue 75: under --time-limit the cosine decay ends at the step the time allows, at the pace since the first
    step (its evaluations included); the end only comes nearer, so the rate never rises again."""
    import time

    t = _trainer(phantoms, tmp_path, lr_decay="cosine")
    t._steps, t.step = 10_000, 101
    t._clock = [(0, 0.0), (1, 10.0), (101, 11.0)]  # the first step compiled for 10 s; then 100 steps a second
    assert not t._out_of_time(time.perf_counter() + 5.0, 10_000)
    assert 590 <= t._steps <= 601  # 101 + 5 s × 100 steps/s
    assert not t._out_of_time(time.perf_counter() + 50.0, 10_000) and t._steps <= 601  # a later end: kept
    assert t._out_of_time(time.perf_counter() - 1.0, 10_000) and t._steps == 102  # out of time: the next step is the last
    assert t.train_cfg.lr_at(101, t._steps) == pytest.approx(t.train_cfg.lr * t.train_cfg.lr_final)


def test_resume_may_change_the_cadences_and_stays_exact(phantoms, tmp_path, capsys):
    """Issue 77 item 2: --log-every, --save-every, --eval-every and --eval-weights may change on --resume (the run says
    what changed); the weights equal an uninterrupted run's bit for bit. The rate may not."""
    straight = _trainer(phantoms, tmp_path / "a", log_every=1, save_every=2)
    straight.fit(4, progress=False)
    first = _trainer(phantoms, tmp_path / "b", log_every=1, save_every=2)
    first.fit(2, progress=False)
    capsys.readouterr()
    rest = _trainer(phantoms, tmp_path / "b", log_every=3, save_every=5, eval_every=7)
    rest.resume()
    assert "resuming with log_every 1 → 3, save_every 2 → 5, eval_every 1000 → 7" in capsys.readouterr().err
    rest.fit(4, progress=False)
    assert rest.losses == straight.losses
    for k, v in straight.model.state_dict().items():
        assert torch.equal(rest.model.state_dict()[k], v), k
    with pytest.raises(InputError, match=r"lr 0.001 → 0.002"):
        _trainer(phantoms, tmp_path / "b", lr=2e-3).resume()


def test_the_ema_copies_before_its_start_keep_no_autograd_history(phantoms, tmp_path):
    """Before ema_start_step the EMA is reset to the model every ema_every steps; that copy must not record autograd
    history: the EMA's tensors would then require grad and keep the parameters' autograd nodes alive on the stream of
    the copy, which breaks a later CUDA-graph capture (a curriculum's whole volumes: cudaErrorStreamCaptureImplicit on
    4 × H200, torch 2.11)."""
    t = _trainer(phantoms, tmp_path, ema_start_step=100, grad_accum=1)
    t.fit(3, progress=False)
    assert all(p.grad_fn is None and not p.requires_grad for p in t.ema.parameters())
    for a, b in zip(t.ema.parameters(), t.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # still a copy of the model
