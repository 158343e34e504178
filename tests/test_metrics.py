from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, special, stats
from sklearn.metrics import log_loss, roc_auc_score

from surgical_aggregation.evaluation.metrics import (
    align_by_name,
    bce_loss,
    bce_loss_standard_error,
    bootstrap_ci,
    image_losses,
    intercept_shifts,
    logit_intercept_shifts,
    mean_auroc_ci,
    mean_defined,
    paired_auroc_difference,
    paired_loss_difference,
    paired_t_test,
    per_class_auroc,
    recalibrated_probabilities,
)

RNG = np.random.default_rng(7)
Y = (RNG.random((60, 3)) < 0.4).astype(float)
P = np.clip(Y * 0.3 + RNG.random((60, 3)) * 0.7, 0, 1)


def test_per_class_auroc_matches_sklearn_and_single_valued_class_is_undefined():
    labels = Y.copy()
    labels[:, 2] = 0.0  # no positives: AUROC undefined
    result = per_class_auroc(labels, P, ["Mass", "Nodule", "Hernia"])
    assert result["Mass"] == pytest.approx(roc_auc_score(labels[:, 0], P[:, 0]), abs=1e-12)
    assert result["Nodule"] == pytest.approx(roc_auc_score(labels[:, 1], P[:, 1]), abs=1e-12)
    assert math.isnan(result["Hernia"])
    assert mean_defined(result) == pytest.approx((result["Mass"] + result["Nodule"]) / 2, abs=1e-12)


def test_auroc_equals_sklearns_with_ties_and_all_equal_scores():
    """The rank statistic is sklearn's AUROC, ties counted one half (coarse scores have many)."""
    from surgical_aggregation.evaluation.metrics import auroc

    labels = (RNG.random(300) < 0.2).astype(float)
    for scores in (RNG.random(300), np.round(RNG.random(300), 1), np.zeros(300), labels * 0.5 + 0.25):
        assert auroc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    assert auroc(labels, np.zeros(300)) == 0.5
    assert math.isnan(auroc(np.zeros(10), RNG.random(10))) and math.isnan(auroc(np.ones(10), RNG.random(10)))


def test_masked_entries_are_left_out():
    mask = np.ones_like(Y)
    mask[:20, 0] = 0
    result = per_class_auroc(Y, P, ["a", "b", "c"], mask)
    assert result["a"] == pytest.approx(roc_auc_score(Y[20:, 0], P[20:, 0]), abs=1e-12)
    labels = Y.copy()
    labels[:20, 0] = np.nan  # NaN labels behave like masked ones
    assert per_class_auroc(labels, P, ["a", "b", "c"])["a"] == pytest.approx(result["a"], abs=1e-12)


def test_align_by_name_uses_shared_classes_in_test_order():
    scores = np.arange(12, dtype=float).reshape(4, 3)  # model columns: Edema, Mass, Hernia
    labels = np.array([[1, 0], [0, 1], [1, 1], [0, 0]], dtype=float)  # test columns: Mass, Fracture
    aligned = align_by_name(scores, ["Edema", "Mass", "Hernia"], labels, ["Mass", "Fracture"])
    assert aligned.class_names == ["Mass"]
    assert aligned.missing_in_model == ["Fracture"]
    np.testing.assert_array_equal(aligned.y_score[:, 0], scores[:, 1])
    np.testing.assert_array_equal(aligned.y_true[:, 0], labels[:, 0])


def test_bce_loss_matches_sklearn():
    assert bce_loss(Y, P) == pytest.approx(log_loss(Y.ravel(), np.clip(P.ravel(), 1e-7, 1 - 1e-7)), abs=1e-9)
    mask = np.zeros_like(Y)
    mask[:, 1] = 1
    assert bce_loss(Y, P, mask) == pytest.approx(log_loss(Y[:, 1], np.clip(P[:, 1], 1e-7, 1 - 1e-7)), abs=1e-9)


def test_the_loss_standard_error_is_the_spread_of_images_losses_by_hand():
    labels = np.array([[1, 0], [0, np.nan], [1, 1], [0, 0]])
    probabilities = np.array([[0.9, 0.2], [0.3, 0.5], [0.6, 0.7], [0.1, 0.4]])
    per_image = [  # each image's mean loss over its labelled entries (the second has one)
        (-math.log(0.9) - math.log(0.8)) / 2,
        -math.log(0.7),
        (-math.log(0.6) - math.log(0.7)) / 2,
        (-math.log(0.9) - math.log(0.6)) / 2,
    ]
    mean = sum(per_image) / 4
    by_hand = math.sqrt(sum((value - mean) ** 2 for value in per_image) / 3) / 2
    assert bce_loss_standard_error(labels, probabilities) == pytest.approx(by_hand, abs=1e-12)
    assert by_hand == pytest.approx(0.0567224, abs=1e-6)
    mask = np.array([[1, 1], [1, 0], [0, 0], [1, 1]])  # the third image has no labelled entry: left out
    kept = [per_image[0], per_image[1], per_image[3]]
    expected = np.std(kept, ddof=1) / math.sqrt(3)
    assert bce_loss_standard_error(labels, probabilities, mask) == pytest.approx(expected, abs=1e-12)
    assert math.isnan(bce_loss_standard_error(labels[:1], probabilities[:1]))  # one image: no spread


def test_bootstrap_ci_is_a_percentile_bootstrap():
    values = RNG.normal(size=40)
    ci = bootstrap_ci(lambda idx: float(values[idx].mean()), 40, n_resamples=500, seed=3)
    rng = np.random.default_rng(3)
    manual = [values[rng.integers(0, 40, 40)].mean() for _ in range(500)]
    assert ci.estimate == pytest.approx(values.mean(), abs=1e-12)
    assert ci.low == pytest.approx(np.percentile(manual, 2.5), abs=1e-12)
    assert ci.high == pytest.approx(np.percentile(manual, 97.5), abs=1e-12)
    assert ci.low < ci.estimate < ci.high


def test_mean_auroc_ci_brackets_the_estimate():
    ci = mean_auroc_ci(Y, P, ["a", "b", "c"], n_resamples=200, seed=0)
    assert ci.estimate == pytest.approx(mean_defined(per_class_auroc(Y, P, ["a", "b", "c"])), abs=1e-12)
    assert ci.low <= ci.estimate <= ci.high
    assert str(ci).startswith(f"{ci.estimate:.3f} (")


def test_paired_t_test_matches_scipy():
    a = np.array([0.81, 0.77, 0.69, 0.88, 0.74, 0.79, 0.83, 0.71])
    b = np.array([0.78, 0.76, 0.61, 0.85, 0.70, 0.80, 0.75, 0.69])
    result = paired_t_test(a, b)
    expected = stats.ttest_rel(a, b)
    w, p_normal = stats.shapiro(a - b)
    assert result.n == 8
    assert result.t_statistic == pytest.approx(expected.statistic, abs=1e-12)
    assert result.p_value == pytest.approx(expected.pvalue, abs=1e-12)
    assert result.shapiro_w == pytest.approx(w, abs=1e-12)
    assert result.shapiro_p == pytest.approx(p_normal, abs=1e-12)
    assert result.wilcoxon_p == pytest.approx(stats.wilcoxon(a - b).pvalue, abs=1e-12)
    assert result.mean_difference == pytest.approx(np.mean(a - b), abs=1e-12)


def test_paired_t_test_drops_undefined_pairs():
    result = paired_t_test([0.8, np.nan, 0.7, 0.9], [0.7, 0.6, np.nan, 0.85])
    assert result.n == 2
    with pytest.raises(ValueError, match="at least 2 defined pairs"):
        paired_t_test([0.8, np.nan], [0.7, 0.6])


def test_paired_t_test_of_identical_scores_has_no_normality_check():
    result = paired_t_test([0.7, 0.8, 0.9], [0.7, 0.8, 0.9])
    assert result.mean_difference == 0.0 and math.isnan(result.shapiro_p) and result.wilcoxon_p == 1.0


def test_image_losses_and_their_paired_difference_by_hand():
    labels = np.array([[1.0, 0.0], [0.0, np.nan], [1.0, 1.0]])
    first = np.array([[0.9, 0.2], [0.3, 0.5], [0.6, 0.8]])
    second = np.array([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])
    by_hand = np.array([(-math.log(0.9) - math.log(0.8)) / 2, -math.log(0.7), (-math.log(0.6) - math.log(0.8)) / 2])
    np.testing.assert_allclose(image_losses(labels, first), by_hand, rtol=1e-12)
    differences = by_hand - np.full(3, -math.log(0.5))
    mean, error = paired_loss_difference(image_losses(labels, first), image_losses(labels, second))
    assert mean == pytest.approx(differences.mean(), rel=1e-12)
    assert error == pytest.approx(differences.std(ddof=1) / math.sqrt(3), rel=1e-12)
    assert np.isnan(image_losses(np.array([[np.nan]]), np.array([[0.5]]))[0])  # an image with no label


def _logit(probabilities: np.ndarray) -> np.ndarray:
    return np.log(probabilities) - np.log1p(-probabilities)


def test_recalibration_in_the_large_shifts_each_class_to_its_smoothed_prevalence():
    labels = Y.copy()
    labels[:10, 1] = np.nan  # unlabelled entries count for nothing
    mask = np.ones_like(labels, dtype=bool)
    mask[10:15, 2] = False
    recalibrated = recalibrated_probabilities(labels, P, mask)
    for column in range(3):
        kept = ~np.isnan(labels[:, column]) & mask[:, column]
        cases, count = labels[kept, column].sum(), kept.sum()
        assert recalibrated[kept, column].mean() == pytest.approx((cases + 0.5) / (count + 1), abs=1e-12)
        # one shift of the logits per class, found independently by Brent's method on the same equation
        logits = _logit(np.clip(P[kept, column], 1e-7, 1 - 1e-7))
        target = (cases + 0.5) / (count + 1)
        shift = optimize.brentq(lambda b, x=logits, t=target: special.expit(x + b).mean() - t, -40, 40)
        np.testing.assert_allclose(
            _logit(recalibrated[:, column]) - _logit(np.clip(P[:, column], 1e-7, 1 - 1e-7)), shift, atol=1e-9
        )
        # the ranking is the model's own
        assert per_class_auroc(labels[kept, column : column + 1], recalibrated[kept, column : column + 1], ["c"])[
            "c"
        ] == (
            pytest.approx(per_class_auroc(labels[kept, column : column + 1], P[kept, column : column + 1], ["c"])["c"])
        )


def test_the_intercept_shifts_are_the_recalibrations_and_none_where_no_image_is_labelled():
    """The shifts ``evaluate --recalibrate-out`` writes into a model's head biases: a worked example (a constant 0.5
    on four images, one a case: the mean must become 1.5 / 5, so the shift is logit(0.3)), the shift of every class
    that :func:`recalibrated_probabilities` applies, and 0 for a class no image labels."""
    assert intercept_shifts(np.array([1.0, 0, 0, 0]), np.full(4, 0.5)) == pytest.approx(math.log(0.3 / 0.7), abs=1e-12)
    labels = Y.copy()
    labels[:, 1] = np.nan  # the second class labelled on no image
    shifts = intercept_shifts(labels, P)
    assert shifts.shape == (3,) and shifts[1] == 0.0
    moved = _logit(recalibrated_probabilities(labels, P)) - _logit(np.clip(P, 1e-7, 1 - 1e-7))
    np.testing.assert_allclose(moved, np.broadcast_to(shifts, P.shape), atol=1e-9)


def test_a_models_own_logits_are_recalibrated_however_far_they_saturate():
    """From its logits, a row 30 below any prevalence is shifted to it: the mean probability is the target, where
    probabilities clipped at 1e-7 cap every logit near -16 and the shift falls 14 short."""
    logits = np.linspace(-31.0, -29.0, 200)
    labels = (np.arange(200) % 10 < 3).astype(float)  # 60 cases of 200
    target = (60 + 0.5) / (200 + 1)
    shift = logit_intercept_shifts(labels, logits)
    assert special.expit(logits + shift).mean() == pytest.approx(target, abs=1e-12)
    clipped = intercept_shifts(labels, special.expit(logits))
    assert special.expit(logits + clipped).mean() < 1e-5


def test_a_model_shifted_in_its_base_rate_recalibrates_to_the_same_probabilities():
    shifted = special.expit(_logit(np.clip(P, 1e-7, 1 - 1e-7)) + np.array([-4.0, 2.5, 0.7]))
    np.testing.assert_allclose(recalibrated_probabilities(Y, shifted), recalibrated_probabilities(Y, P), atol=1e-9)
    # a finding without a case in the images keeps a finite intercept: its mean is half a case in n + 1
    none = recalibrated_probabilities(np.zeros((4, 1)), np.full((4, 1), 0.9))
    np.testing.assert_allclose(none, 0.1, atol=1e-12)
    np.testing.assert_allclose(recalibrated_probabilities(Y[:, 0], P[:, 0]), recalibrated_probabilities(Y, P)[:, 0])
    # an entry without a score counts for nothing: the class is recalibrated on the others, as if it were unlabelled
    unscored, unlabelled = P.copy(), Y.copy()
    unscored[0, 0], unlabelled[0, 0] = np.nan, np.nan
    recalibrated = recalibrated_probabilities(Y, unscored)
    assert np.isnan(recalibrated[0, 0])
    np.testing.assert_allclose(recalibrated[1:], recalibrated_probabilities(unlabelled, P)[1:], atol=1e-12)


@pytest.mark.slow
def test_the_paired_auroc_difference_is_the_difference_of_mean_aurocs_with_a_bootstrap_error():
    generator = np.random.default_rng(3)
    labels = (generator.random((200, 3)) < 0.3).astype(float)
    better = labels + generator.normal(0, 0.6, labels.shape)
    worse = labels + generator.normal(0, 1.2, labels.shape)
    mean, error = paired_auroc_difference(labels, better, worse)
    by_hand = np.mean(
        [roc_auc_score(labels[:, c], better[:, c]) - roc_auc_score(labels[:, c], worse[:, c]) for c in range(3)]
    )
    assert mean == pytest.approx(by_hand, abs=1e-12)
    # the bootstrap's error against a slow bootstrap written out by hand (same draws: multinomial counts as rows)
    draws = np.random.default_rng(0).multinomial(200, np.full(200, 1 / 200), size=200)
    resampled = []
    for counts in draws:
        rows = np.repeat(np.arange(200), counts)
        differences = [
            roc_auc_score(labels[rows, c], better[rows, c]) - roc_auc_score(labels[rows, c], worse[rows, c])
            for c in range(3)
        ]
        resampled.append(np.mean(differences))
    assert error == pytest.approx(np.std(resampled, ddof=1), rel=1e-9)
    assert paired_auroc_difference(labels, better, better) == (0.0, 0.0)
    undefined = paired_auroc_difference(np.zeros((5, 1)), np.ones((5, 1)), np.ones((5, 1)))
    assert all(math.isnan(value) for value in undefined)  # no positive image: no AUROC


def test_score_specificity_tells_one_shared_score_from_finding_specific_ones():
    from surgical_aggregation.evaluation.metrics import score_specificity

    labels = np.array([[1, 0], [0, 1], [1, 1], [0, 0]], dtype=float)
    specific = np.array([[0.9, 0.2], [0.1, 0.8], [0.8, 0.7], [0.3, 0.1]])  # each class ranks its own positives first
    found = score_specificity(labels, specific)
    # by hand: the mean logits are 0.41, -0.41, 1.12, -1.52: class 0 still ranks both positives first (AUROC 1),
    # class 1 puts a negative (0.41) above a positive (-0.41): 3/4; its own scores give 1 for both
    logits = np.log(specific / (1 - specific))
    assert found.logit_correlation == pytest.approx(np.corrcoef(logits[:, 0], logits[:, 1])[0, 1])
    assert found.shared_score_auroc_loss == pytest.approx(1.0 - (1.0 + 0.75) / 2)
    generic = np.array([[0.6, 0.6], [0.5, 0.5], [0.9, 0.9], [0.1, 0.1]])  # one score for both
    same = score_specificity(labels, generic)
    assert same.logit_correlation == pytest.approx(1.0) and same.shared_score_auroc_loss == pytest.approx(0.0)
