"""Head rows refitted from nothing on a site's own images (training.head_refit, the site setting refit_head_rows)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from surgical_aggregation.core.checks.update import ROW_NORM_FLOOR, ROWS, UPDATE_CAPS
from surgical_aggregation.core.errors import SiteConfigError
from surgical_aggregation.core.head import NAMED_HEAD
from surgical_aggregation.evaluation.metrics import bce_loss
from surgical_aggregation.images.names import SMOKE_DENSENET
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.head_refit import C_GRID, held_out_split, refit_rows
from surgical_aggregation.training.loops import head_inputs, make_loader
from surgical_aggregation.training.site_data import prepare_site_data
from surgical_aggregation.training.trainer import REFIT_STEP_SHARE, SiteTrainer, _ReadAsValidated

W, B = NAMED_HEAD.keys


def _split(rng: np.random.Generator, count: int, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    features = rng.normal(2.0, 3.0, size=(count, truth.shape[1]))
    labels = (rng.random((count, len(truth))) < 1 / (1 + np.exp(-(features - 2.0) / 3.0 @ truth.T))).astype(float)
    labels[:, 2] = 0.0  # one class only: nothing to fit
    mask = np.ones_like(labels)
    mask[: count // 4, 1] = 0.0  # column 1 unlabelled on a quarter of the images
    return features, labels, mask


def test_a_refitted_row_is_the_held_out_best_logistic_regression_in_the_heads_units():
    rng = np.random.default_rng(0)
    truth = rng.normal(size=(3, 6))
    train, held = _split(rng, 240, truth), _split(rng, 80, truth)
    rows = refit_rows(train, held)
    assert sorted(rows) == [0, 1, 2]
    # column 2: negatives only, so the prior alone (a half added to the positives, one to the count)
    assert rows[2].strength is None and not rows[2].weights.any()
    assert rows[2].bias == pytest.approx(np.log(0.5 / 321) - np.log(1 - 0.5 / 321))
    centre, scale = train[0].mean(0), train[0].std(0) + 1e-6
    for column in (0, 1):
        row = rows[column]
        known, known_held = train[2][:, column] > 0, held[2][:, column] > 0
        losses = {}
        for strength in C_GRID:
            model = LogisticRegression(C=strength, max_iter=5000).fit(
                (train[0][known] - centre) / scale, train[1][known, column]
            )
            probabilities = model.predict_proba((held[0][known_held] - centre) / scale)[:, 1]
            losses[strength] = (bce_loss(held[1][known_held, column], probabilities), model)
        chosen = min(losses, key=lambda strength: losses[strength][0])
        assert row.strength == chosen
        expected = losses[chosen][1].decision_function((held[0] - centre) / scale)
        np.testing.assert_allclose(held[0] @ row.weights + row.bias, expected, atol=1e-9)  # raw features, as the head
    both = refit_rows(train, held, refit_on_both=True)
    assert [both[column].strength for column in both] == [rows[column].strength for column in rows]
    known = np.concatenate([train[2][:, 0], held[2][:, 0]]) > 0
    again = LogisticRegression(C=both[0].strength, max_iter=5000).fit(
        (np.concatenate([train[0], held[0]])[known] - centre) / scale, np.concatenate([train[1], held[1]])[known, 0]
    )
    np.testing.assert_allclose(
        held[0] @ both[0].weights + both[0].bias, again.decision_function((held[0] - centre) / scale), atol=1e-9
    )
    held[1][:, 0] = 1.0  # nothing to choose C on: the grid's strongest regularisation
    assert refit_rows(train, held)[0].strength == C_GRID[0]


def test_the_held_out_patients_take_all_their_images_and_are_the_same_for_a_seed():
    patients = [f"p{index // 3}" for index in range(60)]  # 20 patients of 3 images
    kept, held = held_out_split(patients, seed=4)
    assert len(held) == 12 and len(kept) == 48  # 4 of 20 patients (a fifth), every image of each
    assert not {patients[index] for index in kept} & {patients[index] for index in held}
    assert sorted([*kept, *held]) == list(range(60))
    assert np.array_equal(held_out_split(patients, seed=4)[1], held)
    assert not np.array_equal(held_out_split(patients, seed=5)[1], held)
    assert len(held_out_split(["a", "a", "b"], seed=0)[0]) >= 1  # never every patient
    with pytest.raises(ValueError, match="1 patient"):
        held_out_split(["a", "a"], seed=0)


def _config(nih_data, cache, **settings):
    values = {
        "data": {"kind": "nih", "location": str(nih_data.root), "labels": ["Mass", "Effusion", "Atelectasis"]},
        "image_size": 32,
        "batch_size": 8,
        "max_batches_per_epoch": 2,
        "warmup_epochs": 0,
        "learning_rate": 1e-3,
        "cache_dir": str(cache),
        "cpu_threads": 2,
        "network": SMOKE_DENSENET,
        **settings,
    }
    return site_config_from_dict(values, "site-refit.json")


def test_a_site_that_refits_sends_the_rows_its_own_images_give_whatever_rows_it_received(nih_data, tmp_path):
    """After the local epochs the site's rows are the logistic regressions of its training images' features (read
    without augmentation) under the trained backbone: a row the site received (a backdoor's, say) does not stay."""
    config = _config(nih_data, tmp_path / "cache", refit_head_rows=True)
    trainer = SiteTrainer(config, prepare_site_data(config), "site-refit")
    received = trainer.state_dict()
    received[W] *= 100.0  # rows large enough for the whole step (the next test: a small one)
    received[W][0] = 50.0  # a row pushed far in every direction
    received[B][0] = 9.0
    trainer.load_global(received, trainer.class_names)
    report = trainer.fit(0, warmup=False)
    assert report.refitted_rows == 3
    state = trainer.state_dict()
    loader = make_loader(_ReadAsValidated(trainer.data.train, trainer.data.val), 64, False)
    features, labels, mask = (part.double().numpy() for part in head_inputs(trainer.model, loader, trainer.device))
    kept, held = held_out_split(trainer._training_patients(), config.seed)
    rows = refit_rows(
        (features[kept], labels[kept], mask[kept]), (features[held], labels[held], mask[held]), refit_on_both=True
    )
    for column, row in rows.items():
        np.testing.assert_allclose(state[W][column].double().numpy(), row.weights, rtol=1e-5, atol=1e-6)
        assert state[B][column].item() == pytest.approx(row.bias, abs=1e-5)
    assert state[W][0].abs().max() < 5.0  # the pushed row is gone


def test_a_refitted_row_moves_at_most_nine_times_the_received_rows_size(nih_data, tmp_path):
    """Inside the server's cap on a row's update (ten times its size): a row received near zero moves towards its
    refit by 0.9 (the floor 0.1 on a row's size, times 9), in the refit's direction."""
    config = _config(nih_data, tmp_path / "cache", refit_head_rows=True)
    trainer = SiteTrainer(config, prepare_site_data(config), "site-refit")
    received = trainer.state_dict()
    received[W][1], received[B][1] = 0.0, 0.0
    received[W][2] *= 100.0  # a large row: room for the whole refit
    trainer.load_global(received, trainer.class_names)
    trainer.fit(0, warmup=False)
    state = trainer.state_dict()
    moved = torch.cat([state[W][1], state[B][1:2]]).double()
    assert float(moved.norm()) == pytest.approx(REFIT_STEP_SHARE * ROW_NORM_FLOOR, rel=1e-5)
    assert UPDATE_CAPS[ROWS] > REFIT_STEP_SHARE  # inside the server's cap
    loader = make_loader(_ReadAsValidated(trainer.data.train, trainer.data.val), 64, False)
    features, labels, mask = (part.double().numpy() for part in head_inputs(trainer.model, loader, trainer.device))
    kept, held = held_out_split(trainer._training_patients(), config.seed)
    rows = refit_rows(
        (features[kept], labels[kept], mask[kept]), (features[held], labels[held], mask[held]), refit_on_both=True
    )
    refit = np.append(rows[1].weights, rows[1].bias)
    np.testing.assert_allclose(moved.numpy() / float(moved.norm()), refit / np.linalg.norm(refit), atol=1e-5)
    np.testing.assert_allclose(state[W][2].double().numpy(), rows[2].weights, rtol=1e-5, atol=1e-6)


def test_a_site_without_the_setting_keeps_training_its_rows(nih_data, tmp_path):
    config = _config(nih_data, tmp_path / "cache")
    trainer = SiteTrainer(config, prepare_site_data(config), "site-plain")
    received = trainer.state_dict()
    received[W][0] = 50.0
    trainer.load_global(received, trainer.class_names)
    assert trainer.fit(0, warmup=False).refitted_rows == 0
    assert trainer.state_dict()[W][0].min() > 49.0  # two Adam steps at 1e-3 move it by about 2e-3


def test_a_refit_is_refused_beside_dp_sgd(nih_data, tmp_path):
    with pytest.raises(SiteConfigError, match=r"site-refit.json: refit_head_rows cannot be true with differential"):
        _config(nih_data, tmp_path, refit_head_rows=True, differential_privacy={"epsilon": 8.0, "planned_rounds": 5})
