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


@pytest.mark.parametrize("content,needle", [(None, "does not exist"), (b"not a checkpoint", "not a whole checkpoint file"),
                                            ({"step": 1}, "is not a medddpm checkpoint")])
def test_anything_else_is_one_clear_error(tmp_path, content, needle):
    path = tmp_path / "c.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content, path)
    with pytest.raises(InputError, match=needle):
        load_checkpoint(path)


@pytest.mark.parametrize("damage", ["truncated", "nifti", "other-model"])
def test_a_damaged_checkpoint_is_one_line_from_every_reader(tiny_checkpoint, phantoms, tmp_path, capsys, damage):
    """Issue 77 item 6: a truncated checkpoint, another kind of file, or weights of another model than its config
    says: one line and exit 2 from `sample`, `warmup` and `train --resume`, an InputError from Sampler.from_checkpoint."""
    from medddpm.cli import main
    from medddpm.sample import Sampler

    run = tmp_path / "run"
    run.mkdir()
    path = run / "checkpoint.pt"
    if damage == "truncated":
        path.write_bytes(tiny_checkpoint.read_bytes()[:20_000])
    elif damage == "nifti":
        path.write_bytes(next((phantoms / "images").iterdir()).read_bytes())
    else:
        ckpt = torch.load(tiny_checkpoint, weights_only=False)
        ckpt["config"]["model"]["model_channels"] = 32
        torch.save(ckpt, path)
    with pytest.raises(InputError, match="not a whole checkpoint file|do not fit the model"):
        Sampler.from_checkpoint(path, device="cpu")
    data = ["--images", str(phantoms / "images"), "--masks", str(phantoms / "masks")]
    for argv in (["sample", "--checkpoint", str(path), "--masks", str(phantoms / "masks"), "--out", str(tmp_path / "s"),
                  "--device", "cpu", "--quiet"],
                 ["warmup", "--checkpoint", str(path), "--device", "cpu"],
                 ["train", *data, "--model", "tiny", "--size", "16", "--steps", "3", "--out", str(run), "--device", "cpu",
                  "--resume", "--quiet"]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err  # `sample` may say which sampler it picked first
        lines = err.strip().splitlines()
        assert len(lines) <= 2 and lines[-1].startswith(f"medddpm {argv[0]}: error:") and "Traceback" not in err, err
