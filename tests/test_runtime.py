import json
import subprocess
import sys

import pytest
import torch

from medddpm.core.config import CONFIGS, Knobs, run_config
from medddpm.run.engine import Engine
from medddpm.core.runtime import gpu_slug, set_backend_flags, tf32_state


@pytest.mark.parametrize("name,slug", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100-80gb-hbm3"),
                                       ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"), ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb")])
def test_gpu_slug(name, slug):
    assert gpu_slug(name) == slug


def _fresh_process_state() -> dict:
    code = "import json; from medddpm.core.runtime import tf32_state; print(json.dumps(tf32_state()))"
    return json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def test_configurations_set_tf32_explicitly(tiny):
    cpu = torch.device("cpu")
    default = _fresh_process_state()
    assert Engine(tiny, run_config("baseline"), cpu).settings()["tf32_conv"] is False
    assert tf32_state() == {"tf32_matmul": False, "tf32_conv": False}
    Engine(tiny, run_config("opt12"), cpu)
    assert tf32_state() == {"tf32_matmul": True, "tf32_conv": True}
    # 'pytorch-default' means PyTorch's own defaults, whatever ran before
    Engine(tiny, run_config("pytorch-default"), cpu)
    assert tf32_state() == default
    assert torch.backends.cudnn.benchmark is False
    set_backend_flags(None, True)
    assert torch.backends.cudnn.benchmark is True
    set_backend_flags(None, None)
    assert torch.backends.cudnn.benchmark is False
    # the autotuner's algorithm limit is a knob too: recorded, and harmless where cuDNN is not built in
    settings = Engine(tiny, run_config("bf16-graphs-cudnn-all"), cpu).settings()
    assert settings["cudnn_benchmark_limit"] == 0
    assert settings["cudnn_benchmark_limit_now"] == (0 if torch.backends.cudnn.is_available() else None)


def test_one_tf32_api_only():
    """Inductor reads the legacy getters; they raise once the per-backend setters were used, so
    applying every configuration must leave the legacy getters readable."""
    code = ("import torch; from medddpm.core.runtime import set_backend_flags\n"
            "for v in (True, False, None): set_backend_flags(v, None); torch.get_float32_matmul_precision();"
            " torch.backends.cuda.matmul.allow_tf32; torch.backends.cudnn.allow_tf32\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_named_configurations():
    assert {"baseline", "opt1", "opt2", "opt12", "pytorch-default"} <= set(CONFIGS)
    assert CONFIGS["opt2"].channels_last and not CONFIGS["opt2"].tf32
    with pytest.raises(ValueError, match="precision"):
        Knobs(precision="fp16")
