"""The Med-DDPM denoiser: a guided-diffusion style 3D U-Net (paper §2.1, Fig. 3).

Written for this project from the architecture's published description: encoder blocks of
ResBlocks (+ attention at the configured downsample factors) and stride-2 convolutions, a
bottleneck ResBlock-attention-ResBlock, a decoder with skip concatenation and trilinear ×2
upsampling + conv, and a zero-initialized output convolution. Input is the noisy volume
concatenated with the one-hot mask; output is the predicted noise ε.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..core.config import FP8_CONV_SETS, ModelConfig
from . import kernels
from .fp8 import MAX_OUT_CHANNELS, Fp8Conv3d, Fp8ForwardConv3d, quantize_activation
from .ndhwc import group_norm_silu, per_channel, upsample2x
from .residual import residual_add


def timestep_embedding(t: Tensor, dim: int, max_period: float = 1000.0) -> Tensor:
    """Sinusoidal embedding [cos | sin] of (possibly fractional) timesteps, shape (N, dim)."""
    half = dim // 2
    exponent = torch.arange(half, dtype=torch.float32, device=t.device) / half
    freqs = torch.exp(-math.log(max_period) * exponent)
    angles = t.float()[:, None] * freqs[None, :]
    emb = torch.cat([angles.cos(), angles.sin()], dim=1)
    return F.pad(emb, (0, dim % 2))


class GroupNorm(nn.GroupNorm):
    """GroupNorm that optionally computes in fp32 and casts back (the reference's GroupNorm32).

    With ``fused`` it runs ``ndhwc.group_norm_silu`` instead (always fp32 statistics, layout kept),
    applying the SiLU that follows it when ``silu`` is set; with ``triton`` as well, the Triton
    kernels of ``medddpm.net.kernels`` (the same maths at minimal bytes), which also take the ``add``
    that a ResBlock adds to the norm's input. The parameters are the same in every case.
    """

    def __init__(self, groups: int, channels: int, fp32: bool, fused: bool = False, silu: bool = False,
                 triton: bool = False) -> None:
        super().__init__(groups, channels)
        if triton and not fused:
            raise ValueError("the Triton GroupNorm kernels are the fused (NDHWC) path: triton needs fused")
        self.fp32, self.fused, self.silu, self.triton = fp32, fused, silu, triton
        self.fp8 = False  # output in E4M3, for an FP8 convolution after it (UNet3D.use_fp8_convs)

    def forward(self, x: Tensor, add: Tensor | None = None) -> Tensor:
        """GroupNorm(x + add)(+SiLU); ``add`` is (N, C), broadcast over the voxels."""
        if self.triton:
            return kernels.group_norm_silu(x, self.num_groups, self.weight, self.bias, self.eps, self.silu, add,
                                           self.fp8)
        y = self._norm(x, add)
        return quantize_activation(y) if self.fp8 else y

    def forward_dual(self, x: Tensor, add: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(the fused Triton norm's output, its E4M3 copy written in the same pass) for an FP8-forward
        convolution after it (``kernels.group_norm_silu_dual``)."""
        if not self.triton:
            raise ValueError("forward_dual is the Triton norm's: triton needs to be on")
        return kernels.group_norm_silu_dual(x, self.num_groups, self.weight, self.bias, self.eps, self.silu, add)

    def forward_cat(self, h: Tensor, skip: Tensor, dual: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
        """(cat([h, skip]), the fused Triton norm's output of it, its E4M3 copy with ``dual``), the
        concatenation's gradients written by the norm's backward (``kernels.group_norm_silu_cat``)."""
        if not self.triton:
            raise ValueError("forward_cat is the Triton norm's: triton needs to be on")
        return kernels.group_norm_silu_cat(h, skip, self.num_groups, self.weight, self.bias, self.eps, self.silu, dual)

    def _norm(self, x: Tensor, add: Tensor | None) -> Tensor:
        if add is not None:
            x = x + per_channel(add.to(x.dtype), x)
        if self.fused:
            return group_norm_silu(x, self.num_groups, self.weight, self.bias, self.eps, self.silu)
        if not self.fp32:
            return super().forward(x)
        w, b = self.weight.float(), self.bias.float()
        return F.group_norm(x.float(), self.num_groups, w, b, self.eps).to(x.dtype)


def norm_act(cfg: ModelConfig, channels: int, fused: bool, triton: bool = False) -> list[nn.Module]:
    """GroupNorm then SiLU as two modules (indices 0 and 1 of a Sequential, so state-dict keys do
    not depend on ``fused``); fused, the norm applies the SiLU and the second module is Identity."""
    return [GroupNorm(cfg.num_groups, channels, cfg.norm_fp32, fused, silu=fused, triton=triton),
            nn.Identity() if fused else nn.SiLU()]


def zeroed(module: nn.Module) -> nn.Module:
    """Initialise a module's parameters to zero (residual branches start as identity)."""
    for p in module.parameters():
        nn.init.zeros_(p)
    return module


class ResBlock(nn.Module):
    """GroupNorm-SiLU-Conv, + timestep embedding, GroupNorm-SiLU-Dropout-Conv(0), + skip (Fig. 3 ④).

    With ``triton`` the embedding is added inside the second GroupNorm's kernels (in fp32, never
    written out as its own tensor). ``fold_bias`` runs the first convolution without its bias and
    adds the bias there too, with the embedding (both are per channel): the same sum, one rounding
    fewer, and no kernel of its own that reads and writes the convolution's output. ``fused_residual``
    (sampling) likewise runs the second convolution and the 1×1 skip convolution without their
    biases, which ``residual.residual_add`` adds with the skip term as it writes the block's output."""

    def __init__(self, cin: int, cout: int, emb_dim: int, cfg: ModelConfig, fused: bool = False,
                 triton: bool = False, fold_bias: bool = False, fused_residual: bool = False) -> None:
        super().__init__()
        self.fold_bias, self.fused_residual = fold_bias, fused_residual
        self.table_cols: tuple[int, int] | None = None  # its columns of UNet3D's timestep table, once frozen
        self.in_layers = nn.Sequential(*norm_act(cfg, cin, fused, triton), nn.Conv3d(cin, cout, 3, padding=1))
        self.emb_layers = nn.Sequential(nn.SiLU(), nn.Linear(emb_dim, cout))
        self.out_layers = nn.Sequential(
            *norm_act(cfg, cout, fused, triton),
            nn.Dropout(cfg.dropout),
            zeroed(nn.Conv3d(cout, cout, 3, padding=1)),
        )
        self.skip = nn.Identity() if cin == cout else nn.Conv3d(cin, cout, 1)

    def addend(self, emb: Tensor) -> Tensor:
        """The per-channel term added before the second norm: the embedding's projection (and,
        with ``fold_bias``, the first convolution's bias), (N, cout)."""
        add = self.emb_layers(emb)
        return add + self.in_layers[-1].bias if self.fold_bias else add

    def forward(self, x: Tensor, emb: Tensor, skip: Tensor | None = None) -> Tensor:
        """``emb`` is the timestep embedding, or, once UNet3D's timestep table is frozen, the table's
        rows at t (every ResBlock's addend, this block's in ``table_cols``). A decoder block given
        the encoder's ``skip`` concatenates it to ``x`` itself (``UNet3D.fused_skip_grads``)."""
        add = self.addend(emb) if self.table_cols is None else emb[:, self.table_cols[0]:self.table_cols[1]]
        if skip is None:
            h = self._stack(self.in_layers, x, None, bias=not self.fold_bias)  # fold_bias: the bias joins the next norm
        else:
            x, h = self._cat_stack(x, skip, bias=not self.fold_bias)  # x is now the concatenation
        h = self._stack(self.out_layers, h, add, bias=not self.fused_residual)
        if not self.fused_residual:
            return self.skip(x) + h
        conv = self.out_layers[-1]  # fused_residual: its bias, the skip term and that term's bias added at once
        if isinstance(self.skip, nn.Identity):
            return residual_add(h, conv.bias, x)
        return residual_add(h, conv.bias, _conv(self.skip, x, bias=False), self.skip.bias)

    @staticmethod
    def _stack(layers: nn.Sequential, x: Tensor, add: Tensor | None, bias: bool) -> Tensor:
        """GroupNorm(x + add), its activation (and dropout), then the convolution, with its bias only
        where ``bias``. An FP8-forward convolution after a fused Triton norm takes the E4M3 copy of
        its input that the norm writes beside it (``GroupNorm.forward_dual``)."""
        norm, *mid, conv = layers
        if _takes_e4m3(layers):
            return _conv(conv, *norm.forward_dual(x, add), bias=bias)
        h = norm(x, add=add)
        for layer in mid:
            h = layer(h)
        return _conv(conv, h, bias=bias)

    def _cat_stack(self, x: Tensor, skip: Tensor, bias: bool) -> tuple[Tensor, Tensor]:
        """(cat([x, skip]), the first stack's output of it): the Triton norm concatenates, and its
        backward writes both inputs' gradients, the skip convolution's share added
        (``GroupNorm.forward_cat``)."""
        norm, *_, conv = self.in_layers  # between them only an Identity: the fused norm applies the SiLU
        c, h, h8 = norm.forward_cat(x, skip, dual=_takes_e4m3(self.in_layers))
        return c, _conv(conv, h, h8, bias=bias)


def _takes_e4m3(layers: nn.Sequential) -> bool:
    """True where a stack's convolution runs its forward in FP8 and its fused Triton norm can write
    the E4M3 input beside its output (no active dropout between them)."""
    norm, *mid, conv = layers
    return isinstance(conv, Fp8ForwardConv3d) and norm.triton and norm.silu and \
        not any(isinstance(m, nn.Dropout) and m.p > 0 and m.training for m in mid)


def _conv(conv: nn.Module, h: Tensor, h8: Tensor | None = None, bias: bool = True) -> Tensor:
    """``conv(h)``, called as a module (hooks see it), or without its bias unless ``bias``; an
    FP8-forward convolution also takes h's E4M3 copy ``h8``."""
    e4m3 = () if h8 is None else (h8,)
    return conv(h, *e4m3) if bias else conv._conv_forward(h, conv.weight, None, *e4m3)


class Attention(nn.Module):
    """Spatial self-attention over all voxels, legacy head-first qkv split, 1×1 conv projections.

    With ``sdpa`` the same maths runs on a (N, voxels, C) view through
    ``F.scaled_dot_product_attention`` (flash/efficient kernels on a GPU); the parameters are the
    same, so checkpoints move freely between the two paths.
    """

    def __init__(self, channels: int, cfg: ModelConfig, checkpointed: bool, fused: bool = False,
                 sdpa: bool = False, triton: bool = False) -> None:
        super().__init__()
        self.heads = cfg.num_heads
        self.checkpointed = checkpointed
        self.sdpa = sdpa
        self.norm = GroupNorm(cfg.num_groups, channels, cfg.norm_fp32, fused, triton=triton)
        self.qkv = nn.Conv1d(channels, 3 * channels, 1)
        self.proj_out = zeroed(nn.Conv1d(channels, channels, 1))

    def forward(self, x: Tensor, emb: Tensor | None = None) -> Tensor:
        if self.checkpointed and torch.is_grad_enabled():
            return checkpoint(self._attend, x, use_reentrant=False)
        return self._attend(x)

    def _attend(self, x: Tensor) -> Tensor:
        if self.sdpa:
            return self._attend_sdpa(x)
        b, c, *spatial = x.shape
        flat = x.reshape(b, c, -1)
        qkv = self.qkv(self.norm(flat))
        n = flat.shape[-1]
        per_head = c // self.heads
        # legacy order: heads first, then (q, k, v) inside each head
        q, k, v = qkv.reshape(b * self.heads, 3 * per_head, n).split(per_head, dim=1)
        scale = per_head ** -0.25  # applied to q and k separately: steadier in low precision
        logits = torch.einsum("bct,bcs->bts", q * scale, k * scale)
        weights = logits.float().softmax(dim=-1).to(logits.dtype)
        out = torch.einsum("bts,bcs->bct", weights, v).reshape(b, c, n)
        return (flat + self.proj_out(out)).reshape(b, c, *spatial)

    def _attend_sdpa(self, x: Tensor) -> Tensor:
        b, c, *spatial = x.shape
        tokens = self.norm(x).flatten(2).transpose(1, 2)  # (N, S, C); a free view for NDHWC storage
        qkv = F.linear(tokens, self.qkv.weight[..., 0], self.qkv.bias)
        per_head = c // self.heads
        # legacy order: heads first, then (q, k, v) inside each head → (3, N, heads, S, per_head)
        qkv = qkv.unflatten(-1, (self.heads, 3, per_head)).permute(3, 0, 2, 1, 4)
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])  # softmax(qkᵀ/√d) v
        out = out.transpose(1, 2).flatten(2)  # (N, S, C), channel = head · per_head + d
        out = F.linear(out, self.proj_out.weight[..., 0], self.proj_out.bias)
        return x + out.transpose(1, 2).unflatten(2, spatial)


class Downsample(nn.Module):
    """Stride-2 3×3×3 convolution."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.op = nn.Conv3d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x: Tensor, emb: Tensor | None = None) -> Tensor:
        return self.op(x)


class Upsample(nn.Module):
    """Trilinear ×2 interpolation followed by a 3×3×3 convolution; ``fused`` keeps the layout
    (``ndhwc.upsample2x``), ``triton`` as well runs it as one Triton kernel (``kernels.upsample2x``)."""

    def __init__(self, channels: int, fused: bool = False, triton: bool = False) -> None:
        super().__init__()
        if triton and not fused:
            raise ValueError("the Triton upsampling kernel is the fused (NDHWC) path: triton needs fused")
        self.fused, self.triton = fused, triton
        self.conv = nn.Conv3d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor, emb: Tensor | None = None) -> Tensor:
        fp8 = isinstance(self.conv, Fp8Conv3d)  # its input written in E4M3 by the upsampling itself
        if self.triton:
            return self.conv(kernels.upsample2x(x, fp8))
        if self.fused:
            return self.conv(upsample2x(x))
        d, h, w = x.shape[2:]
        return self.conv(F.interpolate(x, size=(2 * d, 2 * h, 2 * w), mode="trilinear"))


class Block(nn.ModuleList):
    """A sequence of layers that all receive the timestep embedding."""

    def forward(self, x: Tensor, emb: Tensor, skip: Tensor | None = None) -> Tensor:  # type: ignore[override]
        """``skip``: the encoder's tensor the first layer (a decoder ResBlock) concatenates to ``x``."""
        first, *rest = self
        x = first(x, emb) if skip is None else first(x, emb, skip)
        for layer in rest:
            x = layer(x, emb)
        return x


def round_up(c: int, multiple: int) -> int:
    return -(-c // multiple) * multiple


def padded_params(weight: Tensor, bias: Tensor | None, multiple: int) -> tuple[Tensor, Tensor | None]:
    """A convolution's weight and bias with zero input columns and zero output rows appended up to
    multiples of ``multiple`` channels (gradients reach the originals through the padding)."""
    cout, cin = weight.shape[:2]
    extra_out = round_up(cout, multiple) - cout
    weight = F.pad(weight, (0, 0, 0, 0, 0, 0, 0, round_up(cin, multiple) - cin, 0, extra_out))
    return weight, None if bias is None else F.pad(bias, (0, extra_out))


class ThinConv3d(nn.Conv3d):
    """The model's thin convolutions: the stem sees 3 channels, the output convolution writes 1,
    and cuDNN runs both with its small-channel kernels. Two fast paths, the same sums:

    - ``pad_to`` > 0: input and output channels zero-padded to multiples of ``pad_to`` (zero input
      channels meet zero weight columns, the extra outputs are dropped), so cuDNN takes its regular
      kernels. Training pads the weights at every call; ``freeze_padding`` (sampling) pads them
      once, into buffers kept in the weight's layout.
    - ``triton``: ``kernels.conv3d_thin``, each pass at the bytes of its wide side (in autocast's
      dtype where autocast is on, as ``F.conv3d`` would run), for an NDHWC input (the engine hands
      the denoiser its input in the model's layout); for an NCDHW one ``conv3d_thin`` runs
      ``F.conv3d`` (cuDNN).

    The parameters and state-dict keys stay the model's."""

    pad_to: int = 0  # channel multiple (0 = no padding)
    triton: bool = False  # through kernels.conv3d_thin where it runs

    def freeze_padding(self) -> None:
        with torch.no_grad():
            weight, bias = padded_params(self.weight, self.bias, self.pad_to)
        fmt = torch.contiguous_format if self.weight.is_contiguous() else torch.channels_last_3d
        self.register_buffer("padded_weight", weight.contiguous(memory_format=fmt), persistent=False)
        self.register_buffer("padded_bias", bias, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.triton:
            return self._triton(x)
        if not self.pad_to:
            return super().forward(x)
        if hasattr(self, "padded_weight"):
            weight, bias = self.padded_weight, self.padded_bias
        else:
            weight, bias = padded_params(self.weight, self.bias, self.pad_to)
        extra_in = weight.shape[1] - x.shape[1]
        if extra_in:
            x = F.pad(x, (0, 0, 0, 0, 0, 0, 0, extra_in))
        y = F.conv3d(x, weight, bias, self.stride, self.padding, self.dilation, self.groups)
        return y[:, :self.out_channels] if weight.shape[0] > self.out_channels else y

    def _triton(self, x: Tensor) -> Tensor:
        """The convolution through ``kernels.conv3d_thin``, in the dtype autocast would run it in."""
        weight, bias = self.weight, self.bias
        kind = x.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype
        x, weight = x.to(dtype), weight.to(dtype)
        return kernels.conv3d_thin(x, weight, None if bias is None else bias.to(dtype))


def freeze_channel_padding(model: nn.Module) -> None:
    """Pad the weights of ``model``'s channel-padded convolutions once (sampling: the compiled
    denoiser then reads the padded weights as they are, instead of padding them at every step)."""
    for m in model.modules():
        if isinstance(m, ThinConv3d) and m.pad_to:
            m.freeze_padding()


class Stem(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = ThinConv3d(cin, cout, 3, padding=1)

    def forward(self, x: Tensor, emb: Tensor | None = None) -> Tensor:
        return self.conv(x)


class _DenseGradCat(torch.autograd.Function):
    """``torch.cat([a, b], dim=1)`` whose backward hands each input its gradient dense in the
    channels-last layout. The gradient of an NDHWC concatenation's input is a channel slice, which
    is strided (every voxel skips the other input's channels); cuDNN's backward of the convolution
    that produced the input copies such a gradient with PyTorch's generic strided kernel first
    (0.3 ms for 64 channels at 128³). Asked for dense here, Inductor writes it in its own kernel
    from the gradient's producers."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor) -> Tensor:  # type: ignore[override]
        ctx.split = a.shape[1]
        return torch.cat([a, b], dim=1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        fmt = torch.channels_last_3d
        return grad[:, :ctx.split].contiguous(memory_format=fmt), grad[:, ctx.split:].contiguous(memory_format=fmt)


def skip_cat(h: Tensor, skip: Tensor, dense_grads: bool = False) -> Tensor:
    """The decoder's input: the upward path ``h`` and the encoder's ``skip``, concatenated along
    the channels; ``dense_grads`` (NDHWC 5-D tensors) through ``_DenseGradCat``, the same values."""
    if dense_grads and h.ndim == 5:
        return _DenseGradCat.apply(h, skip)
    return torch.cat([h, skip], dim=1)


class UNet3D(nn.Module):
    """Med-DDPM's mask-conditioned 3D U-Net.

    ``forward(x, t)`` takes ``x`` = cat([noisy image, mask], dim=1) of shape
    (N, in_channels, D, H, W) and integer or fractional timesteps ``t`` of shape (N,), and returns
    the predicted noise of shape (N, out_channels, D, H, W).

    ``fused_ops``, ``sdpa``, ``triton_norm``, ``pad_channels``, ``triton_conv``,
    ``dense_skip_grads``, ``fold_conv_bias``, ``triton_upsample``, ``fused_skip_grads`` and
    ``fused_residual`` choose the fast-path implementations (``Knobs``);
    they change no parameter, so a state dict loads into the model built either way.
    """

    def __init__(self, cfg: ModelConfig, checkpoint_attention: bool = True, fused_ops: bool = False,
                 sdpa: bool = False, triton_norm: bool = False, pad_channels: int = 0,
                 triton_conv: bool = False, dense_skip_grads: bool = False, fold_conv_bias: bool = False,
                 triton_upsample: bool = False, fused_skip_grads: bool = False, fused_residual: bool = False) -> None:
        super().__init__()
        if fused_skip_grads and not triton_norm:
            raise ValueError("fused_skip_grads writes the skip concatenation's gradients in the Triton norm's "
                             "backward: it needs triton_norm")
        self.cfg = cfg
        self.dense_skip_grads, self.fused_skip_grads = dense_skip_grads, fused_skip_grads
        mc = cfg.model_channels
        emb_dim = 4 * mc
        self.time_embed = nn.Sequential(nn.Linear(mc, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))

        def attention(ch: int) -> Attention:
            return Attention(ch, cfg, checkpoint_attention, fused_ops, sdpa, triton_norm)

        def resblock(cin: int, cout: int) -> ResBlock:
            return ResBlock(cin, cout, emb_dim, cfg, fused_ops, triton_norm, fold_conv_bias, fused_residual)

        ch = mc * cfg.channel_mult[0]
        self.input_blocks = nn.ModuleList([Block([Stem(cfg.in_channels, ch)])])
        skips = [ch]
        ds = 1
        for level, mult in enumerate(cfg.channel_mult):
            for _ in range(cfg.num_res_blocks):
                layers: list[nn.Module] = [resblock(ch, mc * mult)]
                ch = mc * mult
                if ds in cfg.attention_ds:
                    layers.append(attention(ch))
                self.input_blocks.append(Block(layers))
                skips.append(ch)
            if level < cfg.levels - 1:
                self.input_blocks.append(Block([Downsample(ch)]))
                skips.append(ch)
                ds *= 2

        self.middle_block = Block(
            [resblock(ch, ch), attention(ch), resblock(ch, ch)]
        )

        self.output_blocks = nn.ModuleList()
        for level in reversed(range(cfg.levels)):
            width = mc * cfg.channel_mult[level]
            for i in range(cfg.num_res_blocks + 1):
                layers = [resblock(ch + skips.pop(), width)]
                ch = width
                if ds in cfg.attention_ds:
                    layers.append(attention(ch))
                if level > 0 and i == cfg.num_res_blocks:
                    layers.append(Upsample(ch, fused_ops, triton_upsample))
                    ds //= 2
                self.output_blocks.append(Block(layers))

        self.out = nn.Sequential(
            *norm_act(cfg, ch, fused_ops, triton_norm),
            zeroed(ThinConv3d(mc * cfg.channel_mult[0], cfg.out_channels, 3, padding=1)),
        )
        for thin in (self.input_blocks[0][0].conv, self.out[-1]):
            if triton_conv and not kernels.thin_conv_supported(thin):
                raise ValueError(f"triton_conv: the {thin.in_channels}→{thin.out_channels} convolution has no "
                                 f"thin side (at most {kernels.THIN} channels)")
            thin.pad_to, thin.triton = pad_channels, triton_conv

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        return self.blocks(0, self.num_blocks, x, self.time_input(x, t), ())[0]

    def time_input(self, x: Tensor, t: Tensor) -> Tensor:
        """The checked input's timestep embedding (or, once frozen, the timestep table's rows at t)."""
        if x.ndim != 5 or x.shape[1] != self.cfg.in_channels:
            raise ValueError(
                f"expected input (N, {self.cfg.in_channels}, D, H, W), got {tuple(x.shape)}"
            )
        if hasattr(self, "timestep_table"):
            if t.is_floating_point():
                raise ValueError("a frozen timestep table is indexed by integer timesteps; got fractional ones")
            return self.timestep_table[t]
        return self.embed(t)

    @property
    def num_blocks(self) -> int:
        """Blocks in the flat order ``blocks`` runs: the encoder's, the middle, the decoder's, ``out``."""
        return len(self.input_blocks) + len(self.output_blocks) + 2

    def blocks(self, lo: int, hi: int, h: Tensor, emb: Tensor, skips: tuple[Tensor, ...]
               ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Blocks ``lo`` to ``hi`` − 1 of the flat order (``num_blocks``) on ``h``, with the encoder's
        outputs still to be concatenated in ``skips`` (pushed by the encoder, popped by the decoder):
        (the last block's output, the skips left). ``forward`` runs them all; ``segment_bounds``
        cuts them into the pieces the gradient buckets follow."""
        n_in, n_out = len(self.input_blocks), len(self.output_blocks)
        for i in range(lo, hi):
            if i < n_in:
                h = self.input_blocks[i](h, emb)
                skips = (*skips, h)
            elif i == n_in:
                h = self.middle_block(h, emb)
            elif i <= n_in + n_out:
                block, skip, skips = self.output_blocks[i - n_in - 1], skips[-1], skips[:-1]
                h = block(h, emb, skip) if self.fused_skip_grads else \
                    block(skip_cat(h, skip, self.dense_skip_grads), emb)
            else:
                h = self.out(h)
        return h, skips

    def segment_bounds(self, n: int) -> list[tuple[int, int]]:
        """``n`` consecutive ranges of the flat block order that cover it: with ``n`` ≥ 2 the
        decoder (and ``out``) is the last range, and the encoder is cut after its downsampling
        blocks, highest resolution first; its first range holds the stem. Backward runs them in
        reverse, so the decoder's gradients are complete first (``engine.FlatGrads``' buckets)."""
        n_in = len(self.input_blocks)
        downs = [i + 1 for i, b in enumerate(self.input_blocks) if isinstance(b[0], Downsample)]
        if n < 1 or n > len(downs) + 2:
            raise ValueError(f"{self.cfg.name}: {n} segments asked; this model has 1 to {len(downs) + 2} "
                             f"({len(downs)} downsampling blocks)")
        cuts = [0, *downs[:max(n - 2, 0)], *([n_in + 1] if n >= 2 else []), self.num_blocks]
        return list(zip(cuts[:-1], cuts[1:]))

    def hidden_matrices(self) -> list[nn.Parameter]:
        """The weight matrices between the input and the output (convolution kernels and linear layers; not the
        stem's and the head's convolution, nor norms and biases): what Muon orthogonalizes (medddpm/run/optim.py)."""
        ends = {id(p) for p in (*self.input_blocks[0].parameters(), *self.out.parameters())}
        return [p for p in self.parameters() if p.ndim >= 2 and id(p) not in ends]

    def segment_params(self, n: int) -> list[list[nn.Parameter]]:
        """The parameters of each of ``segment_bounds(n)``'s ranges, the last range first (the order
        backward completes them); the time embedding's, whose gradient is complete only at the end,
        go with the first range."""
        flat = [*self.input_blocks, self.middle_block, *self.output_blocks, self.out]
        groups = [[p for b in flat[lo:hi] for p in b.parameters()] for lo, hi in self.segment_bounds(n)]
        groups[0] += list(self.time_embed.parameters())
        return groups[::-1]

    def embed(self, t: Tensor) -> Tensor:
        """The timestep embedding (N, 4·model_channels) every ResBlock projects (Fig. 3 ④)."""
        return self.time_embed(timestep_embedding(t, self.cfg.model_channels).to(self.time_embed[0].weight.dtype))

    def freeze_timestep_table(self, timesteps: int) -> None:
        """Sampling: every ResBlock's addend (``ResBlock.addend``) at t = 0 … ``timesteps`` − 1,
        computed once with the current weights (in the dtype the caller's autocast gives) into one
        (T, Σ cout) buffer; ``forward`` then indexes it by t (one gather) instead of running the
        embedding MLP and 2 kernels per ResBlock at every step. Weights changed later are not seen."""
        blocks = [m for m in self.modules() if isinstance(m, ResBlock)]
        emb = self.embed(torch.arange(timesteps, device=self.time_embed[0].weight.device))
        adds = [b.addend(emb) for b in blocks]
        start = 0
        for b, a in zip(blocks, adds):
            b.table_cols = (start, start + a.shape[1])
            start += a.shape[1]
        self.register_buffer("timestep_table", torch.cat(adds, 1), persistent=False)

    def use_fp8_convs(self, which: str) -> int:
        """Sampling (``Knobs.fp8_convs``): 3³ convolutions of at most ``fp8.MAX_OUT_CHANNELS`` outputs
        run in FP8 from here on (``fp8.Fp8Conv3d``, weights quantized now), "skip": the decoder
        ResBlocks' first convolutions (their input is a skip concatenation, 2C → C), "all": every
        ResBlock's and upsampling's. The fused norm (or the upsampling) before each writes its input
        in E4M3; an unfused one is followed by SiLU, so the convolution quantizes its input itself.
        Returns how many convolutions were changed."""
        if which not in FP8_CONV_SETS:
            raise ValueError(f"fp8 convolutions: expected one of {FP8_CONV_SETS}, got {which!r}")
        changed = 0
        for holder, key, norm in self._narrow_convs(which):
            setattr(holder, key, Fp8Conv3d.frozen(getattr(holder, key)))
            if norm is not None:
                norm.fp8 = norm.silu  # a fused norm applies the SiLU itself
            changed += 1
        return changed

    def use_fp8_forward(self) -> int:
        """Training (``Knobs.fp8_train_convs``): every ResBlock's and upsampling's 3³ convolution of at
        most ``fp8.MAX_OUT_CHANNELS`` outputs computes its forward in FP8 and its gradients in bf16
        (``fp8.Fp8ForwardConv3d``, the same parameters). Returns how many convolutions changed."""
        changed = 0
        for holder, key, _ in self._narrow_convs("all"):
            setattr(holder, key, Fp8ForwardConv3d.sharing(getattr(holder, key)))
            changed += 1
        return changed

    def _narrow_convs(self, which: str) -> list[tuple[nn.Module, str, "GroupNorm | None"]]:
        """The 3³ convolutions FP8 pays for (``_narrow``) in the set ``which`` of ``FP8_CONV_SETS``, as
        (module holding it, its attribute name, the norm that writes its input or None for the
        upsampling's): "none" no convolution, "skip" the decoder ResBlocks' first, "all" every
        ResBlock's and upsampling's."""
        found = []
        if which == "none":
            return found
        for decoder, blocks in ((False, [*self.input_blocks, self.middle_block]), (True, self.output_blocks)):
            for layer in (layer for block in blocks for layer in block):
                if isinstance(layer, ResBlock):
                    stacks = [layer.in_layers] * (decoder or which == "all") + [layer.out_layers] * (which == "all")
                    found += [(stack, str(len(stack) - 1), stack[0]) for stack in stacks if _narrow(stack[-1])]
                elif isinstance(layer, Upsample) and which == "all" and _narrow(layer.conv):
                    found.append((layer, "conv", None))
        return found


def _narrow(conv: nn.Module) -> bool:
    """A plain 3³ convolution narrow enough for FP8 to pay (``fp8.MAX_OUT_CHANNELS``)."""
    return type(conv) is nn.Conv3d and conv.kernel_size == (3, 3, 3) and conv.out_channels <= MAX_OUT_CHANNELS


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
