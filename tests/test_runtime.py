import json
import subprocess
import sys

import pytest
import torch

from medddpm.config import CONFIGS, Knobs, run_config
from medddpm.runtime import apply_knobs, gpu_slug, tf32_state


@pytest.mark.parametrize("name,slug", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100-80gb-hbm3"),
                                       ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"), ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb")])
def test_gpu_slug(name, slug):
    assert gpu_slug(name) == slug


def _fresh_process_state() -> dict:
    code = "import json; from medddpm.runtime import tf32_state; print(json.dumps(tf32_state()))"
    return json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def test_configurations_set_tf32_explicitly():
    default = _fresh_process_state()
    assert apply_knobs(run_config("baseline"))["tf32_conv"] is False
    assert tf32_state() == {"tf32_matmul": False, "tf32_conv": False}
    apply_knobs(run_config("opt12"))
    assert tf32_state() == {"tf32_matmul": True, "tf32_conv": True}
    # 'pytorch-default' means PyTorch's own defaults, whatever ran before
    apply_knobs(run_config("pytorch-default"))
    assert tf32_state() == default
    assert torch.backends.cudnn.benchmark is False
    apply_knobs(Knobs(cudnn_benchmark=True))
    assert torch.backends.cudnn.benchmark is True
    apply_knobs(run_config("pytorch-default"))


def test_named_configurations():
    assert set(CONFIGS) == {"baseline", "opt1", "opt2", "opt12", "pytorch-default"}
    assert CONFIGS["opt2"].channels_last and not CONFIGS["opt2"].tf32
    with pytest.raises(ValueError, match="precision"):
        Knobs(precision="fp16")
