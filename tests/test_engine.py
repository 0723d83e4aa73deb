"""The one place that applies a configuration: every knob, its CPU fallback, the ladder."""
import dataclasses
import os

import pytest
import torch

from medddpm.core.errors import InputError

from medddpm.core.config import (CONFIGS, KERNEL_VARIANTS, LADDER, PAPER_CONFIGS, SAMPLING_VARIANTS, DiffusionConfig, Knobs,
                            TrainConfig, run_config)
from medddpm.data.nifti import pair_files
from medddpm.data.volumes import VolumeDataset
from medddpm.run.engine import Engine, effective_knobs
from medddpm.run.optim import make_optimizer
from medddpm.train.checkpoint import CHECKPOINT, load_checkpoint
from medddpm.train.trainer import Trainer
from medddpm.profiling.workload import Workload

CPU = torch.device("cpu")


TRAINABLE = [n for n in CONFIGS if n not in {k.name for k in SAMPLING_VARIANTS}]
# Knobs that change nothing a CPU runs: CUDA and cuDNN flags, compile's mode (compile is off), how
# several ranks reduce gradients (one process).
CPU_INERT = {"name", "tf32", "cudnn_benchmark", "cudnn_benchmark_limit", "compile_mode", "grad_sync", "grad_buckets"}


def cpu_path(name: str) -> tuple:
    """What a CPU runs of configuration ``name``: its effective knobs, the inert ones left out."""
    knobs = effective_knobs(run_config(name), CPU)
    return tuple((f.name, getattr(knobs, f.name)) for f in dataclasses.fields(knobs) if f.name not in CPU_INERT)


CPU_PATHS = {path: name for name in reversed(TRAINABLE) for path in [cpu_path(name)]}  # the first name of each path


@pytest.mark.parametrize("name", sorted(CPU_PATHS.values(), key=TRAINABLE.index))
def test_every_cpu_path_trains(tiny, name):
    """One training step per distinct CPU path (every trainable configuration maps to one of them), at
    8³: the Triton interpreter pays per program."""
    work = Workload(tiny, run_config(name), (8, 8, 8), CPU)
    before = [p.detach().clone() for p in work.engine.model.parameters()]
    loss, marks = work.step(lambda: 0.0)
    assert torch.isfinite(loss) and len(marks) == 3
    assert any(not torch.equal(b, p) for b, p in zip(before, work.engine.model.parameters()))
    settings = work.settings()
    assert settings["name"] == name and settings["compile"] is False and settings["cuda_graphs"] is False


def test_every_configuration_runs_one_of_the_trained_cpu_paths():
    assert {cpu_path(n) for n in TRAINABLE} == set(CPU_PATHS) and len(CPU_PATHS) < len(TRAINABLE)
    for name in TRAINABLE:
        knobs = effective_knobs(run_config(name), CPU)
        assert knobs.name == name and not (knobs.compile or knobs.cuda_graphs or knobs.fused_adam)


def test_cpu_fallbacks_are_recorded():
    fast = run_config("bf16-graphs")
    cpu = effective_knobs(fast, CPU)
    assert (cpu.compile, cpu.cuda_graphs, cpu.fused_adam, cpu.data_cache) == (False, False, False, "auto")
    assert effective_knobs(dataclasses.replace(fast, data_cache="device"), CPU).data_cache == "host"
    assert (cpu.precision, cpu.channels_last, cpu.fused_ops, cpu.sdpa) == ("bf16", True, True, True)
    assert effective_knobs(fast, torch.device("cuda")) == fast
    # several ranks: flat gradients keep the step's CUDA graph, DDP's eager buckets do not
    assert effective_knobs(fast, torch.device("cuda"), world_size=2).cuda_graphs is True
    ddp = dataclasses.replace(fast, grad_sync="ddp")
    assert effective_knobs(ddp, torch.device("cuda"), world_size=2).cuda_graphs is False
    # gradient buckets and the reduced dtype: one process compiles the network whole and reduces nothing
    buckets = run_config("fast-b3")
    assert buckets.grad_buckets == 3 and effective_knobs(buckets, torch.device("cuda")).grad_buckets == 1
    assert effective_knobs(buckets, torch.device("cuda"), world_size=2).grad_buckets == 3
    fast = run_config("fast")
    assert (fast.grad_buckets, fast.grad_reduce) == (1, "bf16")
    assert effective_knobs(fast, torch.device("cuda")).grad_reduce == "fp32"
    assert effective_knobs(fast, torch.device("cuda"), world_size=2).grad_reduce == "bf16"


def test_gradient_buckets_start_during_the_backward(tiny, tmp_path):
    """FlatGrads: each bucket's all-reduce starts as soon as backward has accumulated its segment's
    gradients (the decoder's first), before the backward has finished; the result is the
    gradient divided by the world size (a world of one here) and summed."""
    import torch.distributed as dist

    from medddpm.net.model import UNet3D
    from medddpm.run.engine import FlatGrads, Segmented

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = UNet3D(tiny)
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.05)
        x, t = torch.randn(1, tiny.in_channels, 16, 16, 16), torch.tensor([5])
        ref = torch.autograd.grad(model(x, t).square().sum(), list(model.parameters()))
        grads = FlatGrads(model.segment_params(3), world_size=1)
        started = []
        grads._start = lambda b, start=grads._start: (started.append((b, list(grads.landed))), start(b))[1]
        grads.arm()
        Segmented(model, 3, lambda f: f)(x, t).square().sum().backward()
        # every bucket started inside the backward, in order; when the decoder's started, the encoder's
        # gradients had not all landed yet
        assert [b for b, _ in started] == [0, 1, 2] and started[0][1][2] < grads.sizes[2]
        grads.finish()
        for p, r in zip(model.parameters(), ref):
            torch.testing.assert_close(p.grad, r, rtol=0, atol=0)
        model.zero_grad(set_to_none=True)
        assert all(p.grad is None for p in model.parameters())  # the next backward writes its own
        grads.arm()
        Segmented(model, 3, lambda f: f)(x, t).square().sum().backward()
        assert len(started) == 6  # armed again: three more
        grads.finish()
        assert not grads.armed
        # Knobs.grad_reduce "bf16": the same sums in a bf16 buffer, handed to the optimizer as fp32
        model.zero_grad(set_to_none=True)
        narrow = FlatGrads(model.segment_params(3), world_size=1, reduce_dtype=torch.bfloat16)
        assert narrow.buffer.dtype == torch.bfloat16 and narrow.averaged.dtype == torch.float32
        narrow.arm()
        Segmented(model, 3, lambda f: f)(x, t).square().sum().backward()
        narrow.finish()
        for p, r in zip(model.parameters(), ref):
            assert p.grad.dtype == torch.float32
            torch.testing.assert_close(p.grad, r.bfloat16().float(), rtol=0, atol=0)
        assert any((p.grad != r).any() for p, r in zip(model.parameters(), ref))  # it did round
    finally:
        dist.destroy_process_group()


def test_ladder_adds_one_thing_per_rung():
    assert LADDER[:2] == ("baseline", "opt1") and LADDER[-2:] == ("bf16-graphs", "fast") and set(LADDER) <= set(CONFIGS)
    for lower, upper in zip(LADDER, LADDER[1:]):
        a, b = dataclasses.asdict(CONFIGS[lower]), dataclasses.asdict(CONFIGS[upper])
        changed = {k for k in a if a[k] != b[k]} - {"name"}
        assert changed, f"{upper} changes nothing over {lower}"
    assert list(PAPER_CONFIGS) == ["baseline", "opt1", "opt2", "opt12", "pytorch-default"]


def test_autotuned_configurations_change_only_their_tuning_knob():
    from medddpm.core.config import AUTOTUNED

    expect = {"bf16-compile-max-autotune": ("bf16-compile-tuned", "compile_mode"),
              "bf16-graphs-max-autotune": ("bf16-graphs", "compile_mode"), "bf16-graphs-cudnn-all": ("bf16-graphs", "cudnn_benchmark_limit")}
    assert [k.name for k in AUTOTUNED] == list(expect)
    for knobs in AUTOTUNED:
        base, knob = expect[knobs.name]
        a, b = dataclasses.asdict(knobs), dataclasses.asdict(CONFIGS[base])
        assert {k for k in a if a[k] != b[k]} == {"name", knob} and run_config(knobs.name) == knobs
    assert CONFIGS["bf16-graphs-cudnn-all"].cudnn_benchmark_limit == 0
    # fast captures the whole step itself, so its autotuned twin must not capture graphs in Inductor too
    assert CONFIGS["bf16-graphs-max-autotune"].compile_mode == "max-autotune-no-cudagraphs"


@pytest.mark.parametrize("changes,needle", [
    ({"compile_mode": "fastest"}, "compile_mode"),
    ({"data_cache": "ram"}, "data_cache"),
    ({"loader_workers": -1}, "loader_workers"),
    ({"grad_sync": "ring"}, "grad_sync"),
    ({"grad_reduce": "fp16"}, "grad_reduce"),
    ({"grad_reduce": "bf16", "grad_sync": "ddp"}, "needs grad_sync 'flat'"),
    ({"cuda_graphs": True, "checkpoint_attention": False, "compile": True, "compile_mode": "reduce-overhead"},
     "captures graphs too"),
    ({"cuda_graphs": True}, "checkpoint_attention"),
    ({"cudnn_benchmark_limit": -1}, "cudnn_benchmark_limit"),
    ({"cudnn_benchmark_limit": 2.5}, "cudnn_benchmark_limit"),
    ({"bf16_weights": True}, "precision 'bf16'"),
    ({"pad_channels": -8}, "pad_channels"),
    ({"capture_after": -1}, "capture_after"),
    ({"capture_after": True}, "capture_after"),
])
def test_knobs_are_validated_early(changes, needle):
    with pytest.raises(ValueError, match=needle):
        Knobs(**changes)


def test_sampling_variants_add_one_lever_each_and_refuse_training():
    """Each sampling variant adds one lever to fast, to a kernel variant or to a sampling variant
    before it (turning compilation off takes the compiled DDPM update with it, turning the Triton
    kernels off every one of them: one lever each)."""
    together = ({"compile", "compiled_update"}, {"triton_norm", "fold_conv_bias", "triton_conv", "triton_upsample"})

    def levers(changed: set[str]) -> int:
        return len(changed - set().union(*together)) + sum(bool(changed & g) for g in together)

    for i, knobs in enumerate(SAMPLING_VARIANTS):
        a = dataclasses.asdict(knobs)
        bases = (CONFIGS["bf16-graphs"], *KERNEL_VARIANTS, *SAMPLING_VARIANTS[:i])
        changes = [levers({k for k in a if a[k] != b[k]} - {"name"}) for b in map(dataclasses.asdict, bases)]
        assert min(changes) == 1 and run_config(knobs.name) == knobs
        with pytest.raises(ValueError, match="sampling only"):
            run_config(knobs.name, training=True)


def test_bf16_weights_are_the_numbers_autocast_casts_to(tiny):
    """Casting conv/linear weights once gives bit for bit the denoiser output of casting them at
    every call (autocast); norms keep fp32 parameters, and every weight keeps its layout."""
    from medddpm.run.engine import AUTOCAST_BF16_LAYERS, autocast, inference

    torch.manual_seed(0)
    state = {k: v.clone() for k, v in inference(tiny, run_config("bf16-graphs"), CPU)[0].state_dict().items()}
    x = torch.randn(2, 3, 8, 8, 8)  # 8³: bf16 3D convolutions on a CPU are slow
    t = torch.tensor([3, 200])
    outs = {}
    for name in ("bf16-graphs", "fast-w16"):
        model, _, knobs = inference(tiny, run_config(name), CPU, state=state)
        with torch.inference_mode(), autocast(knobs, CPU):
            outs[name] = model(x.contiguous(memory_format=torch.channels_last_3d), t)
        for m in model.modules():
            cast = knobs.bf16_weights and isinstance(m, AUTOCAST_BF16_LAYERS)
            assert all(p.dtype == (torch.bfloat16 if cast else torch.float32) for p in m.parameters(recurse=False))
        assert all(p.is_contiguous(memory_format=torch.channels_last_3d) for p in model.parameters() if p.ndim == 5)
    assert torch.equal(outs["bf16-graphs"], outs["fast-w16"])


def test_the_small_job_sampler_is_fasts_with_nothing_to_compile():
    """`fast-eager` (sample's pick for a small job): fast's pinned sampler, compile off, so no
    Inductor work and no Mega-Cache key; its Triton kernels still cache under MEDDDPM_CACHE. Where
    Inductor would fuse the ResBlocks' bias and residual adds, one Triton kernel does (fused_residual)."""
    from medddpm.core.config import SAMPLING_ALIASES, SMALL_JOB

    eager, fast = run_config(SMALL_JOB), CONFIGS[SAMPLING_ALIASES["fast"]]
    changed = {k for k, v in dataclasses.asdict(eager).items() if v != getattr(fast, k)} - {"name"}
    assert changed == {"compile", "compiled_update", "cudnn_benchmark", "fused_residual"} and not eager.compile
    assert eager.fused_residual and not fast.fused_residual
    assert eager.triton_norm and eager.triton_conv and eager.triton_upsample and eager.chain_graph and eager.cuda_graphs


@pytest.mark.parametrize("capture_after,warmups", [(0, 2), (1, 1), (3, 1)])
def test_a_shape_runs_eagerly_capture_after_times_then_is_captured_and_replayed(monkeypatch, capture_after, warmups):
    """``Knobs.capture_after``: a shape's first calls run the denoiser itself (its kernels compiled at
    the first, once), then it is captured after the warm-up calls left (at least one, on a side
    stream) and replayed; another shape starts over. The capture is faked: a CPU has no CUDA graphs."""
    from medddpm.run import engine

    ran, captures, kernels = [], [], []

    class Graph:
        def __init__(self, static, fn):
            self.static, self.fn, self.out = static, fn, None

        def replay(self):
            self.out.copy_(self.fn(*self.static))

    def fake_capture(self, inputs, warmup):
        captures.append((inputs[0].shape, warmup))
        static = [a.clone() for a in inputs]
        graph = Graph(static, lambda *a: a[0] * 2)
        graph.out = static[0] * 2
        return static, graph.out, graph

    monkeypatch.setattr(engine.GraphedDenoiser, "_capture", fake_capture)
    monkeypatch.setattr(engine.GraphedDenoiser, "_kernels", lambda self, inputs: kernels.append(inputs[0].shape))
    g = engine.GraphedDenoiser(lambda x: ran.append(x.shape) or x * 2, torch.device("cpu"), True, capture_after)
    a, b = torch.ones(2), torch.ones(3)
    for k in range(capture_after + 3):
        assert torch.equal(g(a + k), (a + k) * 2)
    assert ran == [a.shape] * capture_after and captures == [(a.shape, warmups)] and kernels == [a.shape]
    assert torch.equal(g(b), b * 2) and kernels == [a.shape, b.shape]
    assert len(captures) == (1 if capture_after else 2)  # a new shape is eager again unless captured at once
    assert run_config("fast-eager").capture_after == 1 and Knobs().capture_after == 1


def test_triton_kernels_alone_point_the_caches_into_medddpm_cache(tiny, monkeypatch, tmp_path):
    from medddpm.run.engine import compiled

    for name in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MEDDDPM_CACHE", str(tmp_path))
    from medddpm.net.model import UNet3D

    model = UNet3D(tiny)
    assert compiled(model, run_config("bf16")) is model and "TRITON_CACHE_DIR" not in os.environ
    assert compiled(model, run_config("fast-eager")) is model
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "triton")


@pytest.mark.parametrize("name", ["bf16-graphs", "fast-w16", "fast-w16-p8", "fast-w16-p8-tnorm", "fast-w16-tnorm-tconv",
                                  "fast-w16-tnorm-tconv-fold", "fast-w16-tnorm-tconv-fold-up",
                                  "fast-w16-tnorm-tconv-fold-up-update", "fast-w16-tnorm-tconv-fold-up-table",
                                  "fast-eager"])
def test_the_sampler_keeps_every_activation_channels_last(tiny, name):
    """Issue 20: no NCDHW tensor inside the sampler's denoiser — its input buffer and every module's
    5-D input and output are NDHWC by their strides (or a channel slice of an NDHWC tensor)."""
    from medddpm.run.engine import autocast, inference

    x = torch.randn(1, 3, 4, 4, 4).contiguous(memory_format=torch.channels_last_3d)
    if not _ndhwc_order(torch.nn.functional.conv3d(x, torch.randn(4, 3, 3, 3, 3), padding=1)):
        pytest.skip("this CPU's PyTorch convolution returns NCDHW for an NDHWC input (no oneDNN path for it): "
                    "the layout the model keeps cannot be seen here")

    model, diffusion, knobs = inference(tiny, run_config(name), CPU)
    seen = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append((type(m).__name__, i[0] if i else None, o)))
             for m in model.modules()]
    hooks.append(model.register_forward_pre_hook(lambda m, args: seen.append(("denoiser input", args[0], None))))
    mask = torch.zeros(1, tiny.mask_channels, 16, 16, 16)
    with torch.inference_mode(), autocast(knobs, CPU):
        diffusion.sample(mask, tiny.out_channels, "ddim", 2)
    for h in hooks:
        h.remove()
    assert sum(n == "denoiser input" for n, _, _ in seen) == 2
    tensors = [(n, t) for n, i, o in seen for t in (i, o) if isinstance(t, torch.Tensor) and t.ndim == 5]
    assert len(tensors) > 20
    bad = [(n, tuple(t.shape), t.stride()) for n, t in tensors if not _ndhwc_order(t)]
    assert not bad


def _ndhwc_order(t: torch.Tensor) -> bool:
    """Channels vary fastest, then W, H, D (dimensions of size 1 aside): NDHWC, or a channel slice of it."""
    strides = [t.stride(d) for d in (1, 4, 3, 2) if t.shape[d] > 1]
    return strides == sorted(strides)


def test_optimizer_choice_follows_knobs(tiny):
    layer = torch.nn.Linear(3, 3)
    assert make_optimizer(layer, 1e-3, run_config("bf16-graphs"), CPU).defaults["fused"] is None
    assert make_optimizer(layer, 1e-3, run_config("baseline"), CPU).defaults["capturable"] is False


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("accum", [1, 2])
def test_graph_owned_gradients_train_the_same_steps(tiny, accum):
    """graph_owned_grads: the captured step leaves the gradients where autograd writes them, with no
    add into a zeroed .grad and no zeroing; warm-up, capture and replays give the same losses and
    parameters as the static-.grad graph (micro-batches after the first still add), and after the
    graph is released the next (eager) step starts from clean gradients too."""
    cuda = torch.device("cuda")
    base = dataclasses.replace(run_config("bf16-graphs"), compile=False, cudnn_benchmark=False)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.rand(accum, 1, 1, 16, 16, 16, generator=g) * 2 - 1, -torch.ones(accum, 1, 2, 16, 16, 16),
                torch.randint(0, 250, (accum, 1), generator=g), torch.randn(accum, 1, 1, 16, 16, 16, generator=g))
               for _ in range(7)]  # GRAPH_WARMUP eager steps, the capture, replays; after a release, eager
    runs = {}
    for owned in (False, True):
        torch.manual_seed(0)
        engine = Engine(tiny, dataclasses.replace(base, graph_owned_grads=owned), cuda, lr=1e-3)
        losses = []
        for i, (x, m, t, noise) in enumerate(batches):
            if i == len(batches) - 1:
                assert engine.train_step.graph is not None
                engine.train_step.release()
            draws = [(t[k].to(cuda), noise[k].to(cuda)) for k in range(accum)]
            loss, _ = engine.train_step([x[k].to(cuda) for k in range(accum)], [m[k].to(cuda) for k in range(accum)],
                                        draws=draws)
            losses.append(loss.item())
        runs[owned] = losses, [p.detach().cpu() for p in engine.model.parameters()]
    assert runs[True][0] == pytest.approx(runs[False][0], rel=1e-5)
    for a, b in zip(runs[False][1], runs[True][1]):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="needs cuda_graphs"):
        Knobs(graph_owned_grads=True)


def _trainer(phantoms, out, config, **train):
    """A trainer of the tiny model at 8³ (the phantoms resampled): bf16 3D convolutions on a CPU are slow."""
    ds = VolumeDataset(pair_files(phantoms / "images", phantoms / "masks"), "whole-head", 1, (8, 8, 8))
    cfg = TrainConfig(**{"save_every": 3, "ema_start_step": 1, "ema_every": 1, "lr": 1e-3, "log_every": 2, **train})
    return Trainer(ds, dataset_model(), cfg, run_config(config), CPU, out, (8, 8, 8))


def dataset_model():
    from medddpm.core.config import MODEL_PRESETS

    return MODEL_PRESETS["tiny"]


def test_fast_checkpoint_resumes_and_loads_under_other_configs(phantoms, tmp_path):
    t = _trainer(phantoms, tmp_path, "bf16-graphs")
    losses = t.fit(3, progress=False)
    assert len(losses) == 3 and all(l == l for l in losses)
    ckpt = load_checkpoint(tmp_path / CHECKPOINT)
    assert ckpt["config"]["knobs"]["name"] == "bf16-graphs" and ckpt["config"]["knobs"]["cuda_graphs"] is True
    for name in ("baseline", "opt2", "bf16-ndhwc"):
        other = Engine(dataset_model(), run_config(name), CPU)
        other.model.load_state_dict(ckpt["ema"])  # same keys and shapes whatever the knobs
    again = _trainer(phantoms, tmp_path, "bf16-graphs")
    again.resume()
    assert again.step == 3 and again.losses == losses


def test_the_sampler_freezes_its_timestep_table_under_its_own_autocast(tiny):
    """timestep_table: ``inference`` fills the table with the addends the denoiser computes at
    every step (bf16, the sampler's autocast), so ε is that of the configuration without it."""
    from medddpm.run.engine import autocast, inference

    torch.manual_seed(0)
    state = {k: v.clone() for k, v in inference(tiny, run_config("bf16-graphs"), CPU)[0].state_dict().items()}
    for k, v in state.items():  # no zero-initialised branch: every addend reaches ε
        if v.is_floating_point():
            v.normal_(std=0.05)
    x = torch.randn(2, 3, 8, 8, 8).contiguous(memory_format=torch.channels_last_3d)  # 8³: bf16 on a CPU is slow
    t = torch.tensor([3, 200])
    outs = {}
    for name in ("fast-w16-tnorm-tconv-fold-up", "fast-w16-tnorm-tconv-fold-up-table"):
        model, _, knobs = inference(tiny, run_config(name), CPU, state=state)
        with torch.inference_mode(), autocast(knobs, CPU):
            outs[name] = model(x, t).float()
    table = model.timestep_table
    assert table.dtype == torch.bfloat16 and table.shape[0] == DiffusionConfig().timesteps
    torch.testing.assert_close(outs["fast-w16-tnorm-tconv-fold-up-table"], outs["fast-w16-tnorm-tconv-fold-up"],
                               rtol=0, atol=0)


def test_a_model_for_given_weights_is_built_on_its_device_and_loaded(tiny, monkeypatch):
    """inference(state=…) builds the U-Net on its own device (never through the meta device, whose
    storage step runs PyTorch's Python reference ops) and loads every parameter and buffer: the
    same weights and outputs as the model they came from; a state missing a key is refused."""
    from medddpm.run.engine import build_model, inference

    knobs = run_config("bf16")
    torch.manual_seed(0)
    ref = build_model(tiny, knobs, CPU).eval()
    state = {k: v.clone() for k, v in ref.state_dict().items()}
    monkeypatch.setattr(torch.nn.Module, "to_empty", lambda *a, **k: pytest.fail("built on the meta device"))
    model, _, _ = inference(tiny, knobs, CPU, state=state)
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    x, t = torch.randn(1, tiny.in_channels, 8, 8, 8), torch.tensor([3])
    with torch.inference_mode():
        torch.testing.assert_close(model(x, t), ref(x, t), rtol=0, atol=0)
    with pytest.raises(InputError, match="do not fit the model .*Missing key"):  # a damaged checkpoint: one line
        inference(tiny, knobs, CPU, state={k: v for k, v in state.items() if not k.startswith("out")})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("sampler,steps", [("dpm2m-sde", 12), ("ddpm", None)])
def test_a_shape_run_eagerly_samples_what_its_graph_replays(tiny, sampler, steps):
    """``capture_after`` changes when a graph is captured, not the numbers: under fast-eager, chains (and DDPM's
    per-step graphs) sampled eagerly, then captured, then replayed equal those of a graph captured at once."""
    from medddpm.core.config import SMALL_JOB
    from medddpm.run.engine import autocast, inference
    from medddpm.train.parity import phantom_batch, seeded_weights

    device = torch.device("cuda")
    outs: dict[tuple[int, int], list] = {}
    for after in (0, 1):
        knobs = dataclasses.replace(run_config(SMALL_JOB), capture_after=after)
        _, diffusion, eff = inference(tiny, knobs, device, DiffusionConfig(timesteps=20), seeded_weights(tiny, 0))
        for n in (1, 3, 1):  # several batch sizes in one process (issue 77 item 9): each shape's graphs its own
            masks = phantom_batch(tiny, 32, n, 0)[1]
            with torch.inference_mode(), autocast(eff, device):
                outs.setdefault((after, n), []).extend(
                    diffusion.sample(masks.to(device), tiny.out_channels, sampler, steps,
                                     generator=torch.Generator(device).manual_seed(k)).float().cpu()
                    for k in range(3))  # eager (after=1) or replay; the capture; a replay
    for n in (1, 3):
        assert all(torch.equal(a, b) for a, b in zip(outs[(0, n)], outs[(1, n)])), n
    assert all(torch.equal(a, b) for a, b in zip(outs[(1, 1)][:3], outs[(1, 1)][3:]))  # batch 1 again: the same
