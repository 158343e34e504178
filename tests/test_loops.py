from __future__ import annotations

import pytest
import torch

from surgical_aggregation.images.dataset import ChestXrayDataset, cache_table
from surgical_aggregation.images.layouts import load_table
from surgical_aggregation.images.model import NamedDenseNet
from surgical_aggregation.images.transforms import image_batch_transform
from surgical_aggregation.training.loops import evaluate, make_loader, masked_bce_with_logits, train_epoch


def test_masked_bce_counts_only_labelled_entries():
    logits = torch.tensor([[2.0, -1.0], [0.5, 3.0]])
    target = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    full = torch.nn.functional.binary_cross_entropy_with_logits(logits, target, reduction="none")
    expected = (full[0, 0] + full[1, 0] + full[1, 1]) / 3
    assert masked_bce_with_logits(logits, target, mask).item() == pytest.approx(expected.item(), abs=1e-7)


@pytest.mark.slow
def test_densenet_trained_a_few_steps_on_generated_data_lowers_its_loss(nih_data, tmp_path):
    torch.manual_seed(0)
    table, cache, _ = cache_table(load_table("nih", nih_data.root), tmp_path / "cache", 32, progress=False)
    dataset = ChestXrayDataset(table, cache, image_batch_transform(32, train=False))
    loader = make_loader(dataset, batch_size=16, train=True, seed=0)
    fixed = make_loader(dataset, batch_size=64, train=False)
    model = NamedDenseNet(table.classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    device = torch.device("cpu")
    before = evaluate(model, fixed, device, table.classes)
    for _ in range(3):
        train_epoch(model, loader, optimizer, device)
    after = evaluate(model, fixed, device, table.classes)
    assert after.loss < 0.8 * before.loss, (before.loss, after.loss)
    assert set(after.per_class_auroc) == set(table.classes)
