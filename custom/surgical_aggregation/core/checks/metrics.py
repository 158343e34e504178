"""The checks of the validation metrics a site reports."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import Reasons, cut_short, server_check, shown_repr

MAX_BCE_LOSS = 100.0  # far above any real mean BCE (a confident wrong guess costs ~16 with the metrics' clipping)
PAIRED_LOSS_KEYS = (
    "val_loss_minus_own",
    "val_loss_minus_own_se",
    "val_loss_minus_start",
    "val_loss_minus_start_se",
    "val_loss_minus_reference",
    "val_loss_minus_reference_se",
    # the same once each model's logits are recalibrated in the large to the site's images (the harm test's second
    # half: core.judging.harm_of; against a leave-one-out candidate's reference, on record only)
    "val_recalibrated_loss_minus_own",
    "val_recalibrated_loss_minus_own_se",
    "val_recalibrated_loss_minus_start",
    "val_recalibrated_loss_minus_start_se",
    "val_recalibrated_loss_minus_reference",
    "val_recalibrated_loss_minus_reference_se",
)
PAIRED_AUROC_KEYS = (
    "val_auroc_minus_own",
    "val_auroc_minus_own_se",
    "val_auroc_minus_start",
    "val_auroc_minus_start_se",
    "val_auroc_minus_reference",
    "val_auroc_minus_reference_se",
)
# paired over the same images: the most any BatchNorm layer's running statistics stand further from what the site's
# validation images give than the other model's do (training.loops.BatchNormReadings; a reading, no standard error)
BATCHNORM_KEYS = ("val_batchnorm_minus_own", "val_batchnorm_minus_start", "val_batchnorm_minus_reference")
# What a site reports: its validation of the model it received (the loss, its standard error across images, the loss
# recalibrated in the large, mean AUROC), the same of its model after local training, its training loss, and
# per-class AUROC of its own classes.
METRIC_KEYS = (
    "val_loss",
    "val_loss_se",
    "val_recalibrated_loss",
    "val_mean_auroc",
    "local_val_loss",
    "local_val_loss_se",
    "local_val_mean_auroc",
    "train_loss",
    # paired over the site's validation images (evaluation.metrics.paired_loss_difference): this model's loss minus
    # the site's loss of the model it trained itself in the round that made this one, minus its loss of the model that
    # round started from, and minus its loss of the round's candidate the server names (a leave-one-out candidate
    # against the round's first), each with its standard error; the same of its mean AUROC (the standard error by
    # the bootstrap over its images)
    *PAIRED_LOSS_KEYS,
    *PAIRED_AUROC_KEYS,
    *BATCHNORM_KEYS,
)
PER_CLASS_METRIC_PREFIXES = ("val_auroc/", "local_val_auroc/")


def metric_range(name: str) -> tuple[float, float] | None:
    """The sane range of a validation metric this bundle reports, by its name."""
    if name in PAIRED_AUROC_KEYS:  # a difference of two AUROCs, or its standard error
        return (0.0, 1.0) if name.endswith("_se") else (-1.0, 1.0)
    if name.endswith(("_loss", "_se")):
        return (0.0, MAX_BCE_LOSS)
    if name in PAIRED_LOSS_KEYS:  # a difference of two losses
        return (-MAX_BCE_LOSS, MAX_BCE_LOSS)
    if "auroc" in name:
        return (0.0, 1.0)
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    return float(value)


def _documented(name: Any, site_classes: set[str]) -> bool:
    if not isinstance(name, str):
        return False
    if name in METRIC_KEYS:
        return True
    return any(name.startswith(prefix) and name[len(prefix) :] in site_classes for prefix in PER_CLASS_METRIC_PREFIXES)


@server_check(
    "metrics",
    f"only the documented keys ({', '.join(f'`{key}`' for key in METRIC_KEYS)}, and `val_auroc/<class>`, "
    "`local_val_auroc/<class>` for the site's own classes); each a number, finite, in its range (a BCE loss in "
    f"[0, {MAX_BCE_LOSS:g}], an AUROC in [0, 1])",
    "val_loss = -1e+09 is outside [0, 100]",
)
def check_metrics(metrics: Any, site_classes: Sequence[str] = ()) -> tuple[dict[str, float], Reasons]:
    """(the documented metrics that are finite numbers in their range, a reason for each one that is not; other
    keys are dropped with one reason). ``site_classes``: the names of the site's classes its per-class AUROC may
    use (its own spelling and the canonical one)."""
    if not isinstance(metrics, Mapping):
        return {}, [f"metrics are not a mapping: {type(metrics).__name__}"]
    classes = set(site_classes)
    valid, problems, undocumented = {}, [], []
    for name, value in metrics.items():
        if not _documented(name, classes):
            undocumented.append(name)
            continue
        number = _number(value)
        if number is None:
            problems.append(f"{name} is not a number: {shown_repr(value)}")
        elif not math.isfinite(number):
            problems.append(f"{name} is not finite: {number}")
        elif (limits := metric_range(name)) is not None and not limits[0] <= number <= limits[1]:
            problems.append(f"{name} = {number:g} is outside [{limits[0]:g}, {limits[1]:g}]")
        else:
            valid[name] = number
    if undocumented:
        examples = [cut_short(name) for name in undocumented[:3]]
        problems.append(f"{len(undocumented)} undocumented metric key(s) dropped, e.g. {examples}")
    return valid, problems
