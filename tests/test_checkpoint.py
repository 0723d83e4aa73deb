"""train.checkpoint: reading a run's checkpoint (mapped, one clear error for a file that is not one)
and the configurations it was trained under."""
from dataclasses import asdict

import pytest
import torch

from medddpm.core.config import DataConfig, DiffusionConfig, ModelConfig, TrainConfig, model_preset, run_config
from medddpm.core.errors import InputError
from medddpm.train.checkpoint import configs_from_checkpoint, data_config, load_checkpoint


def _ckpt(weight: torch.Tensor) -> dict:
    config = {"model": asdict(model_preset("tiny")), "diffusion": asdict(DiffusionConfig()), "train": asdict(TrainConfig()),
              "knobs": asdict(run_config("bf16")), "size": [16, 16, 16]}
    return {"step": 3, "model": {"w": weight}, "ema": {"w": weight + 1}, "optimizer": {}, "config": config, "rng": {}}


def test_a_checkpoint_is_mapped_and_gives_back_its_configurations(tmp_path):
    weight = torch.arange(6.0).reshape(2, 3)
    torch.save(_ckpt(weight), tmp_path / "c.pt")
    ckpt = load_checkpoint(tmp_path / "c.pt")
    assert torch.equal(ckpt["ema"]["w"], weight + 1) and ckpt["step"] == 3
    model, diffusion, train, knobs = configs_from_checkpoint(ckpt)
    assert isinstance(model, ModelConfig) and model == model_preset("tiny") and knobs.name == "bf16"
    assert diffusion == DiffusionConfig() and train == TrainConfig()
    assert data_config(ckpt) == DataConfig()  # a checkpoint from before the data config was kept: the reference's


@pytest.mark.parametrize("content,needle", [(None, "does not exist"), (b"not a checkpoint", "cannot read checkpoint"),
                                            ({"step": 1}, "is not a medddpm checkpoint")])
def test_anything_else_is_one_clear_error(tmp_path, content, needle):
    path = tmp_path / "c.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content, path)
    with pytest.raises(InputError, match=needle):
        load_checkpoint(path)
