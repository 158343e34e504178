"""Report labeller evaluation (seed 004): per finding, AUROC on the test split, and accuracy,
sensitivity and specificity at the Youden threshold chosen on the validation split."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..inference import (
    EvaluationReport,
    ensemble_probabilities,
    per_class_report,
    predict_checkpoint,
    predicted_classes,
)
from ..metrics import threshold_metrics, youden_threshold
from ..model import load_checkpoint
from .dataset import ReportDataset

THRESHOLD_COLUMNS = ("threshold", "accuracy", "sensitivity", "specificity")


def evaluate_report_models(
    checkpoint_paths: Sequence[str | Path],
    val: ReportDataset,
    test: ReportDataset,
    bootstrap: int = 1000,
    device: str = "auto",
    batch_size: int = 256,
) -> EvaluationReport:
    """The model(s) on ``test`` by finding name; a set of models scores each finding by their mean probability.

    ``per_class`` gains the columns of :data:`THRESHOLD_COLUMNS`; a finding without both classes
    in the validation split has no threshold (NaN).
    """
    if not checkpoint_paths:
        raise ValueError("no model to evaluate")
    checkpoints = [load_checkpoint(path) for path in checkpoint_paths]
    predicted = predicted_classes(checkpoints, test.table)

    def probabilities(dataset: ReportDataset) -> np.ndarray:
        return ensemble_probabilities(
            checkpoints, predicted, lambda checkpoint: predict_checkpoint(checkpoint, dataset, batch_size, device)
        )

    val_scores, test_scores = probabilities(val), probabilities(test)
    report = per_class_report(test_scores, predicted, test.table, bootstrap)

    def known(dataset: ReportDataset, scores: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
        """A finding's labels and scores over the reports that label it."""
        column = dataset.class_names.index(name)
        labelled = dataset.mask[:, column].numpy() == 1
        return dataset.labels[labelled, column].numpy(), scores[labelled, predicted.index(name)]

    rows = []
    for name in report.per_class["class_name"]:
        threshold = youden_threshold(*known(val, val_scores, name))
        rows.append(threshold_metrics(*known(test, test_scores, name), threshold))
    for key in THRESHOLD_COLUMNS:
        report.per_class[key] = [getattr(row, key) for row in rows]
    return report
