"""Evaluation: per-class AUROC matched by class name, BCE loss, bootstrap CIs, paired tests, and
accuracy / sensitivity / specificity at a Youden threshold.

A class whose test labels are all one value has no AUROC: it is reported as NaN
("undefined") and left out of means, never a crash.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats
from sklearn.metrics import roc_curve


def _valid_mask(y_true: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    valid = ~np.isnan(y_true)
    if mask is not None:
        valid &= np.asarray(mask, dtype=bool)
    return valid


def auroc(y_true: np.ndarray, y_score: np.ndarray) -> float:
    """AUROC of one class; NaN when the labels hold a single value (undefined).

    The Mann-Whitney statistic from the scores' ranks (ties averaged, so a tie counts one half), which is
    scikit-learn's ``roc_auc_score`` without its per-call input checks (a grid computes it thousands of times)."""
    y_true = np.asarray(y_true, dtype=np.float64)
    positive = y_true == 1
    positives = int(positive.sum())
    negatives = y_true.size - positives
    if positives == 0 or negatives == 0:
        return math.nan
    ranks = stats.rankdata(np.asarray(y_score, dtype=np.float64))
    return float((ranks[positive].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def per_class_auroc(
    y_true: np.ndarray,
    y_score: np.ndarray,
    class_names: Sequence[str],
    mask: np.ndarray | None = None,
) -> dict[str, float]:
    """AUROC per class (columns of ``y_true``/``y_score`` in ``class_names`` order).

    Entries that are NaN in ``y_true`` or False in ``mask`` (e.g. uncertain labels under the
    "ignore" policy) are left out of that class's AUROC.
    """
    y_true = np.asarray(y_true, dtype=np.float64)
    y_score = np.asarray(y_score, dtype=np.float64)
    if y_true.shape != y_score.shape or y_true.ndim != 2 or y_true.shape[1] != len(class_names):
        raise ValueError(f"labels {y_true.shape} and scores {y_score.shape} must both be (samples, {len(class_names)})")
    valid = _valid_mask(y_true, mask)
    return {
        name: auroc(y_true[valid[:, column], column], y_score[valid[:, column], column])
        for column, name in enumerate(class_names)
    }


def mean_defined(values: Mapping[str, float] | Sequence[float]) -> float:
    """Mean over the defined (non-NaN) values; NaN when none is defined."""
    numbers = np.asarray(list(values.values()) if isinstance(values, Mapping) else list(values), dtype=np.float64)
    numbers = numbers[~np.isnan(numbers)]
    return float(numbers.mean()) if numbers.size else math.nan


@dataclass
class AlignedScores:
    """Model scores and test labels restricted to the classes both have, in test-set order."""

    class_names: list[str]
    y_true: np.ndarray
    y_score: np.ndarray
    mask: np.ndarray | None
    missing_in_model: list[str]  # test-set classes the model cannot predict


def align_by_name(
    y_score: np.ndarray,
    model_classes: Sequence[str],
    y_true: np.ndarray,
    test_classes: Sequence[str],
    mask: np.ndarray | None = None,
) -> AlignedScores:
    """Pick, by class name, the score columns that match the test set's label columns."""
    model_index = {name: column for column, name in enumerate(model_classes)}
    shared = [name for name in test_classes if name in model_index]
    test_index = {name: column for column, name in enumerate(test_classes)}
    test_columns = [test_index[name] for name in shared]
    return AlignedScores(
        class_names=shared,
        y_true=np.asarray(y_true)[:, test_columns],
        y_score=np.asarray(y_score)[:, [model_index[name] for name in shared]],
        mask=None if mask is None else np.asarray(mask)[:, test_columns],
        missing_in_model=[name for name in test_classes if name not in model_index],
    )


@dataclass(frozen=True)
class Specificity:
    """How finding-specific a model's scores are (issue: a full network can learn one generic "abnormal" score)."""

    logit_correlation: float  # the mean Pearson correlation of two classes' logits over the images (1: one score)
    shared_score_auroc_loss: float  # mean AUROC of its own scores minus that of every class ranked by one score


def score_specificity(
    y_true: np.ndarray, probabilities: np.ndarray, mask: np.ndarray | None = None, eps: float = 1e-7
) -> Specificity:
    """:class:`Specificity` of ``probabilities`` (images, classes): the mean pairwise correlation of the classes'
    logits, and what ranking every class by one shared score (the mean logit of the image) loses in mean AUROC
    (over the classes whose AUROC is defined)."""
    y_true = np.asarray(y_true, dtype=np.float64)
    clipped = np.clip(np.asarray(probabilities, dtype=np.float64), eps, 1 - eps)
    logits = np.log(clipped) - np.log1p(-clipped)
    columns = logits.shape[1]
    varying = [column for column in range(columns) if np.std(logits[:, column]) > 0]
    correlations = np.corrcoef(logits[:, varying], rowvar=False) if len(varying) > 1 else np.ones((1, 1))
    upper = correlations[np.triu_indices(len(varying), k=1)] if len(varying) > 1 else np.array([1.0])
    names = [str(column) for column in range(columns)]
    own = mean_defined(per_class_auroc(y_true, logits, names, mask))
    shared = np.repeat(logits.mean(axis=1, keepdims=True), columns, axis=1)
    common = mean_defined(per_class_auroc(y_true, shared, names, mask))
    return Specificity(float(np.mean(upper)), own - common)


def bce_loss(y_true: np.ndarray, y_prob: np.ndarray, mask: np.ndarray | None = None, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy over the labelled entries, from probabilities."""
    y_true = np.asarray(y_true, dtype=np.float64)
    y_prob = np.clip(np.asarray(y_prob, dtype=np.float64), eps, 1 - eps)
    valid = _valid_mask(y_true, mask)
    if not valid.any():
        return math.nan
    target = y_true[valid]
    prob = y_prob[valid]
    return float(-(target * np.log(prob) + (1 - target) * np.log(1 - prob)).mean())


def image_losses(
    y_true: np.ndarray, y_prob: np.ndarray, mask: np.ndarray | None = None, eps: float = 1e-7
) -> np.ndarray:
    """Each image's mean binary cross-entropy over its labelled entries (NaN for an image with none), float64: the
    per-image figures behind :func:`bce_loss_standard_error` and a paired comparison of two models on the same images
    (:func:`paired_loss_difference`)."""
    y_true = np.asarray(y_true, dtype=np.float64)
    y_prob = np.clip(np.asarray(y_prob, dtype=np.float64), eps, 1 - eps)
    if y_true.ndim == 1:
        y_true, y_prob = y_true[:, None], y_prob[:, None]
        mask = None if mask is None else np.asarray(mask)[:, None]
    valid = _valid_mask(y_true, mask)
    target = np.nan_to_num(y_true)
    losses = np.where(valid, -(target * np.log(y_prob) + (1 - target) * np.log(1 - y_prob)), 0.0)
    counts = valid.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, losses.sum(axis=1) / np.maximum(counts, 1), np.nan)


INTERCEPT_SEARCH = (-40.0, 40.0, 80)  # logit shifts searched (low, high) and bisection steps: 80 / 2**80 apart
SMOOTHING_CASES = 0.5  # each way: a finding with no case (or no non-case) in the validation keeps a finite intercept


def intercept_shifts(
    y_true: np.ndarray, y_prob: np.ndarray, mask: np.ndarray | None = None, eps: float = 1e-7
) -> np.ndarray:
    """Each class's recalibration in the large to these labels: the one shift of its logits that makes its mean
    probability over the labelled images equal their prevalence of it, smoothed by half a case each way ((k + 1/2) /
    (n + 1) for k cases of n; without the smoothing it is the shift that minimises the class's mean BCE); 0 for a
    class no image labels. (C,) for (N, C) inputs, a 0-d array for (N,) ones. Shifting one class's logits by a
    constant leaves its ranking (AUROC) as it is: what it changes is the class's base rate, which sites whose
    prevalences differ pull apart (the intercept update of clinical prediction models). From probabilities clipped
    to [eps, 1 - eps]: :func:`logit_intercept_shifts` fits a model's own logits, however large."""
    return logit_intercept_shifts(y_true, _clipped_logits(y_prob, eps), mask, INTERCEPT_SEARCH[1])


def _clipped_logits(y_prob: np.ndarray, eps: float) -> np.ndarray:
    """The logits of probabilities clipped to [eps, 1 - eps], in float64."""
    clipped = np.clip(np.asarray(y_prob, dtype=np.float64), eps, 1 - eps)
    return np.log(clipped) - np.log1p(-clipped)


def logit_intercept_shifts(
    y_true: np.ndarray, logits: np.ndarray, mask: np.ndarray | None = None, span: float | None = None
) -> np.ndarray:
    """:func:`intercept_shifts` of a model's logits as they are: the shift is searched within +-``span`` (default:
    the largest logit's size and 40 more, so that any labelled set's smoothed prevalence is reached)."""
    y_true = np.asarray(y_true, dtype=np.float64)
    logits = np.asarray(logits, dtype=np.float64)
    squeeze = y_true.ndim == 1
    if squeeze:
        y_true, logits = y_true[:, None], logits[:, None]
        mask = None if mask is None else np.asarray(mask)[:, None]
    valid = _valid_mask(y_true, mask) & np.isfinite(logits)  # an image without a score counts for nothing
    counts = valid.sum(axis=0)
    cases = np.where(valid, np.nan_to_num(y_true), 0.0).sum(axis=0)
    target = (cases + SMOOTHING_CASES) / (counts + 2 * SMOOTHING_CASES)
    if span is None:
        span = INTERCEPT_SEARCH[1] + float(np.abs(np.where(valid, logits, 0.0)).max(initial=0.0))
    low, high, steps = np.full(counts.shape, -span), np.full(counts.shape, span), INTERCEPT_SEARCH[2]
    for _ in range(steps):  # the mean probability rises with the shift: bisection, every class at once
        middle = (low + high) / 2
        mean = np.where(valid, sigmoid(np.where(valid, logits, 0.0) + middle), 0.0).sum(axis=0) / np.maximum(counts, 1)
        above = mean > target
        high, low = np.where(above, middle, high), np.where(above, low, middle)
    shift = np.where(counts > 0, (low + high) / 2, 0.0)
    return shift[0] if squeeze else shift


def labelled_counts(y_true: np.ndarray, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(C,) each: how many images label each class (a known 0 or 1, not masked out), and how many of them are
    cases."""
    y_true = np.asarray(y_true, dtype=np.float64)
    valid = _valid_mask(y_true, mask)
    return valid.sum(axis=0), np.where(valid, np.nan_to_num(y_true), 0.0).sum(axis=0)


def recalibrated_probabilities(
    y_true: np.ndarray, y_prob: np.ndarray, mask: np.ndarray | None = None, eps: float = 1e-7
) -> np.ndarray:
    """``y_prob`` recalibrated in the large to these labels (:func:`intercept_shifts`, "recalibration in the large"):
    what is left of a loss after it is the model's ranking and the spread of its scores, not its base rate."""
    logits = _clipped_logits(y_prob, eps)
    return sigmoid(logits + logit_intercept_shifts(y_true, logits, mask, INTERCEPT_SEARCH[1]))


def sigmoid(logits: np.ndarray | float) -> np.ndarray:
    """The logistic function in float64, without overflow for any logit."""
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(logits, dtype=np.float64)))


def bce_loss_standard_error(
    y_true: np.ndarray, y_prob: np.ndarray, mask: np.ndarray | None = None, eps: float = 1e-7
) -> float:
    """The standard error of :func:`bce_loss` across images: the standard deviation of each image's mean loss over
    its labelled entries, divided by the square root of the number of images (NaN with fewer than two)."""
    per_image = image_losses(y_true, y_prob, mask, eps)
    per_image = per_image[np.isfinite(per_image)]
    if per_image.size < 2:
        return math.nan
    return float(per_image.std(ddof=1) / math.sqrt(per_image.size))


def paired_loss_difference(losses: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """(mean, standard error) over images of ``losses - reference``: two models' per-image losses
    (:func:`image_losses`) on the same images, in the same order. The pairing removes what the images share (an easy
    or a hard image is so for both models), so the error is that of the difference itself. Images without a figure
    in either are left out; NaN, NaN with fewer than two."""
    losses, reference = np.asarray(losses, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if losses.shape != reference.shape:
        raise ValueError(f"paired losses need the same images: {losses.shape} against {reference.shape}")
    both = np.isfinite(losses) & np.isfinite(reference)
    if both.sum() < 2:
        return math.nan, math.nan
    difference = losses[both] - reference[both]
    return float(difference.mean()), float(difference.std(ddof=1) / math.sqrt(difference.size))


PAIRED_RESAMPLES = 200  # bootstrap resamples of a paired AUROC difference (seeded: the same figures on every run)


def _weighted_aurocs(truth: np.ndarray, scores: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """AUROC of ``scores`` against binary ``truth`` under each row of ``weights`` (resamples x images: how many times
    each image is drawn), vectorised over the resamples: the weighted Mann-Whitney statistic, ties counting a half."""
    order = np.argsort(scores, kind="stable")
    truth, scores, weights = truth[order], scores[order], weights[:, order]
    positive = truth == 1
    negative_weights = np.where(positive, 0.0, weights)
    # ties: a positive's tied negatives count a half (each run of equal scores shares one count)
    starts = np.r_[0, np.flatnonzero(np.diff(scores)) + 1]
    run = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, scores.size]))
    tied = np.zeros((weights.shape[0], starts.size))
    np.add.at(tied.T, run, negative_weights.T)
    below_run = np.cumsum(tied, axis=1) - tied  # negatives in earlier runs
    counted = below_run[:, run] + 0.5 * tied[:, run]
    numerator = np.sum(np.where(positive, weights * counted, 0.0), axis=1)
    pairs = np.sum(np.where(positive, weights, 0.0), axis=1) * np.sum(negative_weights, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(pairs > 0, numerator / pairs, np.nan)


def paired_auroc_difference(
    labels: np.ndarray,
    scores: np.ndarray,
    reference: np.ndarray,
    mask: np.ndarray | None = None,
    resamples: int = PAIRED_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """(mean, standard error) of ``scores``' mean AUROC minus ``reference``'s, two models' scores of the same images
    (rows) and classes (columns): the mean over the classes whose AUROC is defined, and its standard error by the
    bootstrap over images (multinomial draws; each resample's difference averaged over the classes defined in it).
    NaN, NaN without a defined class."""
    labels, scores, reference = (np.asarray(array, dtype=np.float64) for array in (labels, scores, reference))
    if labels.ndim == 1:
        labels, scores, reference = labels[:, None], scores[:, None], reference[:, None]
        mask = None if mask is None else np.asarray(mask)[:, None]
    valid = _valid_mask(labels, mask)
    generator = np.random.default_rng(seed)
    draws = generator.multinomial(labels.shape[0], np.full(labels.shape[0], 1 / labels.shape[0]), size=resamples)
    estimates, resampled = [], []
    for column in range(labels.shape[1]):
        keep = valid[:, column]
        truth = labels[keep, column]
        ours, theirs = auroc(truth, scores[keep, column]), auroc(truth, reference[keep, column])
        if math.isnan(ours) or math.isnan(theirs):
            continue
        estimates.append(ours - theirs)
        weights = draws[:, keep].astype(np.float64)
        resampled.append(
            _weighted_aurocs(truth, scores[keep, column], weights)
            - _weighted_aurocs(truth, reference[keep, column], weights)
        )
    if not estimates:
        return math.nan, math.nan
    with np.errstate(invalid="ignore"):
        means = np.nanmean(np.stack(resampled), axis=0) if len(resampled) > 1 else resampled[0]
    means = means[np.isfinite(means)]
    error = float(means.std(ddof=1)) if means.size >= 2 else math.nan
    return float(np.mean(estimates)), error


@dataclass
class ConfidenceInterval:
    estimate: float
    low: float
    high: float
    level: float = 0.95

    def __str__(self) -> str:
        return f"{self.estimate:.3f} ({self.low:.3f}-{self.high:.3f})"


def bootstrap_ci(
    statistic: Callable[[np.ndarray], float],
    n_samples: int,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> ConfidenceInterval:
    """Percentile bootstrap CI of ``statistic(indices)`` over resampled sample indices.

    Resamples where the statistic is undefined (NaN) are dropped.
    """
    if n_samples <= 0:
        raise ValueError("bootstrap needs at least one sample")
    rng = np.random.default_rng(seed)
    estimate = statistic(np.arange(n_samples))
    values = np.array([statistic(rng.integers(0, n_samples, n_samples)) for _ in range(n_resamples)])
    values = values[~np.isnan(values)]
    if values.size == 0:
        return ConfidenceInterval(estimate, math.nan, math.nan, level)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return ConfidenceInterval(float(estimate), float(low), float(high), level)


def mean_auroc_ci(
    y_true: np.ndarray,
    y_score: np.ndarray,
    class_names: Sequence[str],
    mask: np.ndarray | None = None,
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> ConfidenceInterval:
    """Mean AUROC over classes with a bootstrap CI (images resampled with replacement)."""
    y_true = np.asarray(y_true, dtype=np.float64)
    y_score = np.asarray(y_score, dtype=np.float64)

    def statistic(indices: np.ndarray) -> float:
        subset_mask = None if mask is None else np.asarray(mask)[indices]
        return mean_defined(per_class_auroc(y_true[indices], y_score[indices], class_names, subset_mask))

    return bootstrap_ci(statistic, len(y_true), n_resamples, level, seed)


@dataclass
class PairedTest:
    """Paired two-tailed t-test, with a Shapiro-Wilk check of the differences' normality."""

    n: int
    mean_difference: float
    t_statistic: float
    p_value: float
    shapiro_w: float
    shapiro_p: float
    wilcoxon_p: float  # the non-parametric alternative, for when normality is rejected

    @property
    def differences_look_normal(self) -> bool:
        return not (self.shapiro_p < 0.05)


def paired_t_test(a: Sequence[float], b: Sequence[float]) -> PairedTest:
    """Compare paired scores (e.g. per-class AUROC of two methods); pairs with a NaN are dropped."""
    a_values = np.asarray(a, dtype=np.float64)
    b_values = np.asarray(b, dtype=np.float64)
    if a_values.shape != b_values.shape:
        raise ValueError(f"paired samples differ in length: {a_values.shape} vs {b_values.shape}")
    keep = ~(np.isnan(a_values) | np.isnan(b_values))
    a_values, b_values = a_values[keep], b_values[keep]
    n = int(a_values.size)
    if n < 2:
        raise ValueError(f"a paired t-test needs at least 2 defined pairs, got {n}")
    differences = a_values - b_values
    t_result = stats.ttest_rel(a_values, b_values)
    # Shapiro-Wilk needs 3 pairs and differences that are not all equal (identical models: undefined)
    normality = n >= 3 and np.ptp(differences) > 0
    shapiro_w, shapiro_p = stats.shapiro(differences) if normality else (math.nan, math.nan)
    wilcoxon_p = float(stats.wilcoxon(differences).pvalue) if np.any(differences != 0) else 1.0
    return PairedTest(
        n=n,
        mean_difference=float(differences.mean()),
        t_statistic=float(t_result.statistic),
        p_value=float(t_result.pvalue),
        shapiro_w=float(shapiro_w),
        shapiro_p=float(shapiro_p),
        wilcoxon_p=wilcoxon_p,
    )


@dataclass
class ThresholdMetrics:
    """A binary decision at ``threshold``: accuracy, sensitivity (TPR) and specificity (TNR)."""

    threshold: float
    accuracy: float
    sensitivity: float
    specificity: float


def youden_threshold(y_true: np.ndarray, y_score: np.ndarray) -> float:
    """The score threshold maximising Youden's J = sensitivity + specificity - 1 (NaN if one class is absent).

    Candidates are the observed scores (predict positive when score >= threshold); ties go to the
    higher threshold, i.e. the more specific decision.
    """
    y_true, y_score = np.asarray(y_true), np.asarray(y_score, dtype=np.float64)
    if len(np.unique(y_true)) < 2:
        return math.nan
    fpr, tpr, thresholds = roc_curve(y_true, y_score)
    finite = np.isfinite(thresholds)
    j = (tpr - fpr)[finite]
    best = np.flatnonzero(np.isclose(j, j.max(), rtol=0, atol=1e-12))
    return float(thresholds[finite][best].max())


def threshold_metrics(y_true: np.ndarray, y_score: np.ndarray, threshold: float) -> ThresholdMetrics:
    """Accuracy, sensitivity and specificity of ``score >= threshold`` (NaN where undefined)."""
    y_true = np.asarray(y_true).astype(bool)
    positives, negatives = int(y_true.sum()), int((~y_true).sum())
    if math.isnan(threshold) or len(y_true) == 0:
        return ThresholdMetrics(threshold, math.nan, math.nan, math.nan)
    predicted = np.asarray(y_score) >= threshold
    return ThresholdMetrics(
        float(threshold),
        float((predicted == y_true).mean()),
        float((predicted & y_true).sum() / positives) if positives else math.nan,
        float((~predicted & ~y_true).sum() / negatives) if negatives else math.nan,
    )
