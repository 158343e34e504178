"""Head rows refitted from nothing on a site's own images: a logistic regression per finding on the pooled features
the model's head reads, L2-regularised, its strength chosen on held-out images.

A row fitted so has never seen what the site's images never show, so a trigger another site taught the global row
(a backdoor: Gu, Dolan-Gavitt and Garg, *BadNets*, 2017) is not in it. It is the last-layer re-initialisation Sha, He,
Berrang, Humbert and Zhang found to remove backdoors (*Fine-Tuning Is All You Need to Mitigate Backdoor Attacks*,
2022), with the backbone frozen. Used by ``evaluate --refit-rows-out`` (a site's own copy of the model) and by
``benchmarks/backdoor_refit.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.linear_model import LogisticRegression

from ..evaluation.metrics import bce_loss

# scikit-learn's inverse regularisation strength, chosen on held-out images (the first offline runs, stop 106, chose
# the lowest of 0.01-1, so the grid reaches down to 3e-4)
C_GRID = (0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
MAX_ITERATIONS = 5000

Split = tuple[np.ndarray, np.ndarray, np.ndarray]  # (features, labels, label mask), one row per image


@dataclass(frozen=True)
class RefitRow:
    weights: np.ndarray  # on the features as the head reads them (not standardised)
    bias: float
    strength: float  # the C chosen


def _fit(
    strength: float, images: np.ndarray, targets: np.ndarray, centre: np.ndarray, scale: np.ndarray
) -> LogisticRegression:
    return LogisticRegression(C=strength, max_iter=MAX_ITERATIONS).fit((images - centre) / scale, targets)


def refit_rows(train: Split, held_out: Split, refit_on_both: bool = False) -> dict[int, RefitRow]:
    """Label column -> the row of a logistic regression of that column on standardised features, fitted on
    ``train``, C the value of :data:`C_GRID` with the lowest loss on ``held_out``; with ``refit_on_both`` fitted
    again on both at that C. Where ``held_out`` shows one class only or none, C is the grid's strongest
    regularisation (its lowest). A column ``train`` shows with one class only, or none, is left out: nothing to fit
    there, and its row stays as it was."""
    features, labels, mask = train
    centre, scale = features.mean(0), features.std(0) + 1e-6
    fitted = {}
    for column in range(labels.shape[1]):
        known, known_out = mask[:, column] > 0, held_out[2][:, column] > 0
        y, y_out = labels[known, column], held_out[1][known_out, column]
        if len(set(y)) < 2:
            continue
        choices = C_GRID if len(set(y_out)) == 2 else C_GRID[:1]  # nothing to choose C on: the strongest
        models = {strength: _fit(strength, features[known], y, centre, scale) for strength in choices}
        scaled_out = (held_out[0][known_out] - centre) / scale
        strength = (
            min(choices, key=lambda c: bce_loss(y_out, models[c].predict_proba(scaled_out)[:, 1]))
            if len(choices) > 1
            else choices[0]
        )
        model = models[strength]
        if refit_on_both and len(y_out):
            both = np.concatenate([features[known], held_out[0][known_out]]), np.concatenate([y, y_out])
            model = _fit(strength, *both, centre, scale)
        weights = model.coef_[0] / scale
        fitted[column] = RefitRow(weights, float(model.intercept_[0] - weights @ centre), strength)
    return fitted
