"""Per-layer accounting (issue 21): the model's convolutions by shape, kernels attributed to them."""
import pandas as pd
import pytest
import torch

from medddpm.core.config import MODEL_PRESETS
from medddpm.profiling.layers import attribute, conv_layers, kernel_signature, signature
from medddpm.net.model import UNet3D
from medddpm.net.summary import summarize


def test_conv_layers_cover_the_models_convolution_flops(tiny):
    t = conv_layers(tiny, (16, 16, 16))
    stem = t.iloc[0]
    assert (stem["layer"], stem["cin"], stem["cout"], stem["signature"]) == ("input_blocks.0.0.conv", 3, 16, "3→16 k3 16³→16³")
    down = t[t["stride"] == 2].iloc[0]
    assert down["out_volume"] == (8, 8, 8) and down["signature"].endswith("16³→8³")
    whole = conv_layers(MODEL_PRESETS["whole-head"], (128, 128, 128))
    forward = summarize(MODEL_PRESETS["whole-head"], (128, 128, 128))["forward_flops"] / 1e9
    assert 0.97 * forward < whole["gflop_per_pass"].sum() <= forward  # convolutions: nearly all of the FLOPs
    convs = sum(isinstance(m, torch.nn.Conv3d) for m in UNet3D(MODEL_PRESETS["whole-head"]).modules())
    assert len(whole) == convs and whole.loc[whole["signature"] == "64→64 k3 128³→128³", "gflop_per_pass"].iloc[0] == \
        pytest.approx(2 * 64 * 64 * 27 * 128**3 / 1e9)


def test_kernels_are_attributed_to_signatures_with_their_flops(tiny):
    layers = conv_layers(tiny, (16, 16, 16))
    sig = kernel_signature([1, 16, 16, 16, 16], [16, 16, 3, 3, 3], None)
    assert sig == signature(16, 16, 3, (16, 16, 16), (16, 16, 16))
    assert kernel_signature([1, 16, 16, 16], [16, 16, 3, 3], None) is None  # 2-D: not ours
    kernels = pd.DataFrame({"signature": [sig, sig, sig, "9→9 k3 4³→4³"], "pass": ["forward convolution", "forward convolution", "data gradient", "forward convolution"],
                            "duration_us": [10.0, 30.0, 5.0, 1.0]})
    a = attribute(kernels, layers).set_index(["signature", "pass"])
    n = int((layers["signature"] == sig).sum())
    row = a.loc[(sig, "forward convolution")]
    assert row["kernels"] == 2 and row["ms"] == pytest.approx(0.04) and row["count"] == n
    assert row["tflops"] == pytest.approx(row["gflop"] / 0.04) and row["gflop"] == pytest.approx(
        n * 2 * 16 * 16 * 27 * 16**3 / 1e9)
    assert ("unattributed", "forward convolution") in a.index


def test_profiling_runs_the_step_and_needs_a_gpu_for_kernels(tiny, capsys):
    from medddpm.core.config import run_config
    from medddpm.profiling.layers import main, profile_step_convs

    k = profile_step_convs(tiny, run_config("opt1"), (16, 16, 16), torch.device("cpu"), warmup=1)
    assert list(k.columns) == ["signature", "pass", "kernel", "duration_us"] and k.empty  # no CUDA kernels on a CPU
    if not torch.cuda.is_available():
        assert main(["--profile", "--model", "tiny", "--size", "16"]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err
    assert main(["--profile", "--config", "fast-w16"]) == 2 and "sampling only" in capsys.readouterr().err


def test_norm_layers_list_every_groupnorm_with_its_minimal_bytes():
    from medddpm.profiling.layers import MIN_PASSES, norm_layers

    t = norm_layers(MODEL_PRESETS["whole-head"], (32, 32, 32))
    model = UNet3D(MODEL_PRESETS["whole-head"])
    assert len(t) == sum(isinstance(m, torch.nn.GroupNorm) for m in model.modules())
    first = t.iloc[0]
    assert first["layer"] == "input_blocks.1.0.in_layers.0" and first["signature"] == "64 ch 32³ SiLU"
    assert first["min_step_mb"] == MIN_PASSES["step"] * 2 * 64 * 32 ** 3 / 1e6
    # a ResBlock's second norm takes the time embedding; attention's norm has no SiLU
    assert t.set_index("layer").loc["input_blocks.1.0.out_layers.0", "add"]
    attn = t[t["layer"].str.endswith(".norm")]
    assert len(attn) > 0 and not attn["silu"].any() and not attn["add"].any()


def test_norm_table_refuses_an_unknown_implementation():
    from medddpm.profiling.layers import norm_layers, norm_ms

    row = norm_layers(MODEL_PRESETS["tiny"], (16, 16, 16)).iloc[0]
    with pytest.raises(ValueError, match="impl must be"):
        norm_ms(row, "cudnn", False, torch.device("cpu"))
