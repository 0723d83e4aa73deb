"""FP8 (E4M3) forward convolutions, through cuDNN's graph API: for the sampler (issue 20, lever 4),
and for training's forward pass (issue 40, lever 1: ``Fp8ForwardConv3d``).

A denoising step spends most of its time in the finest level's 3³ convolutions (64 output
channels at 128³, ``data/results/h200/sampling/denoise_kernels_ddpm.csv``). On Hopper, cuDNN runs
them faster with E4M3 operands and fp32 accumulation. Sampling only: nothing here has a backward.

- Activations are cast to E4M3 unscaled (E4M3 is a float: its relative step, 2⁻³, is the same
  from 2⁻⁶ to 448), saturating at ±448. The norm and upsampling kernels that produce a
  convolution's input write it in E4M3 directly (``kernels``), so no extra pass reads it.
- Weights are scaled per output channel so that each channel's largest magnitude is 448
  (``quantize_weight``), once, when the sampler freezes the model; the convolution's fp32 sums
  are multiplied by the per-channel descale inside cuDNN's epilogue and written in bf16.

``conv3d_fp8`` is the one entry: cuDNN on a CUDA device (``nvidia-cudnn-frontend``), else
``reference_conv3d_fp8`` (the same E4M3 operands, dequantized, through ``F.conv3d`` in fp32), which
the tests compare it with.

In training (``Knobs.fp8_train_convs``) the forward convolution runs the same way, with the weight
quantized at every step (its per-channel scales from its current values: no history to keep), and
the backward pass stays in bf16: data and weight gradients of the bf16 operands the forward
quantized, cuDNN's ``convolution_backward``. That is the forward half of the FP8 training recipe of
Micikevicius et al., "FP8 Formats for Deep Learning" (2022: E4M3 forward, gradients in E5M2); the
gradients keep bf16 here, so only the forward's rounding changes.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # the largest finite E4M3 value
MAX_OUT_CHANNELS = 64  # the widest output FP8 pays at: on an H200, 3³ convolutions to 64 channels run 1.13–1.52× faster in FP8, 128 → 128 at 64³ not at all (scripts/probes/fp8_conv_probe.py, data/results/h200/sampling/fp8_convs.csv)


def quantize_activation(x: Tensor) -> Tensor:
    """``x`` in E4M3, unscaled, saturated at ±448, layout kept."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def quantize_weight(weight: Tensor, per_channel: bool = True) -> tuple[Tensor, Tensor]:
    """(E4M3 weight, channels-last; fp32 per-output-channel descale): ``weight[k] ≈ q[k] · descale[k]``,
    each output channel's largest magnitude mapped to 448 (an all-zero channel gets descale 1);
    ``per_channel=False``: one descale (shape (1,)) for the whole weight."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=tuple(range(1, w.ndim))) if per_channel else w.abs().amax().view(1)
    descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (w / descale.view(-1, *[1] * (w.ndim - 1))).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q.contiguous(memory_format=torch.channels_last_3d), descale.contiguous()


def dequantize_weight(q: Tensor, descale: Tensor) -> Tensor:
    """The fp32 weight an E4M3 weight and its descale stand for."""
    return q.float() * descale.view(-1, *[1] * (q.ndim - 1))


def reference_conv3d_fp8(x: Tensor, q: Tensor, descale: Tensor, padding: int) -> Tensor:
    """The maths of ``conv3d_fp8``: the E4M3 operands dequantized, convolved in fp32, returned in
    bf16 channels-last."""
    with torch.autocast(x.device.type, enabled=False):  # fp32, as said, also inside a bf16 autocast region
        y = F.conv3d(x.float(), dequantize_weight(q, descale), padding=padding)
    return y.to(torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)


def _out_shape(x_shape: tuple[int, ...], cout: int, kernel: int, padding: int) -> tuple[int, ...]:
    """(N, cout, *sides) of a stride-1 convolution of an (N, C, *sides) input."""
    n, _, *sides = x_shape
    return (n, cout, *[s + 2 * padding - kernel + 1 for s in sides])


def check_operands(x: Tensor, q: Tensor, descale: Tensor) -> None:
    """One clear error for operands ``conv3d_fp8`` cannot take."""
    if x.dtype != E4M3 or q.dtype != E4M3:
        raise ValueError(f"conv3d_fp8 takes E4M3 input and weight, got {x.dtype} and {q.dtype}")
    if x.ndim != 5 or q.ndim != 5 or x.shape[1] != q.shape[1]:
        raise ValueError(f"conv3d_fp8: input (N, C, D, H, W) and weight (K, C, T, R, S) must share C, "
                         f"got {tuple(x.shape)} and {tuple(q.shape)}")
    if tuple(descale.shape) != (q.shape[0],) or descale.dtype != torch.float32:
        raise ValueError(f"conv3d_fp8: descale must be fp32 of shape ({q.shape[0]},), "
                         f"got {descale.dtype} {tuple(descale.shape)}")


def conv3d_fp8(x: Tensor, q: Tensor, descale: Tensor, padding: int = 1) -> Tensor:
    """bf16 (N, K, D', H', W') = conv3d(x, q · descale): E4M3 input ``x`` (N, C, D, H, W) and weight
    ``q`` (K, C, T, R, S), fp32 ``descale`` (K,); stride 1, no bias."""
    check_operands(x, q, descale)
    return torch.ops.medddpm.conv3d_fp8(x, q, descale, padding)


@torch.library.custom_op("medddpm::conv3d_fp8", mutates_args=())
def _conv3d_fp8(x: Tensor, q: Tensor, descale: Tensor, padding: int) -> Tensor:
    if x.device.type != "cuda":
        return reference_conv3d_fp8(x, q, descale, padding)
    x = x.contiguous(memory_format=torch.channels_last_3d)
    conv = _plan(tuple(x.shape), tuple(q.shape), padding, x.device)
    return conv(x, q.contiguous(memory_format=torch.channels_last_3d), descale)


@_conv3d_fp8.register_fake
def _(x, q, descale, padding):
    return torch.empty(_out_shape(tuple(x.shape), q.shape[0], q.shape[2], padding), device=x.device, dtype=torch.bfloat16,
                       memory_format=torch.channels_last_3d)


@functools.lru_cache(maxsize=None)
def _plan(x_shape: tuple[int, ...], q_shape: tuple[int, ...], padding: int, device: torch.device) -> "Fp8Conv":
    conv = Fp8Conv(x_shape, q_shape[0], padding, device, kernel=q_shape[2])
    conv.autotune()
    return conv


@functools.lru_cache(maxsize=None)
def _handle(device: torch.device):
    import cudnn  # nvidia-cudnn-frontend, imported only where a GPU runs it

    with torch.cuda.device(device):
        return cudnn.create_handle()


def _channels_last_strides(shape: tuple[int, ...]) -> list[int]:
    """Strides of an (N, C, *spatial) tensor stored channels-last, in (N, C, *spatial) order."""
    c, sides = shape[1], shape[2:]
    inner = [c]  # the last spatial axis steps over C elements, each one before it over all after it
    for s in reversed(sides[1:]):
        inner.insert(0, inner[0] * s)
    return [inner[0] * sides[0], 1, *inner]


class Fp8Conv:
    """One cuDNN graph for one input shape: conv_fprop(E4M3 x, E4M3 w) in fp32, × descale (K,), → bf16,
    all tensors channels-last. ``plan_count`` execution plans are built; ``autotune`` keeps the fastest."""

    def __init__(self, x_shape: tuple[int, ...], cout: int, padding: int, device: torch.device,
                 kernel: int = 3, per_channel: bool = True) -> None:
        import cudnn

        self.device = device
        sides = x_shape[2:]
        self.y_shape = _out_shape(x_shape, cout, kernel, padding)
        w_shape = (cout, x_shape[1], *[kernel] * len(sides))
        self.x_shape, self.w_shape = tuple(x_shape), w_shape
        g = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=_handle(device))
        self.x = g.tensor(name="x", dim=list(x_shape), stride=_channels_last_strides(x_shape),
                          data_type=cudnn.data_type.FP8_E4M3)
        self.w = g.tensor(name="w", dim=list(w_shape), stride=_channels_last_strides(w_shape),
                          data_type=cudnn.data_type.FP8_E4M3)
        ones = [1] * (len(sides) + 2)
        scale_dim = [1, cout if per_channel else 1, *[1] * len(sides)]
        self.s = g.tensor(name="descale", dim=scale_dim, stride=_channels_last_strides(tuple(scale_dim)),
                          data_type=cudnn.data_type.FLOAT)
        acc = g.conv_fprop(image=self.x, weight=self.w, padding=[padding] * len(sides), stride=ones[2:],
                           dilation=ones[2:], compute_data_type=cudnn.data_type.FLOAT)
        acc.set_data_type(cudnn.data_type.FLOAT)
        self.y = g.scale(input=acc, scale=self.s, compute_data_type=cudnn.data_type.FLOAT)
        self.y.set_output(True).set_data_type(cudnn.data_type.BFLOAT16).set_dim(list(self.y_shape)) \
            .set_stride(_channels_last_strides(self.y_shape))
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.B, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans(cudnn.build_plan_policy.ALL)
        self.graph, self.plan = g, 0
        self.plan_count = g.get_execution_plan_count()
        self.workspace = torch.empty(max(g.get_workspace_size_plan_at_index(i) for i in range(self.plan_count)),
                                     device=device, dtype=torch.uint8)

    def plan_name(self, index: int) -> str:
        return self.graph.get_plan_name_at_index(index)

    def use_plan(self, index: int) -> None:
        self.plan = index

    def __call__(self, x: Tensor, q: Tensor, descale: Tensor) -> Tensor:
        import cudnn

        y = torch.empty(self.y_shape, device=self.device, dtype=torch.bfloat16, memory_format=torch.channels_last_3d)
        handle = _handle(self.device)
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(self.device).cuda_stream)
        self.graph.execute_plan_at_index({self.x: x, self.w: q, self.s: descale, self.y: y}, self.workspace,
                                         self.plan, handle=handle)
        return y

    def autotune(self, reps: int = 5) -> None:
        """Keep the fastest plan that runs, timed on zero operands."""
        x = torch.zeros(self.x_shape, device=self.device, dtype=E4M3).contiguous(memory_format=torch.channels_last_3d)
        q = torch.zeros(self.w_shape, device=self.device, dtype=E4M3).contiguous(memory_format=torch.channels_last_3d)
        s = torch.ones(self.y_shape[1], device=self.device)
        best = (float("inf"), 0)
        for index in range(self.plan_count):
            self.use_plan(index)
            try:
                self(x, q, s)
                torch.cuda.synchronize(self.device)
            except Exception:  # a plan cuDNN built but cannot run here is skipped
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                self(x, q, s)
            end.record()
            end.synchronize()
            best = min(best, (start.elapsed_time(end), index))
        self.use_plan(best[1])


def _twin(cls: type[torch.nn.Conv3d], conv: torch.nn.Conv3d) -> torch.nn.Conv3d:
    """A ``cls`` convolution with ``conv``'s shape and its very parameters (no new memory), for a
    stride-1, one-group, evenly padded ``conv``: what both FP8 convolutions take."""
    if conv.stride != (1, 1, 1) or conv.dilation != (1, 1, 1) or conv.groups != 1 \
            or len(set(conv.padding)) != 1 or isinstance(conv.padding, str):
        raise ValueError(f"an FP8 convolution is stride 1, dilation 1, one group and even padding; got {conv}")
    new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, padding=conv.padding,
              bias=conv.bias is not None, device="meta")
    new.weight, new.bias = conv.weight, conv.bias
    return new


class Fp8Conv3d(torch.nn.Conv3d):
    """A stride-1 3³ ``nn.Conv3d`` whose forward runs ``conv3d_fp8`` on its E4M3 input (a bf16 input
    is quantized first), with the E4M3 weight and descale frozen from its parameters
    (``quantize_weight``) when it is made. Its parameters stay as they were (the state dict does
    not change); a later change of them is not seen. Sampling only (no backward)."""

    @classmethod
    def frozen(cls, conv: torch.nn.Conv3d) -> "Fp8Conv3d":
        """The FP8 twin of ``conv`` (sharing its parameters)."""
        new = _twin(cls, conv)
        q, descale = quantize_weight(conv.weight)
        new.register_buffer("q", q, persistent=False)
        new.register_buffer("descale", descale, persistent=False)
        return new

    def _conv_forward(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """``nn.Conv3d``'s convolution (``forward`` calls it with the module's weight and bias; a
        caller that folds the bias elsewhere passes None) in FP8: ``weight`` is the frozen E4M3 one."""
        x = x if x.dtype == E4M3 else quantize_activation(x)
        y = conv3d_fp8(x, self.q, self.descale, self.padding[0])
        return y if bias is None else y + bias.to(y.dtype).view(1, -1, 1, 1, 1)


def available(device: torch.device) -> str | None:
    """None when ``conv3d_fp8`` runs on ``device``, else why not (one sentence)."""
    if device.type != "cuda":
        return None  # the reference runs on a CPU
    if torch.cuda.get_device_capability(device) < (8, 9):
        return f"FP8 convolutions need compute capability 8.9 or newer; {torch.cuda.get_device_name(device)} has " \
               f"{'.'.join(map(str, torch.cuda.get_device_capability(device)))}"
    try:
        import cudnn  # noqa: F401
    except ImportError:
        return "FP8 convolutions run through cuDNN's graph API: pip install nvidia-cudnn-frontend"
    return None


class _Fp8Forward(torch.autograd.Function):
    """conv3d(x, w) with an FP8 forward (``conv3d_fp8`` of E4M3 x and per-channel E4M3 w) and the
    bf16 backward of the unquantized operands (stride 1, one group, no bias)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, padding: int, x8: Tensor | None) -> Tensor:
        q, descale = quantize_weight(weight)
        ctx.save_for_backward(x, weight)
        ctx.padding = padding
        return conv3d_fp8(quantize_activation(x) if x8 is None else x8, q, descale, padding)

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        x, weight = ctx.saved_tensors
        p = ctx.padding
        dx, dw, _ = torch.ops.aten.convolution_backward(
            dy.to(weight.dtype), x, weight, None, [1] * (x.ndim - 2), [p] * (x.ndim - 2), [1] * (x.ndim - 2),
            False, [0] * (x.ndim - 2), 1, [ctx.needs_input_grad[0], ctx.needs_input_grad[1], False])
        return dx, dw, None, None


def conv3d_fp8_forward(x: Tensor, weight: Tensor, padding: int = 1, x8: Tensor | None = None) -> Tensor:
    """A training convolution (stride 1, no bias) whose forward runs in FP8 and whose gradients are
    bf16: ``x`` and ``weight`` in bf16 (autocast's cast of the fp32 weight, so the weight's
    gradient goes back through that cast), the output bf16 channels-last. ``x8``: ``x`` already in
    E4M3 (written by the norm that wrote ``x``, ``kernels.group_norm_silu_dual``), else quantized here."""
    if x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16:
        raise ValueError(f"conv3d_fp8_forward takes bf16 input and weight, got {x.dtype} and {weight.dtype}")
    if x8 is not None and (x8.dtype != E4M3 or x8.shape != x.shape):
        raise ValueError(f"conv3d_fp8_forward: x8 must be x in E4M3, got {x8.dtype} {tuple(x8.shape)}")
    return _Fp8Forward.apply(x, weight, padding, x8)


class Fp8ForwardConv3d(torch.nn.Conv3d):
    """A stride-1 3³ ``nn.Conv3d`` for training whose forward convolution runs in FP8
    (``conv3d_fp8_forward``: the weight quantized at every call, the input quantized unscaled) and
    whose backward is bf16; its bias is added in bf16 after it. Its parameters are the original
    convolution's (the state dict does not change)."""

    @classmethod
    def sharing(cls, conv: torch.nn.Conv3d) -> "Fp8ForwardConv3d":
        """The FP8-forward twin of ``conv`` (the same parameter objects)."""
        return _twin(cls, conv)

    def forward(self, x: Tensor, x8: Tensor | None = None) -> Tensor:
        """The convolution with its bias; ``x8``: the input's E4M3 copy, if its producer wrote one."""
        return self._conv_forward(x, self.weight, self.bias, x8)

    def _conv_forward(self, x: Tensor, weight: Tensor, bias: Tensor | None, x8: Tensor | None = None) -> Tensor:
        """``nn.Conv3d``'s convolution (a caller that folds the bias elsewhere passes None), the
        operands in bf16 as autocast would cast them; ``x8``: the input's E4M3 copy, if its producer wrote one."""
        y = conv3d_fp8_forward(x.to(torch.bfloat16), weight.to(torch.bfloat16), self.padding[0], x8)
        return y if bias is None else y + bias.to(y.dtype).view(1, -1, 1, 1, 1)
