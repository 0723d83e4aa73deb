"""Segmentation utility (medddpm.sample.utility): a small segmenter learns a brain from scans and
is scored by Dice on held-out ones."""
import pandas as pd
import torch

from medddpm.sample.utility import Segmenter, dice, train_segmenter, utility


def test_dice_counts_overlap():
    a = torch.zeros(4, 4, 4, dtype=torch.bool)
    b = a.clone()
    assert dice(a, b) == 1.0
    a[:2], b[1:3] = True, True
    assert dice(a, b) == 0.5 and dice(a, a) == 1.0


def test_a_segmenter_learns_a_bright_blob_and_utility_scores_both_sources():
    g = torch.Generator().manual_seed(0)
    labels = torch.zeros(6, 1, 16, 16, 16, dtype=torch.bool)
    for i in range(6):
        c = 5 + i % 3
        labels[i, 0, c:c + 6, c:c + 6, 4:12] = True
    real = labels.float() * 1.4 - 0.7 + 0.05 * torch.randn(labels.shape, generator=g)
    assert Segmenter(8)(real[:1]).shape == (1, 1, 16, 16, 16)
    model = train_segmenter(real[:4], labels[:4], steps=120, device=torch.device("cpu"), width=8)
    with torch.no_grad():
        assert dice(model(real[4:5])[0] > 0, labels[4]) > 0.8  # a blob this plain is learnt in a few steps
    noise = torch.randn(real[:4].shape, generator=g)  # "synthetic scans" that carry no anatomy at all
    rows = utility(real[:4], noise, labels[:4], real[4:], labels[4:], ["a", "b"], 30, torch.device("cpu"))
    assert isinstance(rows, pd.DataFrame) and len(rows) == 4
    means = rows.groupby("source")["dice"].mean()
    assert means["real"] > means["synthetic"]
