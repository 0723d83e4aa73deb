"""The one place that applies a configuration: every knob, its CPU fallback, the ladder."""
import dataclasses

import pytest
import torch

from medddpm.config import CONFIGS, LADDER, PAPER_CONFIGS, Knobs, TrainConfig, run_config
from medddpm.data import VolumeDataset, pair_files
from medddpm.engine import Engine, effective_knobs, make_optimizer
from medddpm.train import CHECKPOINT, Trainer, load_checkpoint
from medddpm.workload import Workload

CPU = torch.device("cpu")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_configuration_trains_on_cpu(tiny, name):
    work = Workload(tiny, run_config(name), (16, 16, 16), CPU)
    before = [p.detach().clone() for p in work.engine.model.parameters()]
    loss, marks = work.step(lambda: 0.0)
    assert torch.isfinite(loss) and len(marks) == 3
    assert any(not torch.equal(b, p) for b, p in zip(before, work.engine.model.parameters()))
    settings = work.settings()
    assert settings["name"] == name and settings["compile"] is False and settings["cuda_graphs"] is False


def test_cpu_fallbacks_are_recorded():
    fast = run_config("fast")
    cpu = effective_knobs(fast, CPU)
    assert (cpu.compile, cpu.cuda_graphs, cpu.fused_adam, cpu.data_cache) == (False, False, False, "auto")
    assert effective_knobs(dataclasses.replace(fast, data_cache="device"), CPU).data_cache == "host"
    assert (cpu.precision, cpu.channels_last, cpu.fused_ops, cpu.sdpa) == ("bf16", True, True, True)
    assert effective_knobs(fast, torch.device("cuda")) == fast
    # several ranks: flat gradients keep the step's CUDA graph, DDP's eager buckets do not
    assert effective_knobs(fast, torch.device("cuda"), world_size=2).cuda_graphs is True
    ddp = dataclasses.replace(fast, grad_sync="ddp")
    assert effective_knobs(ddp, torch.device("cuda"), world_size=2).cuda_graphs is False


def test_ladder_adds_one_thing_per_rung():
    assert LADDER[:2] == ("baseline", "opt1") and LADDER[-1] == "fast" and set(LADDER) <= set(CONFIGS)
    for lower, upper in zip(LADDER, LADDER[1:]):
        a, b = dataclasses.asdict(CONFIGS[lower]), dataclasses.asdict(CONFIGS[upper])
        changed = {k for k in a if a[k] != b[k]} - {"name"}
        assert changed, f"{upper} changes nothing over {lower}"
    assert list(PAPER_CONFIGS) == ["baseline", "opt1", "opt2", "opt12", "pytorch-default"]


def test_autotuned_configurations_change_only_their_tuning_knob():
    from medddpm.config import AUTOTUNED

    expect = {"bf16-compile-max-autotune": ("bf16-compile-tuned", "compile_mode"),
              "fast-max-autotune": ("fast", "compile_mode"), "fast-cudnn-all": ("fast", "cudnn_benchmark_limit")}
    assert [k.name for k in AUTOTUNED] == list(expect)
    for knobs in AUTOTUNED:
        base, knob = expect[knobs.name]
        a, b = dataclasses.asdict(knobs), dataclasses.asdict(CONFIGS[base])
        assert {k for k in a if a[k] != b[k]} == {"name", knob} and run_config(knobs.name) == knobs
    assert CONFIGS["fast-cudnn-all"].cudnn_benchmark_limit == 0
    # fast captures the whole step itself, so its autotuned twin must not capture graphs in Inductor too
    assert CONFIGS["fast-max-autotune"].compile_mode == "max-autotune-no-cudagraphs"


@pytest.mark.parametrize("changes,needle", [
    ({"compile_mode": "fastest"}, "compile_mode"),
    ({"data_cache": "ram"}, "data_cache"),
    ({"loader_workers": -1}, "loader_workers"),
    ({"grad_sync": "ring"}, "grad_sync"),
    ({"cuda_graphs": True, "checkpoint_attention": False, "compile": True, "compile_mode": "reduce-overhead"},
     "captures graphs too"),
    ({"cuda_graphs": True}, "checkpoint_attention"),
    ({"cudnn_benchmark_limit": -1}, "cudnn_benchmark_limit"),
    ({"cudnn_benchmark_limit": 2.5}, "cudnn_benchmark_limit"),
])
def test_knobs_are_validated_early(changes, needle):
    with pytest.raises(ValueError, match=needle):
        Knobs(**changes)


def test_optimizer_choice_follows_knobs(tiny):
    params = [torch.nn.Parameter(torch.zeros(3))]
    assert make_optimizer(params, 1e-3, run_config("fast"), CPU).defaults["fused"] is None
    assert make_optimizer(params, 1e-3, run_config("baseline"), CPU).defaults["capturable"] is False


def test_a_step_returns_the_mean_loss_of_its_micro_batches(tiny):
    """Paper §3.2 accumulation: one optimizer step over two micro-batches, loss = their mean."""
    engine = Engine(tiny, run_config("baseline"), CPU)
    x = torch.rand(2, 1, 1, 16, 16, 16) * 2 - 1
    m = -torch.ones(2, 1, 2, 16, 16, 16)
    torch.manual_seed(3)
    with torch.no_grad():
        expected = (engine.diffusion.loss(x[0], m[0]) + engine.diffusion.loss(x[1], m[1])) / 2
    torch.manual_seed(3)
    loss, _ = engine.train_step([x[0], x[1]], [m[0], m[1]])
    torch.testing.assert_close(loss, expected)
    assert all(p.grad is None for p in engine.model.parameters())  # zeroed (set to None) after the step
    with pytest.raises(ValueError, match="as many masks"):
        engine.train_step([x[0]], [])


def _trainer(phantoms, out, config, **train):
    ds = VolumeDataset(pair_files(phantoms / "images", phantoms / "masks"), "whole-head", 1, (16, 16, 16))
    cfg = TrainConfig(**{"save_every": 3, "ema_start_step": 1, "ema_every": 1, "lr": 1e-3, "log_every": 2, **train})
    return Trainer(ds, dataset_model(), cfg, run_config(config), CPU, out, (16, 16, 16))


def dataset_model():
    from medddpm.config import MODEL_PRESETS

    return MODEL_PRESETS["tiny"]


def test_fast_checkpoint_resumes_and_loads_under_other_configs(phantoms, tmp_path):
    t = _trainer(phantoms, tmp_path, "fast")
    losses = t.fit(3, progress=False)
    assert len(losses) == 3 and all(l == l for l in losses)
    ckpt = load_checkpoint(tmp_path / CHECKPOINT)
    assert ckpt["config"]["knobs"]["name"] == "fast" and ckpt["config"]["knobs"]["cuda_graphs"] is True
    for name in ("baseline", "opt2", "bf16-ndhwc"):
        other = Engine(dataset_model(), run_config(name), CPU)
        other.model.load_state_dict(ckpt["ema"])  # same keys and shapes whatever the knobs
    again = _trainer(phantoms, tmp_path, "fast")
    again.resume()
    assert again.step == 3 and again.losses == losses
