"""What the server checks in a site's result beyond its structure: the size of its update and its metrics.

* **Update norm.** A site's update is what it sent minus what it received (every floating entry,
  head rows matched by name). A contribution whose update norm is more than ``bound`` times the
  median update norm of the round's other contributions (or, when it is alone, of the previous
  round's accepted ones) is out of proportion and rejected: this catches a site that scales its
  weights (x1e30 is finite) while honest sites, whose updates differ by small factors, pass.
* **Metrics.** A site's validation metrics steer model selection, so each must be a finite number in
  its range (a BCE loss in [0, 100], an AUROC in [0, 1]); anything else is dropped with a reason,
  never an exception.

Plain NumPy, no FLARE.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .head import NAMED_HEAD, HeadSpec, StateDict, to_numpy

MAX_BCE_LOSS = 100.0  # far above any real mean BCE (a confident wrong guess costs ~16 with the metrics' clipping)
DEFAULT_UPDATE_BOUND = 10.0


def update_norm(
    sent: StateDict,
    sent_classes: Sequence[str],
    received: StateDict,
    received_classes: Sequence[str],
    head: HeadSpec = NAMED_HEAD,
    normalize_name: Callable[[str], str] | None = None,
) -> float:
    """L2 norm of ``sent - received`` over the floating entries both have, head rows matched by name."""
    normalize = normalize_name or (lambda name: name)
    total = 0.0
    for key, value in sent.items():
        if key in head.keys or key not in received:
            continue
        new, old = to_numpy(value), to_numpy(received[key])
        if np.issubdtype(new.dtype, np.floating) and new.shape == old.shape:
            total += float(np.sum((new.astype(np.float64) - old.astype(np.float64)) ** 2))
    rows = {normalize(name): row for row, name in enumerate(received_classes)}
    for key in head.keys:
        if key not in sent or key not in received:
            continue
        new, old = to_numpy(sent[key]).astype(np.float64), to_numpy(received[key]).astype(np.float64)
        for row, name in enumerate(sent_classes):
            if normalize(name) in rows and row < len(new):
                total += float(np.sum((new[row] - old[rows[normalize(name)]]) ** 2))
    return math.sqrt(total)


def out_of_proportion(
    norms: Mapping[str, float], previous_median: float | None, bound: float | None = DEFAULT_UPDATE_BOUND
) -> dict[str, str]:
    """Site -> reason, for the updates more than ``bound`` times the median of the others' (or the previous
    round's median, for a site alone in its round). ``bound`` None: no bound (research)."""
    if bound is None:
        return {}
    reasons = {}
    for site, norm in norms.items():
        others = [value for other, value in norms.items() if other != site]
        reference = float(np.median(others)) if others else previous_median
        if reference is None or reference <= 0:
            continue
        if not math.isfinite(norm) or norm > bound * reference:
            origin = "the round's other contributions" if others else "the previous round's contributions"
            reasons[site] = (
                f"update norm {norm:.4g} is out of proportion: more than {bound:g} x the median of {origin} "
                f"({reference:.4g})"
            )
    return reasons


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    return float(value)


def metric_range(name: str) -> tuple[float, float] | None:
    """The sane range of a validation metric this bundle reports, by its name."""
    if name.endswith("_loss") or name == "train_loss":
        return (0.0, MAX_BCE_LOSS)
    if "auroc" in name:
        return (0.0, 1.0)
    return None


def check_metrics(metrics: Any) -> tuple[dict[str, float], list[str]]:
    """(the metrics that are finite numbers in their range, a reason for each one that is not)."""
    if not isinstance(metrics, Mapping):
        return {}, [f"metrics are not a mapping: {type(metrics).__name__}"]
    valid, problems = {}, []
    for name, value in metrics.items():
        number = _number(value)
        if number is None:
            problems.append(f"{name} is not a number: {value!r}"[:200])
            continue
        if not math.isfinite(number):
            problems.append(f"{name} is not finite: {number}")
            continue
        limits = metric_range(str(name))
        if limits is not None and not limits[0] <= number <= limits[1]:
            problems.append(f"{name} = {number:g} is outside [{limits[0]:g}, {limits[1]:g}]")
            continue
        valid[str(name)] = number
    return valid, problems
