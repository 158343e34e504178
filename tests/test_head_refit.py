"""Head rows refitted from nothing on a site's own images (training.head_refit: evaluate --refit-rows-out's fit)."""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression

from surgical_aggregation.evaluation.metrics import bce_loss
from surgical_aggregation.training.head_refit import C_GRID, refit_rows


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
    assert sorted(rows) == [0, 1]  # column 2: negatives only, nothing to fit: its row stays as it was
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
    # nothing to choose C on (one class held out, or no held-out image labelled): the grid's strongest regularisation
    held[2][:, 1] = 0.0
    held[1][:, 0] = 1.0
    again = refit_rows(train, held, refit_on_both=True)
    assert again[0].strength == again[1].strength == C_GRID[0]
    alone = LogisticRegression(C=C_GRID[0], max_iter=5000).fit(
        (train[0][train[2][:, 1] > 0] - centre) / scale, train[1][train[2][:, 1] > 0, 1]
    )  # column 1: no held-out image to fit again on, so the training split's fit
    np.testing.assert_allclose(
        held[0] @ again[1].weights + again[1].bias, alone.decision_function((held[0] - centre) / scale), atol=1e-9
    )
    train[2][:, 0] = 0.0  # a column no training image labels: left out
    assert sorted(refit_rows(train, held)) == [1]
