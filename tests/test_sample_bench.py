import pytest
import torch

from medddpm.core.config import MODEL_PRESETS, run_config
from medddpm.core.errors import InputError
from medddpm.profiling.sample_bench import denoise_kernels


def test_denoise_kernels_refuses_an_unknown_sampler():
    """One clear error before any model is built or profiled."""
    with pytest.raises(InputError, match="sampler must be 'ddpm' or 'ddim', got 'ddmp'"):
        denoise_kernels(MODEL_PRESETS["tiny"], run_config("baseline"), (16,) * 3, torch.device("cpu"), sampler="ddmp")
