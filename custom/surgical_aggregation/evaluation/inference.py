"""Using a trained model: score images, and evaluate on a labelled set (per-class AUROC by name; with
accuracy, sensitivity and specificity at Youden thresholds where the modality asks for them)."""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset

from ..core.devices import AUTO, autocast_dtype, resolve_device, resolve_workers
from ..core.errors import DataNotFoundError, DatasetFormatError, ModelFileError, SiteConfigError
from ..core.head import NAMED_HEAD
from ..data.splits import patient_split
from ..data.table import LabelTable
from ..images.cache import OnError
from ..modalities.registry import modality_for_architecture
from ..training.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from ..training.config import load_site_config, site_config_from_dict
from ..training.head_refit import RefitRow, refit_rows
from ..training.loops import head_inputs, make_loader, place_model, predict
from ..training.site_data import resolve_table, split_table
from .metrics import (
    ConfidenceInterval,
    Specificity,
    align_by_name,
    bce_loss,
    labelled_counts,
    logit_intercept_shifts,
    mean_auroc_ci,
    per_class_auroc,
    score_specificity,
    sigmoid,
    threshold_metrics,
    youden_threshold,
)
from .plots import plot_per_class_auroc

logger = logging.getLogger(__name__)
THRESHOLD_COLUMNS = ("threshold", "accuracy", "sensitivity", "specificity")


STATUS_COLUMN = "status"  # predict's output: "ok", or why the input could not be scored
READABLE = "ok"
THRESHOLDS_KEY = "thresholds"  # checkpoint meta: {"values": {class: threshold}, "chosen_on": ...} (evaluate saves it)
CALL_SUFFIX = " (call)"  # predict's positive-call columns: "<class> (call)", 1 at or above the class's threshold
# checkpoint meta: {"shifts": {class: its logit shift, summed}, "fitted_on": [each recalibration's split], "rule": ...}
RECALIBRATION_KEY = "recalibration"
# checkpoint meta of evaluate --refit-rows-out: {"classes": [every row refitted], "c": {class: its last C},
# "fitted_on": [each refit's splits], "rule": ...}
HEAD_REFIT_KEY = "head_rows_refit"
RECALIBRATION_RULE = "recalibration in the large (one intercept per class, its mean probability = its prevalence)"
RECALIBRATION_COLUMNS = ("intercept_shift", "loss", "recalibrated_loss")


def model_preprocessing(checkpoint: Checkpoint, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the model was trained to read (stored with it), with the entries ``given`` for a file that lacks them
    (e.g. ``{"image_size": 224}``; the modality says which it needs)."""
    return {**checkpoint.preprocessing, **(given or {})}


def score(
    checkpoint_path: str | Path,
    source: str | Path,
    column: str | None = None,
    preprocessing: Mapping[str, Any] | None = None,
    cache_dir: str | Path | None = None,
    on_error: OnError = "skip",
    batch_size: int = 32,
    device: str = "auto",
    calls: bool = False,
) -> tuple[pd.DataFrame, list[tuple[str, str]]]:
    """Score every input of ``source`` (images: a folder or a CSV's image column; reports: a CSV's text column, as
    the model's modality reads): one row per input, its ``status`` (``ok``, or why it was left out, its scores then
    empty) and one probability column per class name; with ``calls``, a 0/1 column per class that has a threshold
    saved with the model. Returns the table and the inputs left out."""
    checkpoint = load_checkpoint(checkpoint_path)
    modality = modality_for_architecture(checkpoint.architecture)
    table = modality.unlabelled_table(Path(source), column)
    preprocessing = model_preprocessing(checkpoint, preprocessing)
    dataset, kept, failures = modality.scoring_dataset(
        table, preprocessing, None if cache_dir is None else str(cache_dir), on_error, device
    )
    if len(kept) == 0:
        raise DataNotFoundError(f"none of the {len(table)} inputs of {source} could be read, e.g. {failures[:3]}")
    probabilities = predict_checkpoint(checkpoint, dataset, batch_size, device)
    scored = pd.DataFrame(probabilities, columns=checkpoint.class_names, index=kept.paths)
    reasons = dict(failures)
    frame = pd.DataFrame({modality.row_column: table.paths})
    frame[STATUS_COLUMN] = [reasons.get(row, READABLE) for row in table.paths]
    frame = frame.join(scored, on=modality.row_column)
    if calls:
        thresholds = (checkpoint.meta.get(THRESHOLDS_KEY) or {}).get("values")
        if not thresholds:
            raise ModelFileError(
                f"{checkpoint_path} has no thresholds to call positives with: choose them on a validation split "
                "with 'surgical-aggregation evaluate --model ... --thresholds-out <model file>'"
            )
        for name in checkpoint.class_names:  # in the model's order, each class that has a threshold
            threshold = thresholds.get(name)
            if threshold is not None and not math.isnan(threshold):
                frame[name + CALL_SUFFIX] = (frame[name] >= threshold).astype("Int64").where(frame[name].notna())
    return frame, failures


def predict_checkpoint(
    checkpoint: Checkpoint,
    dataset: Dataset,
    batch_size: int,
    device_spec: str,
    workers: int | str = AUTO,
    logits: bool = False,
) -> np.ndarray:
    """(N, classes) probabilities of a checkpoint's model on a dataset of this package (images or reports);
    ``workers``: the loader's worker processes (auto: ``core.devices.auto_workers``); ``logits``: its logits in
    full precision instead."""
    device = resolve_device(device_spec)
    model = place_model(checkpoint.build_model(), device)
    loader = make_loader(dataset, batch_size, train=False, workers=resolve_workers(workers, device))
    autocast = None if logits else autocast_dtype(device, amp=True)
    scores, _, _ = predict(model, loader, device, autocast, progress=sys.stderr.isatty(), logits=logits)
    return scores


@dataclass
class EvaluationReport:
    per_class: pd.DataFrame  # class, auroc, positives, negatives
    mean_auroc: ConfidenceInterval
    missing_in_model: list[str]
    n_images: int  # the inputs evaluated (images or reports)
    noun: str = "images"
    kept_rows: list[str] = field(default_factory=list)  # evaluate --refit-rows-out: the classes it could not refit

    def text(self) -> str:
        lines = [f"{'class':<28}{'AUROC':>8}{'positives':>11}{'negatives':>11}"]
        for row in self.per_class.itertuples(index=False):
            auroc = "undefined" if math.isnan(row.auroc) else f"{row.auroc:.4f}"
            lines.append(f"{row.class_name:<28}{auroc:>8}{row.positives:>11}{row.negatives:>11}")
        lines.append(f"mean AUROC over {len(self.per_class)} classes: {self.mean_auroc} (95% bootstrap CI)")
        if "recalibrated_loss" in self.per_class:
            lines.append(f"{'class':<28}{'val cases':>14}{'shift':>8}{'test loss':>11}{'recalibrated':>14}")
            for row in self.per_class.itertuples(index=False):
                fitted = f"{row.val_cases}/{row.val_labelled}"
                lines.append(
                    f"{row.class_name:<28}{fitted:>14}{row.intercept_shift:>+8.3f}{row.loss:>11.4f}"
                    f"{row.recalibrated_loss:>14.4f}"
                )
            before, after = self.per_class["loss"].mean(), self.per_class["recalibrated_loss"].mean()
            lines.append(
                f"mean test loss over {len(self.per_class)} classes: {before:.4f} as it was, {after:.4f} recalibrated "
                f"(a shift fitted on few validation cases, or few non-cases, is noisy)"
            )
        if "auroc_before" in self.per_class:
            lines.append(f"{'class':<28}{'AUROC before':>14}{'refitted':>10}{'C':>9}")
            for row in self.per_class.itertuples(index=False):
                lines.append(f"{row.class_name:<28}{row.auroc_before:>14.4f}{row.auroc:>10.4f}{row.refit_c:>9g}")
            before, after = self.per_class["auroc_before"].mean(), self.per_class["auroc"].mean()
            lines.append(
                f"mean test AUROC over {len(self.per_class)} classes: {before:.4f} as it was, {after:.4f} with the "
                "rows refitted on this site's images alone (what the federation taught the rows is gone, good or bad)"
            )
        if self.kept_rows:
            lines.append(
                f"kept as the federation's (one class only among this site's training images): {self.kept_rows}"
            )
        if self.missing_in_model:
            lines.append(f"classes of the data the model does not predict (left out): {self.missing_in_model}")
        return "\n".join(lines)


def evaluate_on_table(checkpoint_path: str | Path, table: LabelTable, **options: Any) -> EvaluationReport:
    """AUROC per class the model and the labelled set share (matched by name), with a bootstrap CI of the mean.

    ``options`` are :func:`evaluate_models`'s (preprocessing, cache_dir, on_error, batch_size, device, bootstrap).
    """
    return evaluate_models([checkpoint_path], table, **options)


def evaluate_models(
    checkpoint_paths: Sequence[str | Path],
    table: LabelTable,
    preprocessing: Mapping[str, Any] | None = None,
    cache_dir: str | Path | None = None,
    on_error: OnError = "skip",
    batch_size: int = 32,
    device: str = "auto",
    bootstrap: int = 1000,
    workers: int | str = AUTO,
) -> EvaluationReport:
    """Like :func:`evaluate_on_table` for a set of models (PFL's personal models, per-dataset models):
    each class is scored by the mean probability of the models that predict it."""
    if not checkpoint_paths:
        raise ValueError("no model to evaluate")
    checkpoints = [load_checkpoint(path) for path in checkpoint_paths]
    predicted = predicted_classes(checkpoints, table)
    dataset, kept = scoring_dataset(checkpoints, table, preprocessing, cache_dir, on_error, device)
    probabilities = ensemble_probabilities(
        checkpoints, predicted, lambda checkpoint: predict_checkpoint(checkpoint, dataset, batch_size, device, workers)
    )
    report = per_class_report(probabilities, predicted, kept, bootstrap)
    report.noun = modality_for_architecture(checkpoints[0].architecture).sample_noun
    return report


def model_specificity(
    checkpoint_path: str | Path,
    table: LabelTable,
    cache_dir: str | Path | None = None,
    batch_size: int = 32,
    device: str = "auto",
) -> Specificity:
    """How finding-specific one model's scores are on ``table``'s labelled classes (``metrics.score_specificity``:
    the mean pairwise correlation of its logits, and the AUROC lost by ranking every class by one shared score)."""
    checkpoint = load_checkpoint(checkpoint_path)
    predicted = predicted_classes([checkpoint], table)
    dataset, kept = scoring_dataset([checkpoint], table, None, cache_dir, "skip", device)
    probabilities = predict_checkpoint(checkpoint, dataset, batch_size, device)
    labels, mask = kept.label_matrix()
    aligned = align_by_name(probabilities, list(predicted), labels, kept.classes, mask)
    return score_specificity(aligned.y_true, aligned.y_score, aligned.mask)


def scoring_dataset(
    checkpoints: Sequence[Checkpoint],
    table: LabelTable,
    preprocessing: Mapping[str, Any] | None = None,
    cache_dir: str | Path | None = None,
    on_error: OnError = "skip",
    device: str = "auto",
) -> tuple[Dataset, LabelTable]:
    """``table`` as the models' inputs (their modality's, their preprocessing, which must be one); unreadable rows
    are left out (logged) or raise, as ``on_error`` says."""
    settings = {json.dumps(model_preprocessing(model, preprocessing), sort_keys=True) for model in checkpoints}
    if len(settings) > 1:
        raise ModelFileError(f"the models were trained with different preprocessing {sorted(settings)}")
    modality = modality_for_architecture(checkpoints[0].architecture)
    dataset, kept, failures = modality.scoring_dataset(
        table, json.loads(settings.pop()), None if cache_dir is None else str(cache_dir), on_error, device
    )
    if failures:
        logger.warning("left out %d unreadable input(s), e.g. %s", len(failures), failures[:3])
    return dataset, kept


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
    dataset of a known kind (images or reports) at ``data``; ``split`` is a patient-level split, or ``all``."""
    splits, title = labelled_splits(site_config, kind, data, uncertainty)
    return splits[split], title.format(split=split)


def labelled_splits(
    site_config: Path | None = None, kind: str | None = None, data: Path | None = None, uncertainty: str | None = None
) -> tuple[dict[str, LabelTable], str]:
    """A labelled set's splits (``train``, ``val``, ``test``, patient-level, and ``all``) and its title, with
    ``{split}`` where the split goes."""
    if site_config is not None:
        config = load_site_config(site_config)
        table = resolve_table(config)
        return {"all": table, **split_table(table, config)}, f"{site_config.stem} ({{split}})"
    if kind is None or data is None:
        raise SiteConfigError("name a labelled set: a site config, or a data kind with its folder (or CSV file)")
    options = {} if uncertainty is None else {"uncertainty": uncertainty}
    values = {"data": {"kind": kind, "location": str(Path(data).resolve()), "options": options}}
    config = site_config_from_dict(values, f"--kind {kind} --data {data}")
    table = resolve_table(config)
    named = data.name if data.name.lower() != kind.lower() else ""  # "mimic", not "mimic mimic"
    return {"all": table, **patient_split(table)}, f"{named} ({kind}, {{split}})" if named else f"{kind} ({{split}})"


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


def evaluate_and_choose_thresholds(
    checkpoint_path: str | Path,
    splits: dict[str, LabelTable],
    cache_dir: str | Path | None = None,
    on_error: OnError = "skip",
    device: str = "auto",
    bootstrap: int = 1000,
    preprocessing: Mapping[str, Any] | None = None,
) -> EvaluationReport:
    """The model on the ``test`` split, with each class's threshold chosen on the ``val`` split (Youden's J) and its
    accuracy, sensitivity and specificity on ``test`` at that threshold."""
    checkpoints = [load_checkpoint(checkpoint_path)]
    val, _ = scoring_dataset(checkpoints, splits["val"], preprocessing, cache_dir, on_error, device)
    test, _ = scoring_dataset(checkpoints, splits["test"], preprocessing, cache_dir, on_error, device)
    report = evaluate_with_thresholds([checkpoint_path], val, test, bootstrap, device)
    report.noun = modality_for_architecture(checkpoints[0].architecture).sample_noun
    return report


def save_thresholds(checkpoint_path: str | Path, report: EvaluationReport, chosen_on: str, out: str | Path) -> Path:
    """A copy of the model with the report's thresholds stored in it (``predict --calls`` uses them)."""
    checkpoint = load_checkpoint(checkpoint_path)
    values = {
        row.class_name: None if math.isnan(row.threshold) else float(row.threshold)
        for row in report.per_class.itertuples(index=False)
    }
    meta = {**checkpoint.meta, THRESHOLDS_KEY: {"values": values, "chosen_on": chosen_on, "rule": "Youden's J"}}
    return save_checkpoint(out, checkpoint.state, checkpoint.class_names, **meta)


def evaluate_and_recalibrate(
    checkpoint_path: str | Path,
    splits: dict[str, LabelTable],
    cache_dir: str | Path | None = None,
    on_error: OnError = "skip",
    device: str = "auto",
    bootstrap: int = 1000,
    preprocessing: Mapping[str, Any] | None = None,
    batch_size: int = 256,
) -> tuple[EvaluationReport, dict[str, float]]:
    """The model on the ``test`` split, each class the ``val`` split labels on at least one image recalibrated in the
    large on ``val`` (:func:`metrics.logit_intercept_shifts` of the model's own logits: one shift each, to the site's
    own prevalence). The report gives per class the validation images and cases the shift rests on, the shift, and
    the test split's mean BCE before and after it (``loss``, ``recalibrated_loss``); a shift leaves the class's AUROC
    as it is. Returns the report and the shifts by class name; refuses a ``val`` split that labels none of the
    model's classes on any image."""
    checkpoint = load_checkpoint(checkpoint_path)
    names = checkpoint.class_names

    def scored(table: LabelTable) -> tuple[np.ndarray, LabelTable, Any]:
        predicted_classes([checkpoint], table)  # refuses a split that labels none of the model's classes
        dataset, kept = scoring_dataset([checkpoint], table, preprocessing, cache_dir, on_error, device)
        logits = predict_checkpoint(checkpoint, dataset, batch_size, device, logits=True)
        labels, mask = kept.label_matrix()
        return logits, kept, align_by_name(logits, names, labels, kept.classes, mask)

    _, _, val = scored(splits["val"])
    counts, cases = labelled_counts(val.y_true, val.mask)
    fitted = logit_intercept_shifts(val.y_true, val.y_score, val.mask)
    shifts = {name: float(shift) for name, shift, count in zip(val.class_names, fitted, counts, strict=True) if count}
    if not shifts:
        raise DatasetFormatError(
            f"the validation split labels none of the model's classes on any image ({len(splits['val'])} rows): "
            "nothing to recalibrate on"
        )
    logits, kept, test = scored(splits["test"])
    report = per_class_report(sigmoid(logits), names, kept, bootstrap)
    report.noun = modality_for_architecture(checkpoint.architecture).sample_noun
    report.per_class = report.per_class[report.per_class["class_name"].isin(shifts)].reset_index(drop=True)
    columns = [test.class_names.index(name) for name in report.per_class["class_name"]]
    fitted_on = dict(zip(val.class_names, zip(counts, cases, strict=True), strict=True))

    def losses(shifted: bool) -> list[float]:
        return [
            bce_loss(
                test.y_true[:, column],
                sigmoid(test.y_score[:, column] + (shifts[test.class_names[column]] if shifted else 0.0)),
                None if test.mask is None else test.mask[:, column],
            )
            for column in columns
        ]

    names_kept = report.per_class["class_name"]
    report.per_class["val_labelled"] = [int(fitted_on[name][0]) for name in names_kept]
    report.per_class["val_cases"] = [int(fitted_on[name][1]) for name in names_kept]
    report.per_class["intercept_shift"] = [shifts[name] for name in names_kept]
    report.per_class["loss"], report.per_class["recalibrated_loss"] = losses(False), losses(True)
    return report, shifts


def save_recalibrated(
    checkpoint_path: str | Path, shifts: Mapping[str, float], fitted_on: str, out: str | Path
) -> Path:
    """A copy of the model whose head biases carry ``shifts`` (each class's row by name), so that every use of the
    file (``predict``, ``evaluate``, ``export-bundle``'s TorchScript and ONNX) gives the recalibrated probabilities;
    its meta records the shifts (summed over recalibrations) and where they were fitted. Thresholds saved with the
    model move with their classes' shifts, so that each call stays as it was (up to rounding at the threshold)."""
    checkpoint = load_checkpoint(checkpoint_path)
    strange = {name: shift for name, shift in shifts.items() if not math.isfinite(shift)}
    if strange:
        raise ValueError(f"a recalibration's shifts must be finite numbers, got {strange}")
    if NAMED_HEAD.bias_key not in checkpoint.state:
        raise ModelFileError(f"{checkpoint_path} has no head bias ({NAMED_HEAD.bias_key}) to recalibrate")
    unknown = sorted(set(shifts) - set(checkpoint.class_names))
    if unknown:
        raise ModelFileError(f"{checkpoint_path} does not predict {unknown[:3]}: nothing to recalibrate there")
    state = dict(checkpoint.state)
    bias = state[NAMED_HEAD.bias_key].clone()
    for name, shift in shifts.items():
        bias[checkpoint.class_names.index(name)] += shift
    state[NAMED_HEAD.bias_key] = bias
    earlier = checkpoint.meta.get(RECALIBRATION_KEY) or {}
    summed = dict(earlier.get("shifts") or {})
    for name, shift in shifts.items():
        summed[name] = float(summed.get(name, 0.0)) + float(shift)
    meta = {
        **checkpoint.meta,
        RECALIBRATION_KEY: {
            "shifts": summed,
            "fitted_on": [*(earlier.get("fitted_on") or []), fitted_on],
            "rule": RECALIBRATION_RULE,
        },
    }
    thresholds = checkpoint.meta.get(THRESHOLDS_KEY)
    if thresholds and thresholds.get("values"):
        values = {
            name: float(sigmoid(math.log(value / (1 - value)) + shifts[name]))
            if name in shifts and _inside(value)
            else value
            for name, value in thresholds["values"].items()
        }
        meta[THRESHOLDS_KEY] = {**thresholds, "values": values}
    return save_checkpoint(out, state, checkpoint.class_names, **meta)


def _inside(threshold: float | None) -> bool:
    """Whether a saved threshold is a probability a logit shift moves (not None, NaN, 0 or 1)."""
    return threshold is not None and 0 < threshold < 1


def evaluate_and_refit_rows(
    checkpoint_path: str | Path,
    splits: dict[str, LabelTable],
    cache_dir: str | Path | None = None,
    on_error: OnError = "skip",
    device: str = "auto",
    bootstrap: int = 1000,
    preprocessing: Mapping[str, Any] | None = None,
    batch_size: int = 256,
) -> tuple[EvaluationReport, dict[str, RefitRow]]:
    """The model on the ``test`` split with the head row of each class the site labels refitted from nothing on its
    own images (``training.head_refit``: a logistic regression of the class on the model's features of the ``train``
    split, C chosen on the ``val`` split, then fitted on both): the row no longer carries what other sites taught it
    (a backdoor's trigger the row reads, say), and the backbone stays the federation's. A class the training split
    shows with one class only keeps the federation's row (:attr:`EvaluationReport.kept_rows`). The report gives per
    refitted class its test AUROC, the model's as it was (``auroc_before``) and the C chosen (``refit_c``); the
    validation split is spent on the fit. Returns the report and the rows by class name."""
    checkpoint = load_checkpoint(checkpoint_path)
    names = checkpoint.class_names
    model = place_model(checkpoint.build_model(), resolve_device(device))

    def read(split: str, classes: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        predicted_classes([checkpoint], splits[split])  # refuses a split that labels none of the model's classes
        dataset, kept = scoring_dataset([checkpoint], splits[split], preprocessing, cache_dir, on_error, device)
        loader = make_loader(dataset, batch_size, train=False)
        features = head_inputs(model, loader, resolve_device(device))[0].double().numpy()
        classes = [name for name in kept.classes if name in names] if classes is None else list(classes)
        labels, mask = kept.label_matrix(classes, "unlabelled")
        return features, labels, mask, classes

    train = read("train")
    val = read("val", train[3])
    fitted = refit_rows(train[:3], val[:3], refit_on_both=True)
    rows = {train[3][column]: row for column, row in fitted.items()}
    if not rows:
        raise DatasetFormatError(
            "the training and validation splits label none of the model's classes on any image: nothing to refit"
        )
    refitted = Checkpoint(_with_rows(checkpoint, rows), names, checkpoint.meta)
    dataset, kept = scoring_dataset([checkpoint], splits["test"], preprocessing, cache_dir, on_error, device)
    before = per_class_report(predict_checkpoint(checkpoint, dataset, batch_size, device), names, kept, bootstrap)
    report = per_class_report(predict_checkpoint(refitted, dataset, batch_size, device), names, kept, bootstrap)
    report.noun = modality_for_architecture(checkpoint.architecture).sample_noun
    report.per_class = report.per_class[report.per_class["class_name"].isin(rows)].reset_index(drop=True)
    earlier = dict(zip(before.per_class["class_name"], before.per_class["auroc"], strict=True))
    report.per_class["auroc_before"] = [earlier[name] for name in report.per_class["class_name"]]
    chosen = [rows[name].strength for name in report.per_class["class_name"]]
    report.per_class["refit_c"] = chosen
    report.kept_rows = [name for name in train[3] if name not in rows]
    return report, rows


def _with_rows(checkpoint: Checkpoint, rows: Mapping[str, RefitRow]) -> dict[str, Any]:
    """The checkpoint's state with each named head row replaced by ``rows``'."""
    state = dict(checkpoint.state)
    weight, bias = (state[key].clone() for key in NAMED_HEAD.keys)
    for name, row in rows.items():
        index = checkpoint.class_names.index(name)
        weight[index] = torch.as_tensor(row.weights, dtype=weight.dtype)
        bias[index] = float(row.bias)
    state[NAMED_HEAD.weight_key], state[NAMED_HEAD.bias_key] = weight, bias
    return state


def save_refit_rows(checkpoint_path: str | Path, rows: Mapping[str, RefitRow], fitted_on: str, out: str | Path) -> Path:
    """A copy of the model with ``rows`` in its head (each class's row by name); its meta records which rows, the C
    of each and where they were fitted, added to those of an earlier refit of the same file. Thresholds and
    recalibration shifts saved with the model for those classes are dropped: they were set for the rows replaced."""
    checkpoint = load_checkpoint(checkpoint_path)
    unknown = sorted(set(rows) - set(checkpoint.class_names))
    if unknown:
        raise ModelFileError(f"{checkpoint_path} does not predict {unknown[:3]}: no row to refit there")
    meta = dict(checkpoint.meta)
    earlier = meta.get(HEAD_REFIT_KEY) or {}  # a model refitted before: its other rows stay refitted
    strengths = {**(earlier.get("c") or {}), **{name: row.strength for name, row in rows.items()}}
    places = earlier.get("fitted_on") or []
    places = [places] if isinstance(places, str) else list(places)  # a file of stop 107 names one place
    meta[HEAD_REFIT_KEY] = {
        "classes": sorted(strengths),
        "c": dict(sorted(strengths.items())),
        "fitted_on": [*places, fitted_on],
        "rule": "logistic regression on the model's features of the training split, C on the validation split, "
        "then fitted on both",
    }
    thresholds = meta.get(THRESHOLDS_KEY)
    if thresholds and thresholds.get("values"):
        values = {name: value for name, value in thresholds["values"].items() if name not in rows}
        if values:
            meta[THRESHOLDS_KEY] = {**thresholds, "values": values}
        else:
            del meta[THRESHOLDS_KEY]
    recalibration = meta.get(RECALIBRATION_KEY)
    if recalibration and recalibration.get("shifts"):
        shifts = {name: shift for name, shift in recalibration["shifts"].items() if name not in rows}
        meta[RECALIBRATION_KEY] = {**recalibration, "shifts": shifts}
    return save_checkpoint(out, _with_rows(checkpoint, rows), checkpoint.class_names, **meta)
