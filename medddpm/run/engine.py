"""The one place that applies a run configuration (``config.Knobs``).

TF32 and cuDNN-autotuner flags, memory layout, bf16 autocast, the model's fast-path operators
(``ndhwc``, SDPA attention), ``torch.compile``, the optimizer and the training step itself — eager,
or captured once as a CUDA graph and replayed. ``train``, ``bench``, ``sample`` and ``workload``
call this module and nothing else to set a configuration up.

Without a GPU, the knobs that need one fall back to the PyTorch reference path
(``effective_knobs``); what actually ran is what ``effective_settings`` records.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, replace
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from ..core.config import TRITON_KNOBS, DiffusionConfig, Knobs, ModelConfig, switched_on, ungraphed
from ..core.errors import InputError
from ..net import fp8, kernels
from ..diffusion.gaussian import GaussianDiffusion, run_plan
from ..diffusion.solvers import Plan
from ..net.model import UNet3D, freeze_channel_padding
from ..core.runtime import benchmark_limit, set_backend_flags, tf32_state
from . import cache
from .optim import make_optimizer

GRAPH_WARMUP = 3  # eager steps (real ones) on a side stream before the step is captured
# DistributedDataParallel's gradient bucket size (MB): PyTorch's default, 25 MB, i.e. about seven
# all-reduces for the whole-head model's 160 MB of fp32 gradients, each started as soon as its
# bucket is full, so they overlap the rest of the backward pass.
DDP_BUCKET_MB = 25

Draw = tuple[Tensor, Tensor]  # (t, noise) of one micro-batch


@contextlib.contextmanager
def nvtx(name: str) -> Iterator[None]:
    """An NVTX push/pop range on CUDA builds with a GPU; nothing elsewhere."""
    active = torch.cuda.is_available()
    if active:
        torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        if active:
            torch.cuda.nvtx.range_pop()


@contextlib.contextmanager
def side_stream(device: torch.device) -> Iterator[None]:
    """Run the block on a fresh CUDA stream that follows, and is then followed by, the current one:
    where work runs before a CUDA graph capture (PyTorch's warm-up rule)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        yield
    torch.cuda.current_stream(device).wait_stream(side)


def effective_knobs(knobs: Knobs, device: torch.device, world_size: int = 1) -> Knobs:
    """The knobs that run on ``device``: on a CPU, compile, CUDA graphs (a sampler's chain graph too), the fused Adam and a
    device-side data cache fall back to eager PyTorch, the reference path. With several ranks and
    ``grad_sync`` "ddp" the step is not captured as a CUDA graph (DDP's all-reduces stay eager);
    with "flat" the all-reduces are captured with the step (``FlatGrads`` gathers the gradients
    autograd writes, one process's ``graph_owned_grads`` by other means: the knob itself is for one
    process); one process runs the network whole (``grad_buckets`` 1) and reduces nothing
    (``grad_reduce`` "fp32")."""
    if world_size == 1:
        knobs = replace(knobs, grad_buckets=1, grad_reduce="fp32")  # nothing to overlap or reduce
    if device.type == "cuda":
        if world_size == 1:
            return knobs
        flat = replace(knobs, graph_owned_grads=False)
        return flat if knobs.grad_sync == "flat" else ungraphed(knobs)
    return replace(ungraphed(knobs), compile=False, fused_adam=False,
                   data_cache="host" if knobs.data_cache == "device" else knobs.data_cache)


def effective_settings(knobs: Knobs) -> dict[str, Any]:
    """Every knob plus the TF32 and autotuner flags as PyTorch reports them now."""
    return {**asdict(knobs), **tf32_state(), "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "cudnn_benchmark_limit_now": benchmark_limit()}


def memory_format(knobs: Knobs) -> torch.memory_format:
    return torch.channels_last_3d if knobs.channels_last else torch.contiguous_format


def to_device(t: Tensor, device: torch.device, knobs: Knobs) -> Tensor:
    return t.to(device, non_blocking=True).contiguous(memory_format=memory_format(knobs))


def autocast(knobs: Knobs, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast for forward + loss (the weight-cast cache is off under CUDA graphs)."""
    if knobs.precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=not knobs.cuda_graphs)
    return contextlib.nullcontext()


def build_model(model_cfg: ModelConfig, knobs: Knobs, device: torch.device, init: bool = True) -> UNet3D:
    """The U-Net with the knobs' operator choices, on ``device`` in the knobs' layout; ``init`` False,
    for a caller that loads every parameter and buffer, builds it on ``device`` itself: no host
    initialisation and no host copy. (Not on the meta device: giving meta tensors storage runs
    through PyTorch's Python reference ops and imports its symbolic-shape machinery, 2.8 s of a
    1-mask ``sample`` on an H100, ``time_to_result/profile-sample-1-warm.txt``.)"""
    with torch.device(device) if not init else contextlib.nullcontext():
        model = UNet3D(model_cfg, checkpoint_attention=knobs.checkpoint_attention, fused_ops=knobs.fused_ops,
                       sdpa=knobs.sdpa, triton_norm=knobs.triton_norm, pad_channels=knobs.pad_channels,
                       triton_conv=knobs.triton_conv, dense_skip_grads=knobs.dense_skip_grads,
                       fold_conv_bias=knobs.fold_conv_bias, triton_upsample=knobs.triton_upsample,
                       fused_skip_grads=knobs.fused_skip_grads, fused_residual=knobs.fused_residual)
    if knobs.fp8_train_convs:
        if why := fp8.available(device):
            raise ValueError(f"configuration {knobs.name!r} (fp8_train_convs): {why}")
        model.use_fp8_forward()
    return model.to(device=device, memory_format=memory_format(knobs))


def compiled(model: nn.Module, knobs: Knobs, dynamic: bool | None = None) -> nn.Module | Callable:
    """``torch.compile(model, mode=knobs.compile_mode, dynamic=dynamic)`` when asked for, else the model itself; with
    ``grad_buckets`` > 1 the U-Net in that many segments, each compiled on its own (``Segmented``). ``dynamic``
    False: a second input shape compiles a graph of its own static shape (training's curriculum), not one of
    symbolic shapes for all."""
    if knobs.compile or switched_on(knobs, TRITON_KNOBS):
        cache.use()  # Inductor's and Triton's caches under MEDDDPM_CACHE, kept across processes
    mode = None if knobs.compile_mode == "default" else knobs.compile_mode
    compile_fn = (lambda f: torch.compile(f, mode=mode, dynamic=dynamic)) if knobs.compile else (lambda f: f)
    if knobs.grad_buckets > 1:
        return Segmented(model, knobs.grad_buckets, compile_fn)
    return compile_fn(model)


class Segmented(nn.Module):
    """The U-Net run as ``n`` segments of its blocks (``UNet3D.segment_bounds``), each passed through
    ``compile_fn`` on its own: every segment's backward is its own autograd node, so the gradients
    of the decoder's segment are accumulated (and their bucket's all-reduce started, ``FlatGrads``)
    while the encoder's backward still runs. The time embedding runs eagerly in front of them. The
    same blocks in the same order as ``UNet3D.forward``."""

    def __init__(self, model: UNet3D, n: int, compile_fn: Callable[[Callable], Callable]) -> None:
        super().__init__()
        self.model = model

        def segment(lo: int, hi: int) -> Callable:
            def run(h: Tensor, emb: Tensor, skips: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
                return model.blocks(lo, hi, h, emb, skips)
            return compile_fn(run)
        self.calls = [segment(lo, hi) for lo, hi in model.segment_bounds(n)]

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        h, skips, emb = x, (), self.model.time_input(x, t)
        for call in self.calls:
            h, skips = call(h, emb, skips)
        return h


class GraphedDenoiser:
    """The denoiser ε_θ(cat[x_t, mask], t) of one sampling step (or any function of tensors: a
    sampler's whole chain, ``GraphedChain``), captured as a CUDA graph per input shape and
    replayed. A shape's first ``capture_after`` calls run eagerly (``Knobs.capture_after``: a shape
    called once is never captured); a shape not seen before is captured anew, never replayed into
    a graph of another shape. Call it inside ``autocast`` and inference mode. ``marks`` gets the
    ``time.perf_counter()`` (after a synchronize) at which the first shape's Triton kernels were
    ready ("kernels", with ``precompile``) and the first shape was captured ("captured"): where a
    first volume's seconds go (``sample``'s timing line)."""

    WARMUP = 2  # eager calls of a shape before it is captured (compile, autotune), the capture_after ones included;
    # at least one of them on a side stream right before the capture (PyTorch's warm-up rule)

    def __init__(self, net: nn.Module | Callable, device: torch.device, precompile: bool = False,
                 capture_after: int = 0, marks: dict[str, float] | None = None) -> None:
        self.net, self.device, self.capture_after = net, device, capture_after
        self.precompile = precompile  # a dry run first compiles every Triton kernel of a shape at once (kernels.precompile)
        self.graphs: dict[tuple, tuple[list[Tensor], Tensor, torch.cuda.CUDAGraph]] = {}
        self.eager: dict[tuple, int] = {}  # eager calls made of each shape not captured yet
        self.marks = {} if marks is None else marks  # a dict of its owner's (GraphedChain's), where given

    def __call__(self, *inputs: Tensor) -> Tensor:
        key = tuple((tuple(a.shape), a.dtype, a.stride()) for a in inputs)
        if key not in self.graphs:
            done = self.eager.get(key, 0)
            if done == 0:
                self._kernels(inputs)
            if done < self.capture_after:
                self.eager[key] = done + 1
                return self.net(*inputs)
            self.graphs[key] = self._capture(inputs, max(self.WARMUP - done, 1))
        static, out, graph = self.graphs[key]
        for dst, src in zip(static, inputs):
            dst.copy_(src, non_blocking=True)
        graph.replay()
        return out.clone()  # the graph's output buffer is overwritten by the next replay

    def _mark(self, name: str) -> None:
        torch.cuda.synchronize(self.device)
        self.marks.setdefault(name, time.perf_counter())

    def _kernels(self, inputs: Sequence[Tensor]) -> None:
        """Compile (or load from Triton's cache) every Triton kernel of this shape at once: a dry run on copies."""
        if self.precompile:
            copies = [a.clone() for a in inputs]
            kernels.precompile(lambda: self.net(*copies))
            self._mark("kernels")

    def _capture(self, inputs: Sequence[Tensor], warmup: int):
        static = [a.clone() for a in inputs]
        with side_stream(self.device):
            for _ in range(warmup):
                self.net(*static)
        torch.cuda.empty_cache()  # the eager calls' and warm-up's cached blocks (each stream's own) to the graph's pool
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.net(*static)
        self._mark("captured")
        return static, out, graph

    def release(self) -> None:
        """Free every captured graph (and the memory it holds)."""
        for _, _, graph in self.graphs.values():
            graph.reset()
        self.graphs.clear()


class GraphedChain:
    """A few-step solver's whole chain (``gaussian.run_plan``: every denoiser call and update)
    captured as one CUDA graph per (plan, clip, shapes) and replayed (``Knobs.chain_graph``): a
    ``GraphedDenoiser`` of the chain as a function of (mask, x_T, noise…), so a replay computes what
    the eager chain computes from the same numbers, with no host work between steps. At most
    ``KEEP`` plans hold graphs (the oldest is released first). Call it inside ``autocast`` and
    inference mode."""

    KEEP = 4  # plans whose graphs are held at once: each holds its chain's memory

    def __init__(self, diffusion: GaussianDiffusion, net: nn.Module | Callable, device: torch.device,
                 precompile: bool = False, capture_after: int = 0) -> None:
        self.diffusion, self.net, self.device, self.precompile = diffusion, net, device, precompile
        self.capture_after = capture_after  # GraphedDenoiser's: a chain run once is never captured
        self.chains: dict[tuple, GraphedDenoiser] = {}
        self.marks: dict[str, float] = {}  # every chain's GraphedDenoiser.marks: the first kernels and capture

    def __call__(self, plan: Plan, mask: Tensor, channels: int, x: Tensor, noises: Sequence[Tensor],
                 clip: bool = True) -> Tensor:
        key = (plan, clip, channels)
        if key not in self.chains:
            while len(self.chains) >= self.KEEP:
                self.chains.pop(next(iter(self.chains))).release()

            def chain(mask: Tensor, x: Tensor, *noises: Tensor) -> Tensor:  # the mask is written inside the graph
                eps = self.diffusion.conditioned(mask, channels, self.net)
                return run_plan(plan, eps, x, self.diffusion.abar_host, noises, clip)
            self.chains[key] = GraphedDenoiser(chain, self.device, self.precompile, self.capture_after, self.marks)
        return self.chains[key](mask, x, *noises)


# Layers whose weights and biases bf16 autocast casts to bf16 at every call (``Knobs.bf16_weights``).
AUTOCAST_BF16_LAYERS = (nn.Conv1d, nn.Conv3d, nn.Linear)


def cast_autocast_weights(model: nn.Module, dtype: torch.dtype = torch.bfloat16) -> None:
    """Store the weights and biases of ``model``'s convolutions and linear layers in ``dtype``, in
    place and in their own memory layout: the numbers autocast would cast them to at every call,
    cast once. Norms keep fp32 parameters (autocast runs them in fp32)."""
    for m in model.modules():
        if isinstance(m, AUTOCAST_BF16_LAYERS):
            for p in (m.weight, m.bias):
                if p is not None:
                    p.data = p.data.to(dtype)


def inference(model_cfg: ModelConfig, knobs: Knobs, device: torch.device,
              diffusion_cfg: DiffusionConfig = DiffusionConfig(),
              state: dict[str, Tensor] | None = None) -> tuple[UNet3D, GaussianDiffusion, Knobs]:
    """An eval-mode model (weights from ``state``) and the diffusion that samples with it, under
    ``knobs`` made effective for ``device``: compiled where asked, and with ``cuda_graphs`` each
    denoising step replayed as a CUDA graph (``GraphedDenoiser``). Run its calls inside
    ``torch.inference_mode()`` and ``autocast(knobs, device)``."""
    knobs = replace(effective_knobs(knobs, device), checkpoint_attention=False)
    if knobs.fp8_convs != "none" and (why := fp8.available(device)):
        raise ValueError(f"configuration {knobs.name!r} (fp8_convs={knobs.fp8_convs!r}): {why}")
    set_backend_flags(knobs.tf32, knobs.cudnn_benchmark, knobs.cudnn_benchmark_limit)
    model = build_model(model_cfg, knobs, device, init=state is None)
    if state is not None:
        try:
            model.load_state_dict(state)  # strict: every parameter and buffer the model was built without
        except RuntimeError as exc:  # weights of another model than the config says: a damaged or edited checkpoint
            first = str(exc).splitlines()[1].strip() if len(str(exc).splitlines()) > 1 else str(exc)
            first = first if len(first) <= 300 else first[:300] + " …"
            raise InputError(f"the checkpoint's weights do not fit the model its config describes ({model_cfg.name}): "
                             f"{first}") from None
    model.eval().requires_grad_(False)
    if knobs.bf16_weights:
        cast_autocast_weights(model)
    freeze_channel_padding(model)  # after the cast: the padded weights hold the cast numbers
    if knobs.timestep_table:  # after the cast, under the sampler's autocast: the numbers each step would compute
        with torch.inference_mode(), autocast(knobs, device):
            model.freeze_timestep_table(diffusion_cfg.timesteps)
    if knobs.fp8_convs != "none":  # after the cast: the bf16 weights quantized
        model.use_fp8_convs(knobs.fp8_convs)
    net = compiled(model, knobs)  # the diffusion hands it its input in the model's layout
    # uncompiled Triton kernels (fast-eager): each new shape's kernels compiled at once, not one by one at first launch
    precompile = not knobs.compile and bool(switched_on(knobs, TRITON_KNOBS))
    diffusion = GaussianDiffusion(GraphedDenoiser(net, device, precompile, knobs.capture_after) if knobs.cuda_graphs
                                  else net, diffusion_cfg, memory_format(knobs), knobs.compile and knobs.compiled_update)
    if knobs.chain_graph:
        diffusion.chain = GraphedChain(diffusion, net, device, precompile, knobs.capture_after)
    return model, diffusion.to(device), knobs


def start_marks(diffusion: GaussianDiffusion) -> dict[str, float]:
    """The phases its CUDA graphs recorded (``GraphedDenoiser.marks``: "kernels", "captured"), the earliest of each."""
    marks: dict[str, float] = {}
    for graphed in (diffusion.model, diffusion.chain):
        for name, t in getattr(graphed, "marks", {}).items():
            marks[name] = min(t, marks.get(name, t))
    return marks


def data_parallel(model: nn.Module, device: torch.device, knobs: Knobs) -> nn.Module:
    """``DistributedDataParallel`` around ``model`` in the current process group: gradients are
    averaged over the ranks in buckets of ``DDP_BUCKET_MB``. Gradients are views into the buckets
    (no copy) except in NDHWC, where the flat buckets cannot hold channels-last strides."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [device] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=DDP_BUCKET_MB,
                                   gradient_as_bucket_view=not knobs.channels_last)


def _dense(t: Tensor) -> bool:
    """Whether ``t`` covers exactly ``numel`` consecutive elements in some order of its dimensions."""
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz > 1):
        if stride != expected:
            return False
        expected *= size
    return True


REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # Knobs.grad_reduce → the all-reduced dtype


class FlatGrads:
    """``Knobs.grad_sync`` "flat": the gradients averaged over the ranks through one flat buffer,
    the same arithmetic as DDP (pre-divide by the world size, then sum), capturable in the step's
    CUDA graph.

    Autograd writes each parameter's gradient where it likes, as one process does with
    ``graph_owned_grads`` (no zeroed static ``.grad`` to add into: no zeroing and no add kernel per
    parameter). ``buckets`` (lists of parameters, in the order backward completes them) lay the
    buffer out as consecutive slices. Between ``arm`` and ``finish`` (the last micro-batch's
    backward), a hook on each parameter counts its bucket's accumulated gradients; when the last one
    lands, one multi-tensor copy gathers the bucket's gradients into its slice and the slice's
    all-reduce starts (asynchronously: NCCL's stream waits for the backward so far, and the rest of
    the backward runs beside it). NCCL averages in the all-reduce (``ReduceOp.AVG``: the division
    inside it, bit-equal for a world of a power of two); a backend without it (gloo) divides first.
    ``finish`` starts any bucket still waiting, makes the caller's stream wait for every all-reduce
    and points each ``.grad`` at its averaged slice, for the optimizer; after it the caller sets them
    to None (``zero_grad(set_to_none=True)``), so the next backward writes fresh ones. With ``reduce_dtype`` narrower than the
    parameters' (``Knobs.grad_reduce`` "bf16") the gather rounds into a buffer of that dtype, NCCL
    sums in it, and ``finish`` copies the result into the parameters' dtype, in one kernel."""

    def __init__(self, buckets: Sequence[Sequence[nn.Parameter]], world_size: int,
                 reduce_dtype: torch.dtype | None = None) -> None:
        import torch.distributed as dist

        buckets = [[p for p in b if p.requires_grad] for b in buckets]
        buckets = [b for b in buckets if b]
        params = [p for b in buckets for p in b]
        bad = [tuple(p.shape) for p in params if not _dense(p)]
        if bad:
            raise ValueError(f"flat gradients need dense parameters; these are not: {bad}")
        if len({id(p) for p in params}) != len(params):
            raise ValueError("a parameter is in two gradient buckets")
        self.world_size = world_size
        self.average = dist.get_backend() == "nccl"  # NCCL has ReduceOp.AVG; gloo does not
        numel, device, dtype = sum(p.numel() for p in params), params[0].device, params[0].dtype
        self.averaged = torch.zeros(numel, device=device, dtype=dtype)  # the gradients the optimizer reads
        self.buffer = (self.averaged if reduce_dtype in (None, dtype)  # what the all-reduces sum
                       else torch.zeros(numel, device=device, dtype=reduce_dtype))
        self.params, self.views, self.members = params, [], []
        self.slices: list[Tensor] = []
        offset = 0
        for b, bucket in enumerate(buckets):
            start, members = offset, []
            for p in bucket:
                self.views.append(self.averaged.as_strided(p.shape, p.stride(), offset))
                members.append((p, self.buffer.as_strided(p.shape, p.stride(), offset),
                                self.buffer[offset:offset + p.numel()]))
                offset += p.numel()
                p.register_post_accumulate_grad_hook(lambda _p, b=b: self._landed(b))
            self.members.append(members)
            self.slices.append(self.buffer[start:offset])
        self.sizes = [len(bucket) for bucket in buckets]
        self._reset(armed=False)

    def _reset(self, armed: bool) -> None:
        self.armed, self.landed, self.started = armed, [0] * len(self.sizes), [False] * len(self.sizes)
        self.works: list[Any] = []

    def arm(self) -> None:
        """The next backward is the step's last: start each bucket's all-reduce once it is complete."""
        self._reset(armed=True)

    def _landed(self, b: int) -> None:
        if self.armed:
            self.landed[b] += 1
            if self.landed[b] == self.sizes[b]:
                self._start(b)

    def _gather(self, b: int) -> None:
        """Bucket ``b``'s gradients into its slice: one multi-tensor copy of the gradients in their
        parameters' strides (autograd's layout contract), each as its dense run of memory."""
        dst, src = [], []
        for p, view, flat in self.members[b]:
            g = p.grad
            if g is None:  # a parameter this step did not use
                flat.zero_()
            elif g.stride() == p.stride():
                dst.append(flat)
                src.append(g.as_strided((g.numel(),), (1,)))
            else:
                view.copy_(g)
        if dst:
            torch._foreach_copy_(dst, src)

    def _start(self, b: int) -> None:
        import torch.distributed as dist

        self.started[b] = True
        self._gather(b)
        if self.average:
            self.works.append(dist.all_reduce(self.slices[b], op=dist.ReduceOp.AVG, async_op=True))
        else:
            self.slices[b].div_(self.world_size)
            self.works.append(dist.all_reduce(self.slices[b], async_op=True))

    def finish(self) -> None:
        """Start the buckets not started yet (in order), wait for every all-reduce, and point each
        ``.grad`` at its averaged slice."""
        for b, started in enumerate(self.started):
            if not started:
                self._start(b)
        for work in self.works:
            work.wait()
        if self.buffer is not self.averaged:
            self.averaged.copy_(self.buffer)
        for p, view in zip(self.params, self.views):
            p.grad = view
        self._reset(armed=False)


@torch.no_grad()
def broadcast_from_rank0(tensors: Sequence[Tensor]) -> None:
    """Every rank takes rank 0's values (one broadcast of a flat copy; any memory layout)."""
    import torch.distributed as dist

    if not tensors:
        return
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    dist.broadcast(flat, 0)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view(t.shape))
        offset += t.numel()


class Engine:
    """A model, its diffusion wrapper, optimizer and training step under one configuration.

    ``knobs`` are made effective for ``device`` and the process-wide backend flags are set here.
    With ``world_size`` > 1 (a process group must exist) the gradients are averaged over the ranks
    as ``knobs.grad_sync`` says: one all-reduce of flat gradients (``FlatGrads``; rank 0's weights
    broadcast first), or the network wrapped in ``DistributedDataParallel`` before it is compiled.
    ``model`` stays the bare U-Net, whose state dict is the same in every configuration.
    """

    def __init__(self, model_cfg: ModelConfig, knobs: Knobs, device: torch.device,
                 diffusion_cfg: DiffusionConfig = DiffusionConfig(), lr: float = 1e-5,
                 world_size: int = 1, betas: tuple[float, float] = (0.9, 0.999), optimizer: str = "adam") -> None:
        self.knobs = effective_knobs(knobs, device, world_size)
        self.device = device
        set_backend_flags(self.knobs.tf32, self.knobs.cudnn_benchmark, self.knobs.cudnn_benchmark_limit)
        self.model = build_model(model_cfg, self.knobs, device)
        flat = world_size > 1 and self.knobs.grad_sync == "flat"
        self.ddp = data_parallel(self.model, device, self.knobs) if world_size > 1 and not flat else None
        self.grads = FlatGrads(self.model.segment_params(self.knobs.grad_buckets), world_size,
                               REDUCE_DTYPES[self.knobs.grad_reduce]) if flat else None
        if flat:
            broadcast_from_rank0([*self.model.parameters(), *self.model.buffers()])  # as DDP does
        if self.ddp is not None and self.knobs.compile and self.knobs.channels_last:
            # torch 2.11: DDPOptimizer's per-bucket graph split fails on NDHWC conv weights (a stride
            # assertion in convolution_backward), so the step compiles as one graph and DDP's
            # all-reduces start when its backward has finished
            import torch._dynamo

            torch._dynamo.config.optimize_ddp = False
        net = self.ddp if self.ddp is not None else self.model
        # the denoiser's input (image + mask, concatenated) in the model's layout: a 1-channel NDHWC
        # batch is also NCDHW-contiguous, so the concatenation comes out NCDHW, and the thin stem
        # (Triton for NDHWC only) would fall back to cuDNN
        self.diffusion = GaussianDiffusion(compiled(net, self.knobs, dynamic=False), diffusion_cfg,
                                           memory_format(self.knobs)).to(device)
        self.optimizer = make_optimizer(self.model, lr, self.knobs, device, betas, optimizer)
        self.train_step = TrainStep(self.diffusion, self.optimizer, self.knobs, device,
                                    self.ddp.no_sync if self.ddp is not None else None, self.grads)

    def settings(self) -> dict[str, Any]:
        return effective_settings(self.knobs)

    def to_device(self, t: Tensor) -> Tensor:
        return to_device(t, self.device, self.knobs)


class TrainStep:
    """One optimizer step (paper §3.2): forward + L1 loss + backward per micro-batch, gradients
    averaged over the micro-batches, then Adam. Returns the mean loss as a device tensor, so the
    caller decides when to synchronise.

    ``draws`` gives each micro-batch's diffusion time and noise (else they are drawn inside the
    step from the default generator). ``no_sync`` (DDP's) skips the gradient all-reduce on every
    micro-batch but the last; ``grads`` (flat gradients) are all-reduced once, after the last.

    With ``cuda_graphs`` on a GPU, the first ``GRAPH_WARMUP`` calls run eagerly on a side stream
    (they are real steps), the next captures the whole step — every micro-batch and the optimizer —
    as one CUDA graph, and every call from then on copies its inputs into the graph's static
    buffers and replays it. A call of another input shape releases the graph and starts again: warm-up
    steps, then a capture of the new shape (a curriculum's patches, then whole volumes). A capture needs
    every autograd node alive from earlier steps to belong to no stream but its own: the trainer's EMA
    copies run without autograd for that reason. The returned loss tensor is then the graph's own: read or copy it
    before the next call.
    """

    def __init__(self, diffusion: GaussianDiffusion, optimizer: torch.optim.Optimizer, knobs: Knobs,
                 device: torch.device, no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
                 grads: FlatGrads | None = None) -> None:
        self.diffusion, self.optimizer, self.knobs, self.device = diffusion, optimizer, knobs, device
        self.no_sync, self.grads = no_sync, grads
        self.loss_weights: Tensor | None = None  # per-timestep loss weights on the device (Min-SNR-γ), None = unweighted
        self.graphed = knobs.cuda_graphs and device.type == "cuda"
        # each backward writes gradients of its own (FlatGrads on several ranks, graph_owned_grads on
        # one): .grad is None between steps, never a static buffer added into
        self.fresh_grads = grads is not None or knobs.graph_owned_grads
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: list[Tensor] = []
        self.static_loss: Tensor | None = None

    def _run(self, images: Sequence[Tensor], masks: Sequence[Tensor], draws: Sequence[Draw] | None,
             mark: Callable[[], Any] | None, marks: list[Any], capturing: bool = False) -> Tensor:
        n = len(images)
        scale = 1.0 / n
        total = torch.zeros((), device=self.device)
        for k, (image, mask) in enumerate(zip(images, masks)):
            t, noise = draws[k] if draws is not None else (None, None)
            sync = self.no_sync is None or k == n - 1
            if self.grads is not None and k == n - 1:
                self.grads.arm()  # this backward starts the buckets' all-reduces as they complete
            with contextlib.nullcontext() if sync else self.no_sync():
                with nvtx("forward"), autocast(self.knobs, self.device):
                    loss = self.diffusion.loss(image, mask, t, noise, self.loss_weights)
                if mark is not None and k == 0:
                    marks.append(mark())
                with nvtx("backward"):
                    (loss * scale).backward()
            total += loss.detach() * scale
        if self.grads is not None:
            with nvtx("all_reduce"):
                self.grads.finish()
        with nvtx("optimizer"):
            self.optimizer.step()
            if self.fresh_grads:
                if not capturing:  # None before the capture; inside it, each replay writes them anew
                    self.optimizer.zero_grad(set_to_none=True)
            else:
                self.optimizer.zero_grad(set_to_none=not self.graphed)  # graphs keep static .grad buffers
        return total

    def __call__(self, images: Sequence[Tensor], masks: Sequence[Tensor],
                 mark: Callable[[], Any] | None = None,
                 draws: Sequence[Draw] | None = None) -> tuple[Tensor, list[Any]]:
        """Run one step on ``len(images)`` micro-batches; ``mark()`` (a timer) is called at the
        start, after the first forward + loss (None when that moment is inside a graph) and at
        the end. Returns (mean loss, marks)."""
        if len(images) != len(masks) or not images or (draws is not None and len(draws) != len(images)):
            raise ValueError("a step needs as many masks (and draws) as images, and at least one of each")
        marks: list[Any] = []
        with nvtx("train_step"):
            if mark is not None:
                marks.append(mark())
            if self.graph is not None and [t.shape for t in images] != [t.shape for t in self.static[:len(images)]]:
                self.release()  # a new input shape (a curriculum's whole volumes after its patches): captured anew
            if not self.graphed:
                loss = self._run(images, masks, draws, mark, marks)
            elif self.graph is None and self.calls < GRAPH_WARMUP:
                loss = self._warmup(images, masks, draws, mark, marks)
            else:
                loss = self._replay(images, masks, draws, mark, marks)
            if mark is not None:
                marks.append(mark())
        self.calls += 1
        return loss, marks

    def release(self) -> None:
        """Free the captured step. A graph that holds an NCCL all-reduce keeps the communicator
        busy: release it before the process group is destroyed, or that waits for ever."""
        if self.graph is not None:
            torch.cuda.synchronize(self.device)
            self.graph.reset()
            self.graph, self.static, self.static_loss = None, [], None
            self.calls = 0
            if self.fresh_grads:  # the last replay's gradients: the next eager step starts clean
                self.optimizer.zero_grad(set_to_none=True)

    def _warmup(self, images, masks, draws, mark, marks) -> Tensor:
        with side_stream(self.device):
            return self._run(images, masks, draws, mark, marks)

    def _replay(self, images, masks, draws, mark, marks) -> Tensor:
        flat = [x for d in draws for x in d] if draws is not None else []
        inputs = [*images, *masks, *flat]
        if self.graph is None:
            self.static = [t.detach().clone() for t in inputs]
            n = len(images)
            static_draws = list(zip(self.static[2 * n::2], self.static[2 * n + 1::2])) if draws is not None else None
            self.graph = torch.cuda.CUDAGraph()
            # with flat gradients the step holds an NCCL all-reduce: capture after every earlier
            # collective has finished, and let other threads (the process group's watchdog) keep
            # making CUDA calls during the capture ("thread_local")
            mode = "global"
            if self.grads is not None:
                torch.cuda.synchronize(self.device)
                mode = "thread_local"
            with torch.cuda.graph(self.graph, capture_error_mode=mode):
                self.static_loss = self._run(self.static[:n], self.static[n:2 * n], static_draws, None, [],
                                             capturing=True)
        for dst, src in zip(self.static, inputs):
            dst.copy_(src, non_blocking=True)
        if mark is not None:
            marks.append(None)
        self.graph.replay()
        assert self.static_loss is not None
        return self.static_loss
