"""What the server needs to carry a federation across a crash, persisted after every round and read by a resubmitted
job; and the pure rules that change it each round: best-model selection and early stopping (:func:`judge`,
:func:`select`).

FLARE 2.9 cannot restore this workflow after a server crash: its component snapshot
(``ServerEngine.persist_components``) saves nothing for a ``ModelController``, and the crashed job stays
RUNNING in the job store. So the controller writes its own state after every completed round to
``<server workspace>/surgical_aggregation/<job name>/``, outside any one job's folder; a job of the same name
submitted later finds it and continues from the next round with its union, best model, early-stopping
counters, warm-up state, update history and round history. A federation that finished marks its state
finished, so the next job of that name starts afresh.

The folder holds three files, each written atomically (temporary file, fsync, rename):

* ``federation.pt``: the state after the last completed round;
* ``federation.previous.pt``: the state one save earlier (the backup a corrupt ``federation.pt`` falls back to,
  with ``resume: "backup"``);
* ``federation.json``: a small readable record (job, round, finished) that says a state should exist, so a
  deleted ``federation.pt`` is reported rather than silently restarted from round 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.checks.model import changes_against_the_bar, judged_loss, recalibrated_changes
from ..core.errors import ModelFileError, StateFileError
from ..core.head import HeadSpec, extend_head, slice_for_client, to_numpy
from ..core.methods import head_classes_for_site
from ..data.storage import keep_previous, read_tensor_file, write_atomically
from ..evaluation.run_summary import INITIAL_ROUND, model_label
from .protocol import RESUME_BACKUP, RESUME_LATEST, RESUME_NEVER

STATE_DIR = "surgical_aggregation"
STATE_FILE = "federation.pt"
BACKUP_FILE = "federation.previous.pt"
STATUS_FILE = "federation.json"


@dataclass
class SavedVersion:
    """A global model and the round that produced it (-1: before training)."""

    round: int
    state: dict[str, Any]
    class_names: list[str]
    personal: dict[str, dict[str, Any]] = field(default_factory=dict)  # PFL: site -> its full model state
    trained: bool = False  # some round's aggregation is in it (only such a model can be the best)


@dataclass
class FederationState:
    settings: dict[str, Any]  # what must match for a job to continue this federation (method, backbone, ...)
    latest: SavedVersion  # the last completed round's global model
    best: SavedVersion | None
    best_loss: float
    rounds_without_improvement: int
    warmed_up: list[str]
    fresh_classes: list[str]  # classes whose rows started from scratch in this federation (warm-up decides on them)
    personal_parts: dict[str, dict[str, Any]]
    history: list[dict[str, Any]]
    finished: bool = False
    job_id: str = ""  # the job that wrote it last
    typical_updates: list[dict[str, float]] = field(default_factory=list)  # core.checks.update.UpdateReference.rounds
    aggregated_rounds: int = 0  # rounds that aggregated min_clients valid contributions


def state_path(workspace_root: str | Path, job_name: str) -> Path:
    return Path(workspace_root) / STATE_DIR / job_name / STATE_FILE


def backup_path(path: Path) -> Path:
    return path.with_name(BACKUP_FILE)


def status_path(path: Path) -> Path:
    return path.with_name(STATUS_FILE)


def _tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {key: torch.as_tensor(np.array(to_numpy(value))) for key, value in state.items()}


def _version_payload(version: SavedVersion | None) -> dict[str, Any] | None:
    if version is None:
        return None
    return {
        "round": version.round,
        "state": _tensors(version.state),
        "class_names": list(version.class_names),
        "personal": {site: _tensors(parts) for site, parts in version.personal.items()},
        "trained": version.trained,
    }


def _version(payload: dict[str, Any] | None) -> SavedVersion | None:
    if payload is None:
        return None
    to_arrays = lambda state: {key: value.numpy() for key, value in state.items()}  # noqa: E731
    personal = {site: to_arrays(parts) for site, parts in payload["personal"].items()}
    return SavedVersion(
        int(payload["round"]), to_arrays(payload["state"]), list(payload["class_names"]), personal, payload["trained"]
    )


def save_state(path: Path, federation: FederationState) -> None:
    """Keep the previous save as the backup, write the new state atomically, then its status record. A full disk
    raises :class:`StorageError` with every earlier file intact."""
    payload = asdict(federation)
    payload["latest"] = _version_payload(federation.latest)
    payload["best"] = _version_payload(federation.best)
    payload["personal_parts"] = {site: _tensors(parts) for site, parts in federation.personal_parts.items()}
    keep_previous(path, backup_path(path))
    write_atomically(path, lambda handle: torch.save(payload, handle), "federation state")
    status = {"job_id": federation.job_id, "round": federation.latest.round, "finished": federation.finished}
    write_atomically(status_path(path), lambda handle: handle.write(json.dumps(status).encode()), "federation status")


def _what_to_do(path: Path) -> str:
    backup = backup_path(path)
    options = []
    if backup.is_file():
        options.append(
            f'continue from the state saved one round earlier ({backup.name}): submit the job with resume "backup"'
        )
    options.append(f'start the federation afresh: submit the job with resume "never" (or remove {path.parent})')
    return "; or ".join(options)


def _read(path: Path) -> FederationState:
    try:
        payload = read_tensor_file(path, "federation state")
        payload["latest"] = _version(payload["latest"])
        payload["best"] = _version(payload["best"])
        payload["personal_parts"] = {
            site: {key: value.numpy() for key, value in parts.items()}
            for site, parts in payload["personal_parts"].items()
        }
        return FederationState(**payload)
    except (ModelFileError, KeyError, TypeError, AttributeError) as error:
        raise StateFileError(f"the saved federation {path} cannot be read ({error}); to {_what_to_do(path)}") from None


def load_state(path: Path, resume: str = RESUME_LATEST) -> FederationState | None:
    """The saved federation a job continues, or None (start afresh). ``resume``: "latest" reads ``federation.pt``,
    "backup" the state saved one round earlier, "never" nothing. A state that should exist but is missing or
    unreadable is a :class:`StateFileError` naming the file and the two ways on."""
    if resume == RESUME_NEVER:
        return None
    if resume == RESUME_BACKUP:
        backup = backup_path(path)
        if not backup.is_file():
            raise StateFileError(f'resume "backup" asks for {backup}, which does not exist')
        return _read(backup)
    if path.is_file():
        return _read(path)
    status = status_path(path)
    if status.is_file():
        try:
            recorded = json.loads(status.read_text())
        except (OSError, ValueError):
            recorded = {}
        if not recorded.get("finished", False):
            raise StateFileError(
                f"{status} records an unfinished federation (job {recorded.get('job_id', '?')}, round "
                f"{recorded.get('round', '?')}), but its state {path} is missing; to {_what_to_do(path)}"
            )
    return None


START_TIE = 1e-9  # a trained model whose judged loss equals the initial model's may be the best


def initial_bar(federation: FederationState, min_delta: float) -> float:
    """The initial model's judged loss, the bar the first best must not exceed (inf: none was judged), from the
    ``best_loss`` that :func:`select` keeps until a trained model is the best."""
    return federation.best_loss - min_delta - START_TIE


def select(
    federation: FederationState,
    version: SavedVersion,
    judged_loss: float,
    min_delta: float,
    bar_loss: float | None = None,
) -> bool:
    """Best-model selection and early stopping on the judged validation loss of ``version``: True when it becomes the
    best (lower than the best so far by more than ``min_delta``); otherwise one more round without improvement. A
    model no aggregation went into (the initial one) and a model without a judged loss are never the best; before any
    trained model is the best, the initial model's judged loss is the bar: the first best is judged no worse than where
    training started (a trained model the judging sites find worse than the initial one is never published as the
    best). ``bar_loss``: the judged loss weighed instead, so that each site is compared with itself: before the first
    best, the initial model's judged loss plus the judging sites' judged change of loss against their own loss of it
    (``core.checks.model.changes_against_the_bar``); after it, the best's judged loss plus their judged change against
    their own loss of the best."""
    if math.isnan(judged_loss):
        return False
    if not version.trained:
        if federation.best is None:  # "lower by more than min_delta" than this bar: at most the initial model's loss
            federation.best_loss = min(federation.best_loss, judged_loss + min_delta + START_TIE)
        return False
    weighed = judged_loss if bar_loss is None else bar_loss
    if weighed < federation.best_loss - min_delta:
        federation.best_loss, federation.best = judged_loss, version
        federation.rounds_without_improvement = 0
        return True
    federation.rounds_without_improvement += 1
    return False


def continue_or_start(
    saved: FederationState | None,
    settings: dict[str, Any],
    initial_state: dict[str, Any],
    initial_classes: list[str],
    path: Path,
) -> tuple[FederationState, bool]:
    """The unfinished federation ``saved`` (from ``path``), which must have run with ``settings`` (a
    :class:`StateFileError` otherwise), or a fresh one from the initial model; and whether it continues."""
    if saved is not None and not saved.finished:
        if saved.settings != settings:
            raise StateFileError(
                f"the unfinished federation in {path} ran with {saved.settings}, this job asks for {settings}; submit "
                'the job unchanged, or with resume "never" to start afresh'
            )
        return saved, True
    version = SavedVersion(INITIAL_ROUND, initial_state, initial_classes)
    return FederationState(settings, version, None, math.inf, 0, [], [], {}, []), False


def grow_union(federation: FederationState, classes: Iterable[str], head: HeadSpec, seed: int) -> list[str]:
    """Append head rows, in name order, for ``classes`` the latest global model does not have yet (each first row
    seeded by its name, the same at every site); returns the new classes, which start from scratch."""
    latest = federation.latest
    new = sorted(set(classes) - set(latest.class_names))
    if new:
        state, names = extend_head(latest.state, latest.class_names, new, head, seed)
        federation.latest = SavedVersion(latest.round, state, names, latest.personal)
        federation.fresh_classes = sorted({*federation.fresh_classes, *new})
    return new


def site_view(
    version: SavedVersion, site: str, classes: list[str], reported: list[str], method: str, head: HeadSpec
) -> tuple[dict[str, Any], list[str]]:
    """What a site may see of ``version`` (params, the names of their head rows): the backbone and its own rows
    (``classes``) in its own spelling (``reported``); PFL: its personal model; union-head comparators: the union."""
    if site in version.personal:
        return version.personal[site], reported
    head_classes = head_classes_for_site(method, classes, version.class_names)
    params = slice_for_client(version.state, version.class_names, head_classes, head)
    return params, head_classes if head_classes != classes else reported


def history_entry(history: list[dict[str, Any]], round_number: int) -> dict[str, Any]:
    """The history's entry for the global model of ``round_number`` (created in round order)."""
    for entry in history:
        if entry["round"] == round_number:
            return entry
    entry = {"round": round_number, "model": model_label(round_number)}
    history.append(entry)
    history.sort(key=lambda item: item["round"])
    return entry


@dataclass
class Judgement:
    """How the sites' validation of one global model judged it."""

    judged_loss: float  # NaN: no judging site reported a validation loss
    statistic: str  # "mean" of two judging sites, "median" of three or more
    judges: list[str]
    mean_auroc: float
    best: bool  # it became the best global model
    against_best: dict[str, Any] | None = None  # after the first best: the judged change against it (its record)


def changes_against_the_best(
    federation: FederationState, losses: Mapping[str, float]
) -> tuple[dict[str, float], list[str]]:
    """Each judging site's loss of a model (``losses``) minus its own loss of the best model so far: a later model
    becomes the best when the judged statistic of these changes (the mean of two, the median of three or more) is
    below ``-min_delta``, each site compared with itself. On losses compared across sites one liar sets both sides
    (100 for the best's round, 0 for a later one: the later model the best, though every honest site finds it worse);
    paired, it supplies one change of the median's inputs. A judge that did not judge the best (it joined later, or
    was left out of that round) counts as a change of 0, no improvement: otherwise the sites that judged both could
    dwindle to the liar alone. Returns (site -> change, the judges without a loss of the best); none when no judge
    judged the best (the losses as they are then decide)."""
    entry = next((entry for entry in federation.history if entry["round"] == federation.best.round), {})
    validation = entry.get("validation", {})
    sites = validation.get("sites", {})
    best = {site: sites[site].get("val_loss", math.nan) for site in validation.get("judged_by", {}).get("sites", [])}
    best = {site: loss for site, loss in best.items() if math.isfinite(loss)}
    judges = {site: loss for site, loss in losses.items() if math.isfinite(loss)}
    if not set(judges) & set(best):
        return {}, []
    unpaired = sorted(site for site in judges if site not in best)
    return {site: loss - best[site] if site in best else 0.0 for site, loss in judges.items()}, unpaired


def _mean(values: list[float | None]) -> float:
    values = [value for value in values if value is not None and not math.isnan(value)]
    return float(np.mean(values)) if values else math.nan


def judge(
    federation: FederationState,
    version: SavedVersion,
    site_metrics: Mapping[str, Mapping[str, float]],
    judging_sites: Sequence[str] | None,
    min_delta: float,
    untrained_start: bool = True,
) -> Judgement:
    """Record the sites' validation of ``version`` in the history, then select on it (:func:`select`): the judged
    validation loss is the mean of two judging sites', the median of three or more (``judging_sites``: None, every
    site that reported one); before any trained model is the best, the initial model's bar weighs each judging site's
    change of loss against its own loss of the initial model (recorded as the validation's ``bar``), and when the job
    started from untrained heads (``untrained_start``) the sites whose own training did not lower their loss cannot
    veto it; a site's change counts as the lower of its change as it is and once recalibrated in the large, where the
    model ranks its images no worse than the initial model and its own model of the first round (recorded as the
    bar's ``recalibrated``). Whether the model harms a site is the screening's (``core.judging``), before this."""
    judges = {
        site: metrics["val_loss"]
        for site, metrics in site_metrics.items()
        if "val_loss" in metrics and (judging_sites is None or site in judging_sites)
    }
    judged, statistic = judged_loss(judges)
    # in site order, not the order the results arrived in: a run's means are then the same to the last bit every time
    in_site_order = {site: site_metrics[site] for site in sorted(site_metrics)}
    mean_auroc = _mean([metrics.get("val_mean_auroc") for metrics in in_site_order.values()])
    validation = {
        "sites": {site: dict(metrics) for site, metrics in in_site_order.items()},
        "mean_val_loss": _mean([metrics.get("val_loss") for metrics in in_site_order.values()]),
        "mean_val_auroc": mean_auroc,
        "judged_val_loss": judged,
        "judged_by": {"statistic": statistic, "sites": sorted(judges)},
    }
    history_entry(federation.history, version.round)["validation"] = validation
    bar_loss = None
    if version.trained and federation.best is None and math.isfinite(federation.best_loss):
        entry = next((entry for entry in federation.history if entry["round"] == INITIAL_ROUND), {})
        initial = entry.get("validation", {}).get("sites", {})
        # each site's change once recalibrated too: its validation of the model of the last round trained from the
        # initial one (round 0, unless it made no model) gives its recalibrated loss of the initial model
        first = next(
            (
                entry
                for entry in reversed(federation.history)
                if (entry.get("aggregation") or {}).get("trained_from") == INITIAL_ROUND and "validation" in entry
            ),
            {},
        )
        judged_figures = {site: site_metrics[site] for site in judges}
        again = recalibrated_changes(judged_figures, first.get("validation", {}).get("sites", {}), initial)
        changes, without_veto = changes_against_the_bar(
            judges, initial, START_TIE, vetoes=untrained_start, recalibrated=again
        )
        if changes:  # judges that validated the initial model too; without one, the losses as they are
            change = judged_loss(changes)[0]
            bar_loss = initial_bar(federation, min_delta) + change
            validation["bar"] = {
                "judged_change": change,
                "judged_val_loss": bar_loss,
                "changes": dict(sorted(changes.items())),
                "no_veto": without_veto,
            }
            if again:
                validation["bar"]["recalibrated"] = dict(sorted(again.items()))
    elif version.trained and federation.best is not None:
        changes, unpaired = changes_against_the_best(federation, judges)
        if changes:  # judges of the best too; without one, the losses as they are
            change = judged_loss(changes)[0]
            bar_loss = federation.best_loss + change
            validation["against_best"] = {
                "round": federation.best.round,
                "judged_change": change,
                "changes": dict(sorted(changes.items())),
                "not_judges_of_the_best": unpaired,
            }
    best = select(federation, version, judged, min_delta, bar_loss)
    if best:
        validation["best"] = True
    return Judgement(judged, statistic, sorted(judges), mean_auroc, best, validation.get("against_best"))
