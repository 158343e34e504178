from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from surgical_aggregation.images.dataset import ChestXrayDataset, cache_table
from surgical_aggregation.images.layouts import load_table
from surgical_aggregation.images.model import NamedDenseNet
from surgical_aggregation.images.transforms import image_batch_transform
from surgical_aggregation.training.loops import (
    BatchNormReadings,
    Evaluation,
    evaluate,
    make_loader,
    masked_bce_with_logits,
    train_epoch,
)


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


def test_batchnorm_readings_give_each_layers_mean_kl_from_its_running_statistics():
    """A worked example: two channels whose inputs have mean (1, -2) and variance (4, 0.25) over the images and
    positions, read by a layer that assumes means (0, -2) and variances (1, 1): per channel
    KL(N(m, v) || N(mu, s)) = (ln(s / v) + (v + (m - mu)^2) / s - 1) / 2 (eps added to each variance), the layer's
    figure their mean; the second layer (after a ReLU) is read too, and the hooks leave with the block."""
    first, second = torch.nn.BatchNorm2d(2), torch.nn.BatchNorm2d(2)
    first.running_mean.copy_(torch.tensor([0.0, -2.0]))
    model = torch.nn.Sequential(first, torch.nn.ReLU(), second).eval()
    signs = torch.tensor([1.0, -1.0, 1.0, -1.0]).reshape(1, 1, 2, 2)
    images = torch.cat([1 + 2 * signs, -2 + 0.5 * signs], dim=1).repeat(3, 1, 1, 1)  # exact moments per channel
    with BatchNormReadings(model) as readings:
        model(images[:1])
        model(images[1:])
    eps = first.eps
    expected = [
        0.5 * (math.log((1 + eps) / (4 + eps)) + (4 + eps + 1) / (1 + eps) - 1),
        0.5 * (math.log((1 + eps) / (0.25 + eps)) + (0.25 + eps) / (1 + eps) - 1),
    ]
    divergences = readings.divergences()
    assert divergences.shape == (2,)
    assert divergences[0] == pytest.approx(sum(expected) / 2, abs=1e-9)
    outputs = torch.relu(first(images)).detach()
    mean = outputs.mean(dim=(0, 2, 3))
    variance = outputs.var(dim=(0, 2, 3), unbiased=False) + eps
    by_channel = 0.5 * (torch.log((1 + eps) / variance) + (variance + mean.square()) / (1 + eps) - 1)
    assert divergences[1] == pytest.approx(float(by_channel.mean()), abs=1e-6)
    assert not first._forward_hooks and not second._forward_hooks
    assert BatchNormReadings(model).divergences() is None  # nothing read yet


def test_a_models_batchnorm_figure_against_another_is_its_largest_layer_difference():
    one = Evaluation(
        loss=0.5, per_class_auroc={}, mean_auroc=0.5, samples=4, batchnorm_divergences=np.array([0.1, 2.0])
    )
    other = Evaluation(
        loss=0.5, per_class_auroc={}, mean_auroc=0.5, samples=4, batchnorm_divergences=np.array([0.5, 0.2])
    )
    assert one.compared_with(other)["batchnorm"] == pytest.approx(1.8)
    assert other.compared_with(one)["batchnorm"] == pytest.approx(0.4)
    other.batchnorm_divergences = None
    assert math.isnan(one.compared_with(other)["batchnorm"])


def test_a_sites_batchnorm_readings_survive_a_restart_and_leave_as_its_paired_figure(tmp_path):
    """The site's round memory keeps each evaluation's BatchNorm readings (without them a restarted site would send no
    figure and the two-site rule would not judge it); a memory written before they were kept reads them as None; and
    the paired figure a site sends is the largest layer difference."""
    from surgical_aggregation.flare.client import _evaluation_from, _evaluation_payload, paired_figures

    def evaluated(readings: list[float]) -> Evaluation:
        labels, probabilities = np.array([[1.0], [0.0], [1.0], [0.0]]), np.array([[0.8], [0.3], [0.6], [0.4]])
        evaluation = Evaluation.of(labels, probabilities, ["Mass"], None)
        evaluation.batchnorm_divergences = np.array(readings)
        return evaluation

    own, candidate = evaluated([0.1, 0.2, 0.3]), evaluated([0.15, 1.4, 0.2])
    path = tmp_path / "memory.pt"
    torch.save({"own": _evaluation_payload(own)}, path)
    restored = _evaluation_from(torch.load(path, weights_only=True)["own"])
    np.testing.assert_array_equal(restored.batchnorm_divergences, own.batchnorm_divergences)
    figures = paired_figures(candidate, restored, "own")
    assert figures["val_batchnorm_minus_own"] == pytest.approx(1.2)
    assert figures["val_loss_minus_own"] == pytest.approx(0.0)
    older = {key: value for key, value in _evaluation_payload(own).items() if key != "batchnorm_divergences"}
    assert _evaluation_from(older).batchnorm_divergences is None
    assert "val_batchnorm_minus_own" not in paired_figures(candidate, _evaluation_from(older), "own")
