"""The post-hoc EMA (``medddpm/train/posthoc.py``, Karras et al. 2024): its profiles, the least-squares rebuild,
train's snapshots across a resume, and ``medddpm posthoc-ema`` (tiny model, 16³)."""
import numpy as np
import pandas as pd
import pytest
import torch

from medddpm.cli import main
from medddpm.train import posthoc as P


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err, needle):
    lines = err.strip().splitlines()
    return code == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err


def test_widths_and_exponents_are_inverse_with_edm2s_pair():
    assert P.gamma_of(0.05) == pytest.approx(16.97, abs=0.01) and P.gamma_of(0.10) == pytest.approx(6.94, abs=0.01)
    for s in (0.01, 0.07, 0.2):
        g = P.gamma_of(s)
        assert np.sqrt((g + 1) / ((g + 2) ** 2 * (g + 3))) == pytest.approx(s)  # EDM2's σ_rel of the exponent
    for bad in (0.0, 0.29, -0.1):
        with pytest.raises(ValueError, match="sigma_rel"):
            P.gamma_of(bad)


def trajectory(n=400):
    """A smooth path of three weights, as training moves them."""
    k = np.arange(1, n + 1)
    return [torch.tensor(v, dtype=torch.float32) for v in np.stack([np.sin(k / 40), k / 100, np.cos(k / 90) + k / 100], 1)]


def test_an_ema_weights_each_update_by_its_share_of_the_power_profile():
    w = torch.zeros(3)
    emas, path = P.PowerEMAs([("w", w)], (0.1,)), trajectory(50)
    for theta in path:
        w.copy_(theta)
        emas.update([w])
    g, k = P.gamma_of(0.1), np.arange(1, 51)
    share = (k ** (g + 1) - (k - 1) ** (g + 1)) / 50 ** (g + 1)
    assert torch.allclose(emas.averages[0][0], sum(float(s) * t for s, t in zip(share, path)), atol=1e-5)


def test_the_rebuild_returns_a_kept_width_exactly_and_one_between_them_closely(tmp_path):
    w = torch.zeros(3)
    kept, direct = P.PowerEMAs([("w", w)], (0.05, 0.10)), P.PowerEMAs([("w", w)], (0.07,))
    for i, theta in enumerate(trajectory(), start=1):
        w.copy_(theta)
        kept.update([w])
        direct.update([w])
        if i % 40 == 0:
            P.save_snapshot(tmp_path, 10 * i, kept)
    loaded = P.load(tmp_path)
    same, how = P.reconstruct(loaded, 0.05)
    assert torch.allclose(same["w"], kept.averages[0][0], atol=1e-4) and how["step"] == 4000 and how["snapshots"] == 10
    between, _ = P.reconstruct(loaded, 0.07)
    err = (between["w"] - direct.averages[0][0]).abs().max()
    assert err < 0.01 * direct.averages[0][0].abs().max()
    for neighbour in kept.averages:  # nearer than either width kept: the rebuild adds what neither has
        assert err < (neighbour[0] - direct.averages[0][0]).abs().max() / 5
    earlier, how = P.reconstruct(P.load(tmp_path, step=2000), 0.07)
    assert how["step"] == 2000 and how["snapshots"] == 5
    with pytest.raises(FileNotFoundError, match="no snapshot"):
        P.load(tmp_path / "none")


def test_from_few_snapshots_widths_off_the_kept_ones_stay_averages_of_the_weights():
    """Four snapshots of 0.05 and 0.10, weights with a large mean (as a network's are): the combination's weights sum to
    1, so 0.03, 0.08 and 0.15 land within 1 % of the EMA tracked directly (an unconstrained fit sums to 0.93 for 0.03
    and scales every weight by it: 6.6 % off)."""
    g = torch.Generator().manual_seed(0)
    base, w = 3 * torch.randn(500, generator=g), torch.zeros(500)
    kept, direct, loaded = P.PowerEMAs([("w", w)], (0.05, 0.10)), P.PowerEMAs([("w", w)], (0.03, 0.08, 0.15)), []
    for t in range(1, 401):
        w.copy_(base + 2 * np.exp(-t / 80) * torch.randn(500, generator=g) + 0.3 * torch.randn(500, generator=g))
        kept.update([w])
        direct.update([w])
        if t % 100 == 0:
            loaded.append({"step": t, "names": ["w"], **kept.state_dict()})
    for k, sigma_rel in enumerate(direct.sigma_rels):
        rebuilt, how = P.reconstruct(loaded, sigma_rel)
        assert sum(how["weights"]) == pytest.approx(1.0, abs=1e-9)
        assert (rebuilt["w"] - direct.averages[k][0]).norm() < 0.01 * direct.averages[k][0].norm()


def test_train_keeps_snapshots_through_a_resume_and_posthoc_ema_judges_and_writes_one(capsys, phantoms, tmp_path):
    data = ["--images", str(phantoms / "images"), "--masks", str(phantoms / "masks")]
    args = ["train", *data, "--model", "tiny", "--size", "16", "--quiet", "--device", "cpu", "--held-out", "1",
            "--grad-accum", "1", "--out", str(tmp_path / "r"), "--posthoc-ema", "0.05", "0.1", "--posthoc-every", "10"]
    code, _, err = run(capsys, *args, "--steps", "10")  # the EMAs update every 10 steps (TrainConfig.ema_every)
    assert code == 0, err
    code, _, err = run(capsys, *args, "--steps", "20", "--resume")
    assert code == 0, err
    assert [p.name for p in P.snapshots(tmp_path / "r")] == [f"{s:09d}.pt" for s in (10, 20)]
    assert torch.load(P.snapshot_path(tmp_path / "r", 20), weights_only=True)["updates"] == 2  # the count resumed
    code, _, err = run(capsys, *args[:-5], "--posthoc-ema", "0.2", "--steps", "30", "--resume")
    assert one_line_error(code, err, "cannot resume"), err

    post = ["posthoc-ema", "--run", str(tmp_path / "r"), "--device", "cpu"]
    code, out, err = run(capsys, *post, *data, "--sigma-rel", "0.07", "0.12", "--out", str(tmp_path / "best.pt"))
    assert code == 0, err
    table = pd.read_csv(tmp_path / "r" / "posthoc.csv")
    assert list(table["sigma_rel"]) == [0.07, 0.12] and table["heldout_loss"].notna().all() and (table["step"] == 20).all()
    best = torch.load(tmp_path / "best.pt", weights_only=False)
    last = torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=False)
    assert best["ema"].keys() == last["ema"].keys() and best["posthoc_ema"]["sigma_rel"] in (0.07, 0.12)
    assert any(not torch.equal(best["ema"][k], last["ema"][k]) for k in best["ema"])
    code, _, err = run(capsys, *post, *data, "--sigma-rel", "0.2", "0.07")  # judged again: kept beside, not lost
    assert code == 0, err
    assert sorted(pd.read_csv(tmp_path / "r" / "posthoc.csv")["sigma_rel"]) == [0.07, 0.12, 0.2]
    kept = (tmp_path / "best.pt").read_bytes()
    code, _, err = run(capsys, *post, "--sigma-rel", "0.07", "--out", str(tmp_path / "best.pt"))
    assert one_line_error(code, err, "exists") and (tmp_path / "best.pt").read_bytes() == kept
    code, _, err = run(capsys, *post, "--sigma-rel", "0.5")
    assert one_line_error(code, err, "--sigma-rel")
    code, _, err = run(capsys, "posthoc-ema", "--run", str(tmp_path / "r"), "--sigma-rel", "0.07", "--step", "5")
    assert one_line_error(code, err, "no snapshot")
    code, _, err = run(capsys, "train", *data, "--model", "tiny", "--size", "16", "--steps", "2", "--posthoc-every", "10",
                       "--out", str(tmp_path / "x"))
    assert one_line_error(code, err, "--posthoc-every needs --posthoc-ema")
    code, _, err = run(capsys, "train", *data, "--model", "tiny", "--size", "16", "--steps", "2", "--posthoc-ema", "0.1",
                       "--posthoc-every", "15", "--out", str(tmp_path / "x"))
    assert one_line_error(code, err, "multiple of ema_every") and not (tmp_path / "x").exists()
