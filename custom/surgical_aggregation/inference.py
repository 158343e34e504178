"""Using a trained model: score images, and evaluate on a labelled set (per-class AUROC by name; with
accuracy, sensitivity and specificity at Youden thresholds where the modality asks for them)."""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from torch.utils.data import Dataset

from .checkpoint import PREPROCESSING_KEY, Checkpoint, load_checkpoint
from .config import load_site_config
from .core.devices import auto_workers, autocast_dtype, resolve_device
from .core.errors import DataNotFoundError, DatasetFormatError, ModelFileError, SiteConfigError
from .data.splits import patient_split
from .data.storage import default_cache_root
from .data.table import PATH_COLUMN, PATIENT_COLUMN, LabelTable
from .images.cache import OnError
from .images.dataset import ChestXrayDataset, cache_table
from .images.layouts import load_table
from .images.transforms import ImageBatchTransform, image_batch_transform
from .loops import make_loader, place_model, predict
from .metrics import (
    ConfidenceInterval,
    align_by_name,
    mean_auroc_ci,
    per_class_auroc,
    threshold_metrics,
    youden_threshold,
)
from .plots import plot_per_class_auroc
from .site_data import resolve_table, split_table

logger = logging.getLogger(__name__)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
THRESHOLD_COLUMNS = ("threshold", "accuracy", "sensitivity", "specificity")


@dataclass(frozen=True)
class Preprocessing:
    image_size: int
    in_channels: int
    imagenet_normalize: bool

    @classmethod
    def of(cls, checkpoint: Checkpoint, image_size: int | None = None) -> Preprocessing:
        """What the model was trained with (stored by the server), unless overridden."""
        stored = checkpoint.meta.get(PREPROCESSING_KEY) or {}
        size = image_size or stored.get("image_size")
        if size is None:
            raise ModelFileError("the model file does not say which image size it was trained at: pass --image-size")
        return cls(int(size), checkpoint.in_channels, bool(stored.get("imagenet_normalize", True)))

    def transform(self) -> ImageBatchTransform:
        return image_batch_transform(self.image_size, False, self.in_channels, self.imagenet_normalize)


def list_images(source: str | Path, image_column: str = PATH_COLUMN) -> list[str]:
    """Image paths from a folder (recursively, by suffix) or from a CSV's ``image_column``."""
    source = Path(source)
    if source.is_dir():
        paths = sorted(str(p) for p in source.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        if not paths:
            raise DataNotFoundError(f"no images ({', '.join(IMAGE_SUFFIXES)}) under {source}")
        return paths
    if not source.is_file():
        raise DataNotFoundError(f"not a folder or CSV file: {source}")
    frame = pd.read_csv(source, dtype=str)
    if image_column not in frame:
        raise DatasetFormatError(f"{source}: no {image_column!r} column; columns are {list(frame.columns)}")
    return [str(p if Path(p).is_absolute() else source.parent / p) for p in frame[image_column]]


def _cached_dataset(
    table: LabelTable, preprocessing: Preprocessing, cache_dir: str | Path | None, on_error: OnError
) -> tuple[ChestXrayDataset, LabelTable, list[tuple[str, str]]]:
    """Decode each image once into the preprocessing cache; unreadable ones are left out (or raise)."""
    kept, cache, report = cache_table(
        table,
        cache_dir or default_cache_root(),
        preprocessing.image_size,
        on_error,
        workers=4,
        progress=sys.stderr.isatty(),  # a bar at a terminal, else a log line every PROGRESS_SECONDS
    )
    if report.failures:
        logger.warning("left out %d unreadable image(s), e.g. %s", len(report.failures), report.failures[:3])
    return ChestXrayDataset(kept, cache, preprocessing.transform()), kept, report.failures


def score_images(
    checkpoint_path: str | Path,
    paths: Sequence[str],
    image_size: int | None = None,
    cache_dir: str | Path | None = None,
    on_error: OnError = "skip",
    batch_size: int = 32,
    device: str = "auto",
) -> tuple[pd.DataFrame, list[tuple[str, str]]]:
    """Per-class probabilities (one column per class name) for each readable image, and the unreadable ones."""
    checkpoint = load_checkpoint(checkpoint_path)
    preprocessing = Preprocessing.of(checkpoint, image_size)
    paths = [str(Path(p).resolve()) for p in paths]
    root = Path(os.path.commonpath(paths)) if paths else Path(".")
    table = LabelTable("scored", root, [], pd.DataFrame({PATH_COLUMN: paths, PATIENT_COLUMN: paths}))
    dataset, kept, failures = _cached_dataset(table, preprocessing, cache_dir, on_error)
    if len(kept) == 0:
        raise DataNotFoundError(f"none of the {len(paths)} images could be read, e.g. {failures[:3]}")
    scores = pd.DataFrame(predict_checkpoint(checkpoint, dataset, batch_size, device), columns=checkpoint.class_names)
    scores.insert(0, PATH_COLUMN, kept.paths)
    return scores, failures


def predict_checkpoint(checkpoint: Checkpoint, dataset: Dataset, batch_size: int, device_spec: str) -> np.ndarray:
    """(N, classes) probabilities of a checkpoint's model on a dataset of this package (images or reports)."""
    device = resolve_device(device_spec)
    model = place_model(checkpoint.build_model(), device)
    loader = make_loader(dataset, batch_size, train=False, workers=auto_workers(device))
    probabilities, _, _ = predict(model, loader, device, autocast_dtype(device, amp=True), progress=sys.stderr.isatty())
    return probabilities


@dataclass
class EvaluationReport:
    per_class: pd.DataFrame  # class, auroc, positives, negatives
    mean_auroc: ConfidenceInterval
    missing_in_model: list[str]
    n_images: int

    def text(self) -> str:
        lines = [f"{'class':<28}{'AUROC':>8}{'positives':>11}{'negatives':>11}"]
        for row in self.per_class.itertuples(index=False):
            auroc = "undefined" if math.isnan(row.auroc) else f"{row.auroc:.4f}"
            lines.append(f"{row.class_name:<28}{auroc:>8}{row.positives:>11}{row.negatives:>11}")
        lines.append(f"mean AUROC over {len(self.per_class)} classes: {self.mean_auroc} (95% bootstrap CI)")
        if self.missing_in_model:
            lines.append(f"classes of the data the model does not predict (left out): {self.missing_in_model}")
        return "\n".join(lines)


def evaluate_on_table(checkpoint_path: str | Path, table: LabelTable, **options: Any) -> EvaluationReport:
    """AUROC per class the model and the labelled set share (matched by name), with a bootstrap CI of the mean.

    ``options`` are :func:`evaluate_models`'s (image_size, cache_dir, on_error, batch_size, device, bootstrap).
    """
    return evaluate_models([checkpoint_path], table, **options)


def evaluate_models(
    checkpoint_paths: Sequence[str | Path],
    table: LabelTable,
    image_size: int | None = None,
    cache_dir: str | Path | None = None,
    on_error: OnError = "skip",
    batch_size: int = 32,
    device: str = "auto",
    bootstrap: int = 1000,
) -> EvaluationReport:
    """Like :func:`evaluate_on_table` for a set of models (PFL's personal models, per-dataset models):
    each class is scored by the mean probability of the models that predict it."""
    if not checkpoint_paths:
        raise ValueError("no model to evaluate")
    checkpoints = [load_checkpoint(path) for path in checkpoint_paths]
    predicted = predicted_classes(checkpoints, table)
    settings = {Preprocessing.of(checkpoint, image_size) for checkpoint in checkpoints}
    if len(settings) > 1:
        raise ModelFileError(f"the models were trained with different preprocessing {settings}; pass --image-size")
    preprocessing = settings.pop()
    dataset, kept, _ = _cached_dataset(table, preprocessing, cache_dir, on_error)
    probabilities = ensemble_probabilities(
        checkpoints, predicted, lambda checkpoint: predict_checkpoint(checkpoint, dataset, batch_size, device)
    )
    return per_class_report(probabilities, predicted, kept, bootstrap)


def predicted_classes(checkpoints: Sequence[Checkpoint], table: LabelTable) -> list[str]:
    """Every class the models predict (first seen first); an error when none is labelled in ``table``."""
    predicted = list(dict.fromkeys(name for checkpoint in checkpoints for name in checkpoint.class_names))
    if not any(name in predicted for name in table.classes):
        raise DatasetFormatError(f"the model(s) predict {predicted}, none of the data's classes {table.classes}")
    return predicted


def ensemble_probabilities(
    checkpoints: Sequence[Checkpoint], predicted: Sequence[str], predict_one: Callable[[Checkpoint], np.ndarray]
) -> np.ndarray:
    """(N, len(predicted)): each class scored by the mean probability of the models that predict it."""
    sums, counts = None, np.zeros(len(predicted))
    for checkpoint in checkpoints:
        probabilities = predict_one(checkpoint)
        sums = np.zeros((len(probabilities), len(predicted))) if sums is None else sums
        columns = [list(predicted).index(name) for name in checkpoint.class_names]
        sums[:, columns] += probabilities
        counts[columns] += 1
    return sums / counts


def per_class_report(
    probabilities: np.ndarray, predicted: Sequence[str], table: LabelTable, bootstrap: int
) -> EvaluationReport:
    """Per-class AUROC (with positives and negatives) of ``probabilities`` on ``table``, by class name."""
    labels, mask = table.label_matrix()
    aligned = align_by_name(probabilities, list(predicted), labels, table.classes, mask)
    aurocs = per_class_auroc(aligned.y_true, aligned.y_score, aligned.class_names, aligned.mask)
    valid = aligned.mask.astype(bool)
    count = len(aligned.class_names)
    per_class = pd.DataFrame(
        {
            "class_name": aligned.class_names,
            "auroc": [aurocs[name] for name in aligned.class_names],
            "positives": [int(((aligned.y_true[:, c] == 1) & valid[:, c]).sum()) for c in range(count)],
            "negatives": [int(((aligned.y_true[:, c] == 0) & valid[:, c]).sum()) for c in range(count)],
        }
    )
    interval = mean_auroc_ci(aligned.y_true, aligned.y_score, aligned.class_names, aligned.mask, bootstrap)
    return EvaluationReport(per_class, interval, aligned.missing_in_model, len(table))


def labelled_set(
    site_config: Path | None = None,
    kind: str | None = None,
    data: Path | None = None,
    uncertainty: str | None = None,
    split: str = "test",
) -> tuple[LabelTable, str]:
    """The labelled set to evaluate on, and its title: a site's data exactly as its config defines it, or a
    dataset folder of a known layout; ``split`` is a patient-level split, or ``all`` for an external set."""
    if site_config is not None:
        config = load_site_config(site_config)
        table = resolve_table(config)
        table = table if split == "all" else split_table(table, config)[split]
        return table, f"{site_config.stem} ({split})"
    if kind is None or data is None:
        raise SiteConfigError("name a labelled set: a site config, or a data kind with its folder (or CSV file)")
    options = {} if uncertainty is None else {"uncertainty": uncertainty}
    table = load_table(kind, data, **options)
    table = table if split == "all" else patient_split(table)[split]
    named = data.name if data.name.lower() != kind.lower() else ""  # "mimic", not "mimic mimic"
    return table, f"{named} ({kind}, {split})" if named else f"{kind} ({split})"


def write_evaluation(report: EvaluationReport, folder: str | Path, title: str) -> list[Path]:
    """``per_class_auroc.csv``, ``per_class_auroc.png`` and ``summary.txt`` in ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    csv_path = folder / "per_class_auroc.csv"
    report.per_class.to_csv(csv_path, index=False)
    aurocs = dict(zip(report.per_class["class_name"], report.per_class["auroc"], strict=True))
    png_path = plot_per_class_auroc(aurocs, folder / "per_class_auroc.png", f"{title}: mean AUROC {report.mean_auroc}")
    text_path = folder / "summary.txt"
    text_path.write_text(report.text() + "\n")
    return [csv_path, png_path, text_path]


def evaluate_with_thresholds(
    checkpoint_paths: Sequence[str | Path],
    val: Dataset,
    test: Dataset,
    bootstrap: int = 1000,
    device: str = "auto",
    batch_size: int = 256,
) -> EvaluationReport:
    """The model(s) on ``test`` by class name, plus each class's accuracy, sensitivity and specificity at the
    Youden threshold chosen on ``val`` (the report-labelling paper's metrics).

    ``val`` and ``test`` are datasets of this package (``table``, ``labels``, ``mask``, ``class_names``); a set of
    models scores each class by their mean probability. A class without both label values in ``val`` has no
    threshold (NaN).
    """
    if not checkpoint_paths:
        raise ValueError("no model to evaluate")
    checkpoints = [load_checkpoint(path) for path in checkpoint_paths]
    predicted = predicted_classes(checkpoints, test.table)

    def probabilities(dataset: Dataset) -> np.ndarray:
        return ensemble_probabilities(
            checkpoints, predicted, lambda checkpoint: predict_checkpoint(checkpoint, dataset, batch_size, device)
        )

    val_scores, test_scores = probabilities(val), probabilities(test)
    report = per_class_report(test_scores, predicted, test.table, bootstrap)

    def known(dataset: Dataset, scores: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
        """A class's labels and scores over the rows that label it."""
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
