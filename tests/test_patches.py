"""The patch curriculum (TrainConfig.patch_size / patch_steps, medddpm/data/patches.py): where each draw's cubes
come from, what the trainer feeds the step before and after the switch, and that a resume across it is exact."""
import numpy as np
import pytest
import torch

from medddpm.core.config import TrainConfig
from medddpm.core.errors import InputError
from medddpm.data import patches
from medddpm.train.checkpoint import CHECKPOINT, load_checkpoint

from test_train import _trainer


def test_corners_are_the_draws_own_uniform_and_inside_the_volume():
    a = patches.corners(3, 7, 4, (16, 24, 32), 8)
    assert a.shape == (4, 3) and (a >= 0).all() and (a <= np.array([8, 16, 24])).all()
    np.testing.assert_array_equal(a, patches.corners(3, 7, 4, (16, 24, 32), 8))  # (seed, draw) alone
    assert not np.array_equal(a, patches.corners(3, 8, 4, (16, 24, 32), 8))
    assert not np.array_equal(a, patches.corners(4, 7, 4, (16, 24, 32), 8))
    many = patches.corners(0, 0, 20000, (16, 16, 16), 8)
    assert set(np.unique(many)) == set(range(9))  # every position where the cube fits, the last one included
    with pytest.raises(ValueError, match="does not fit"):
        patches.corners(0, 0, 1, (16, 16, 8), 12)


def test_a_crop_is_each_volumes_cube_at_its_corner():
    x = torch.arange(2 * 3 * 8 * 8 * 8, dtype=torch.float32).reshape(2, 3, 8, 8, 8)
    low = np.array([[0, 1, 2], [4, 4, 0]])
    c = patches.crop(x, low, 4)
    assert c.shape == (2, 3, 4, 4, 4)
    torch.testing.assert_close(c[0], x[0, :, 0:4, 1:5, 2:6], rtol=0, atol=0)
    torch.testing.assert_close(c[1], x[1, :, 4:8, 4:8, 0:4], rtol=0, atol=0)
    with pytest.raises(ValueError, match="3 corners for a batch of 2"):
        patches.crop(x, np.zeros((3, 3), dtype=int), 4)


def test_the_first_patch_steps_train_on_patches_then_whole_volumes(phantoms, tmp_path):
    t = _trainer(phantoms, tmp_path / "a", patch_size=8, patch_steps=3, grad_accum=1)
    seen = []
    step = t.engine.train_step
    t.engine.train_step = lambda images, masks, **kw: (seen.append([tuple(i.shape) for i in images + masks]),
                                                       step(images, masks, **kw))[1]
    t.fit(5, progress=False)
    assert seen[:3] == [[(1, 1, 8, 8, 8), (1, 2, 8, 8, 8)]] * 3
    assert seen[3:] == [[(1, 1, 16, 16, 16), (1, 2, 16, 16, 16)]] * 2
    assert t.phases["switch step n"] == 1 and t.phases["steady steps n"] == 3


def test_a_resume_across_the_switch_is_exact(phantoms, tmp_path):
    straight = _trainer(phantoms, tmp_path / "a", patch_size=8, patch_steps=2, grad_accum=1).fit(3, progress=False)
    first = _trainer(phantoms, tmp_path / "b", patch_size=8, patch_steps=2, grad_accum=1)
    first.fit(1, progress=False)
    second = _trainer(phantoms, tmp_path / "b", patch_size=8, patch_steps=2, grad_accum=1)
    second.resume()
    assert second.fit(3, progress=False) == straight
    a, b = load_checkpoint(tmp_path / "a" / CHECKPOINT), load_checkpoint(tmp_path / "b" / CHECKPOINT)
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=0)
    plain = _trainer(phantoms, tmp_path / "c", grad_accum=1).fit(1, progress=False)
    assert plain[0] != straight[0]  # the patches are what was trained
    with pytest.raises(InputError, match="patch_size 8 → 0"):
        _trainer(phantoms, tmp_path / "b").resume()


@pytest.mark.parametrize("size,steps,needle", [(8, 0, "go together"), (0, 5, "go together"), (-8, 5, "go together")])
def test_a_half_given_curriculum_is_refused(size, steps, needle):
    with pytest.raises(ValueError, match=needle):
        TrainConfig(patch_size=size, patch_steps=steps)


@pytest.mark.parametrize("size,needle", [(24, "larger than the training size"), (7, "divisible by 2")])
def test_a_patch_that_does_not_fit_the_run_is_refused_before_anything_is_written(phantoms, tmp_path, size, needle):
    with pytest.raises(InputError, match=needle):
        _trainer(phantoms, tmp_path / "r", patch_size=size, patch_steps=2)
    assert not (tmp_path / "r").exists()
