import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from medddpm.core.config import MODEL_PRESETS, ModelConfig, replace
from medddpm.net.model import UNet3D, count_parameters, timestep_embedding
from medddpm.net.summary import summarize

# Fidelity targets measured on the reference Med-DDPM code (issue 2).
REFERENCE = {
    "whole-head": ((128, 128, 128), 40_226_433, 5_536_663_142_400),
    "brats": ((144, 192, 192), 57_562_564, 21_258_180_493_312),
}


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_parameters_and_flops_match_reference(name):
    size, params, flops = REFERENCE[name]
    s = summarize(MODEL_PRESETS[name], size)
    assert s["parameters"] == params
    assert s["forward_flops"] == flops
    assert sum(b["params"] for b in s["blocks"]) + s["time_embed_params"] == params
    assert sum(b["flops"] for b in s["blocks"]) <= flops


def test_whole_head_structure():
    s = summarize(MODEL_PRESETS["whole-head"], (128, 128, 128))
    layers = [b["layers"] for b in s["blocks"]]
    # attention at downsample factor 8 (16³ feature maps) and in the middle block only
    attn = [b for b in s["blocks"] if "Attention" in b["layers"]]
    assert {tuple(b["in_shape"][2:]) for b in attn} == {(16, 16, 16), (8, 8, 8)}
    assert s["blocks"][-1]["out_shape"] == [1, 1, 128, 128, 128]
    assert layers.count("Downsample") == 4 and sum("Upsample" in l for l in layers) == 4


def test_forward_shape_and_zero_init(tiny):
    model = UNet3D(tiny)
    x = torch.randn(2, tiny.in_channels, 16, 16, 16)
    out = model(x, torch.tensor([0, 249]))
    assert out.shape == (2, 1, 16, 16, 16)
    assert torch.count_nonzero(out) == 0  # zero-initialised output convolution


def test_wrong_input_channels_is_clear(tiny):
    with pytest.raises(ValueError, match=r"expected input \(N, 3"):
        UNet3D(tiny)(torch.randn(1, 2, 16, 16, 16), torch.zeros(1))


def _randomized(cfg, seed=0, **kw):
    torch.manual_seed(seed)
    model = UNet3D(cfg, **kw)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    return model


def test_attention_checkpointing_gives_same_gradients(tiny):
    x = torch.randn(1, 3, 16, 16, 16)
    t = torch.tensor([10])
    grads = []
    for ckpt in (True, False):
        m = _randomized(tiny, checkpoint_attention=ckpt)
        m(x, t).square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    torch.testing.assert_close(grads[0], grads[1])


def test_channels_last_matches_contiguous(tiny):
    m = _randomized(tiny)
    x = torch.randn(1, 3, 16, 16, 16)
    t = torch.tensor([3])
    ref = m(x, t)
    m_cl = m.to(memory_format=torch.channels_last_3d)
    out = m_cl(x.contiguous(memory_format=torch.channels_last_3d), t)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_groupnorm_fp32_keeps_dtype(tiny):
    m = _randomized(tiny).to(torch.bfloat16)
    out = m(torch.randn(1, 3, 16, 16, 16, dtype=torch.bfloat16), torch.tensor([1]))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


def test_timestep_embedding():
    e = timestep_embedding(torch.tensor([0.0, 5.0]), 64)
    assert e.shape == (2, 64)
    torch.testing.assert_close(e[0, :32], torch.ones(32))  # cos(0)
    torch.testing.assert_close(e[0, 32:], torch.zeros(32))  # sin(0)
    assert timestep_embedding(torch.tensor([1.0]), 7).shape == (1, 7)


def test_config_validation():
    with pytest.raises(ValueError, match="in_channels"):
        ModelConfig(in_channels=4)
    with pytest.raises(ValueError, match="divisible by num_groups"):
        replace(MODEL_PRESETS["tiny"], model_channels=12)
    with pytest.raises(ValueError, match="divisible by 2"):
        MODEL_PRESETS["tiny"].check_size((16, 16, 15))


def test_flop_counter_counts_attention_matmuls(tiny):
    """Attention einsums are part of the count: removing attention lowers it."""
    def flops(cfg):
        with torch.device("meta"):
            m = UNet3D(cfg)
            x = torch.empty(1, 3, 16, 16, 16)
        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            m(x, torch.zeros(1, dtype=torch.long, device="meta"))
        return fc.get_total_flops()

    no_attn = replace(tiny, attention_ds=())
    assert flops(tiny) > flops(no_attn)
    assert count_parameters(UNet3D(tiny)) > count_parameters(UNet3D(no_attn))


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last_3d])
def test_channel_padding_keeps_the_model_output(tiny, layout):
    """Stem and output convolutions padded to 8 channels once (zero weights, dropped outputs, as
    the sampler does) give the same ε as the model itself, in either layout; the padded
    convolutions really are wider."""
    from medddpm.net.model import freeze_channel_padding

    torch.manual_seed(0)
    m = UNet3D(tiny).to(memory_format=layout)
    torch.nn.init.normal_(m.out[-1].weight, std=0.1)  # the output convolution starts at zero
    x = torch.randn(2, tiny.in_channels, 16, 16, 16).contiguous(memory_format=layout)
    t = torch.tensor([5, 100])
    with torch.no_grad():
        ref = m(x, t)
        m.input_blocks[0][0].conv.pad_to = m.out[-1].pad_to = 8
        freeze_channel_padding(m)
        out = m(x, t)
    stem, head = m.input_blocks[0][0].conv.padded_weight, m.out[-1].padded_weight
    assert (stem.shape[1], head.shape[0]) == (8, 8) and out.shape == ref.shape
    assert stem.is_contiguous(memory_format=layout)
    assert m.state_dict().keys() == UNet3D(tiny).state_dict().keys()  # padded buffers are not saved
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_channel_padding_changes_no_sum_no_gradient_and_no_key(tiny):
    """pad_channels (training): the stem and output convolutions pad their own weights at every
    call; outputs and every parameter's gradient equal the unpadded model's, state dicts match."""
    torch.manual_seed(0)
    ref = UNet3D(tiny).double()
    with torch.no_grad():
        for p in ref.parameters():  # the zero-initialised output convolution would hide differences
            p.add_(0.05 * torch.randn_like(p))
    padded = UNet3D(tiny, pad_channels=8).double()
    assert padded.state_dict().keys() == ref.state_dict().keys()
    padded.load_state_dict(ref.state_dict())
    assert padded.out[-1].pad_to == 8 and padded.input_blocks[0][0].conv.pad_to == 8
    x = torch.randn(2, tiny.in_channels, 16, 16, 16, dtype=torch.float64)
    t = torch.tensor([3, 120])
    out_ref, out_pad = ref(x, t), padded(x, t)
    assert out_pad.shape == out_ref.shape
    torch.testing.assert_close(out_pad, out_ref, rtol=1e-10, atol=1e-10)
    out_ref.square().sum().backward()
    out_pad.square().sum().backward()
    for (name, a), b in zip(ref.named_parameters(), padded.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.parametrize("fold", [False, True])
def test_frozen_timestep_table_gives_the_same_eps(tiny, fold):
    """UNet3D.freeze_timestep_table: every ResBlock's addend (embedding MLP, projection, a folded
    first-conv bias) read from the table at t gives the ε of computing it at every step, for a batch
    of different timesteps; the table holds one row per timestep and the state dict is unchanged."""
    torch.manual_seed(0)
    model = UNet3D(tiny, checkpoint_attention=False, fused_ops=True, triton_norm=fold, fold_conv_bias=fold).eval()
    for p in model.parameters():  # no zero-initialised branch: every addend reaches ε
        torch.nn.init.normal_(p, std=0.05)
    x = torch.randn(3, tiny.in_channels, 16, 16, 16).contiguous(memory_format=torch.channels_last_3d)
    t = torch.tensor([0, 17, 249])
    keys = set(model.state_dict())
    with torch.no_grad():
        want = model(x, t)
        model.freeze_timestep_table(250)
        got = model(x, t)
    blocks = sum(m.__class__.__name__ == "ResBlock" for m in model.modules())
    assert model.timestep_table.shape[0] == 250 and blocks > 1 and set(model.state_dict()) == keys
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="integer timesteps"):
        model(x, t.float() + 0.5)


def test_timestep_table_knob_is_for_sampling_only():
    from medddpm.core.config import run_config

    knobs = run_config("fast-w16-tnorm-tconv-fold-up-table")
    assert knobs.timestep_table and knobs.triton_upsample
    with pytest.raises(ValueError, match="sampling only.*timestep_table"):
        run_config("fast-w16-tnorm-tconv-fold-up-table", training=True)


def test_segments_cover_the_blocks_and_the_parameters_once(tiny):
    """The gradient buckets' segments (engine.Segmented, FlatGrads): consecutive block ranges, the
    decoder last, every parameter in exactly one bucket, the decoder's bucket first."""
    from medddpm.core.config import MODEL_PRESETS

    for cfg in (tiny, MODEL_PRESETS["whole-head"]):
        model = UNet3D(cfg)
        for n in range(1, cfg.levels + 2):
            bounds = model.segment_bounds(n)
            assert len(bounds) == n and bounds[0][0] == 0 and bounds[-1][1] == model.num_blocks
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            groups = model.segment_params(n)
            ids = [id(p) for g in groups for p in g]
            assert len(ids) == len(set(ids)) and set(ids) == {id(p) for p in model.parameters()}
            if n >= 2:
                assert bounds[-1][0] == len(model.input_blocks) + 1  # the decoder and out
                assert {id(p) for p in groups[0]} == {id(p) for b in [*model.output_blocks, model.out]
                                                      for p in b.parameters()}
                assert {id(p) for p in model.time_embed.parameters()} <= {id(p) for p in groups[-1]}
        with pytest.raises(ValueError, match=f"this model has 1 to {cfg.levels + 1}"):
            model.segment_bounds(cfg.levels + 2)


def test_segmented_network_computes_the_forward_and_gradients(tiny):
    from medddpm.run.engine import Segmented

    torch.manual_seed(0)
    model = UNet3D(tiny)
    for p in model.parameters():  # no zero-initialised layer: every gradient non-trivial
        torch.nn.init.normal_(p, std=0.05)
    x, t = torch.randn(2, tiny.in_channels, 16, 16, 16), torch.tensor([3, 7])
    ref = model(x, t)
    ref_grads = torch.autograd.grad(ref.square().sum(), list(model.parameters()))
    for n in (2, 3):
        out = Segmented(model, n, lambda f: f)(x, t)
        assert torch.equal(out, ref)
        for g, r in zip(torch.autograd.grad(out.square().sum(), list(model.parameters())), ref_grads):
            torch.testing.assert_close(g, r, rtol=0, atol=0)
