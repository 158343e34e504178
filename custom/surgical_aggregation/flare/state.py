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
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.checks import HARM_SIGMAS, HARM_SITES, judged_loss, own_model_figures, validation_regressions
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
    typical_updates: list[dict[str, float]] = field(default_factory=list)  # core.checks.UpdateReference.rounds
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


def select(
    federation: FederationState, version: SavedVersion, judged_loss: float, min_delta: float, eligible: bool = True
) -> bool:
    """Best-model selection and early stopping on the judged validation loss of ``version``: True when it becomes the
    best (lower than the best so far by more than ``min_delta``, and ``eligible``: no judging site found it worse
    than the reference model); otherwise one more round without improvement. A model no aggregation went into (the
    initial one) and a model without a judged loss are never judged."""
    if not version.trained or math.isnan(judged_loss):
        return False
    if eligible and judged_loss < federation.best_loss - min_delta:
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


def recorded_entry(history: list[dict[str, Any]], round_number: int) -> dict[str, Any]:
    """The history's entry for ``round_number`` as recorded (empty when there is none; nothing is created)."""
    return next((entry for entry in history if entry["round"] == round_number), {})


REJECTED_SITES = "rejected_sites"  # a validation record's figures of the sites whose result was rejected
OBJECTS = " (its result was rejected: it objects, not judges)"  # appended to the reason of a rejected site's objection


@dataclass
class Judgement:
    """How the sites' validation of one global model judged it."""

    judged_loss: float  # NaN: no judging site reported a validation loss
    statistic: str  # "mean" of two judging sites, "median" of three or more
    judges: list[str]
    mean_auroc: float
    best: bool  # it became the best global model
    reference: int = INITIAL_ROUND  # the round of the model each judging site compared it with (the best, or initial)
    regressed: dict[str, str] = field(default_factory=dict)  # judging site -> why the model is worse for it
    harmed: dict[str, str] = field(default_factory=dict)  # site -> why the model is worse than its own of the round
    improves: bool = False  # the judged loss says it is the best so far
    disagreement: bool = False  # the judged loss says better but a site's validation says worse, or a site is harmed


def _mean(values: list[float | None]) -> float:
    values = [value for value in values if value is not None and not math.isnan(value)]
    return float(np.mean(values)) if values else math.nan


def judge(
    federation: FederationState,
    version: SavedVersion,
    site_metrics: dict[str, dict[str, float]],
    judging_sites: list[str] | None,
    min_delta: float,
    guard: bool = True,
    objectors: Mapping[str, Mapping[str, float]] | None = None,
) -> Judgement:
    """Record the sites' validation of ``version`` in the history, then select on it (:func:`select`): the judged
    validation loss is the mean of two judging sites', the median of three or more (``judging_sites``: None, every
    site that reported). With ``guard``, a model that a judging site's own validation finds worse than the best model
    (or the initial one) beyond its noise is never the best, and a judged improvement against it is a disagreement.
    ``objectors``: the checked validation of sites whose result of the round was rejected: they do not judge (their
    loss selects nothing), but under ``guard`` a model their own validation finds worse counts as one a judging site
    finds worse (a rejected honest minority, outvoted by sites that agree with each other, still stops the job)."""
    judges = {
        site: metrics["val_loss"]
        for site, metrics in site_metrics.items()
        if judging_sites is None or site in judging_sites
    }
    judged, statistic = judged_loss(judges)
    reference = federation.best.round if federation.best is not None else INITIAL_ROUND
    than = f"the global model {model_label(reference)}"
    regressed, harmed = {}, {}
    now = {site: site_metrics[site] for site in judges}
    objecting = {site: metrics for site, metrics in (objectors or {}).items() if site not in judges}
    if guard and version.trained and version.round != reference:  # each judging site: worse than on the reference?
        recorded = history_entry(federation.history, reference).get("validation", {})
        earlier = {**recorded.get(REJECTED_SITES, {}), **recorded.get("sites", {})}  # every site's, rejected or not
        regressed = validation_regressions(now, earlier, than)
        objections = validation_regressions(objecting, earlier, than)
        regressed |= {site: f"{reason}{OBJECTS}" for site, reason in objections.items()}
    if guard and version.trained:  # each site whose result made the model: worse than its own model of that round?
        harmed = harmed_sites(federation.history, version.round, now, objecting)
    improves = version.trained and not math.isnan(judged) and judged < federation.best_loss - min_delta
    mean_auroc = _mean([metrics.get("val_mean_auroc") for metrics in site_metrics.values()])
    validation = {
        "sites": site_metrics,
        "mean_val_loss": _mean([metrics.get("val_loss") for metrics in site_metrics.values()]),
        "mean_val_auroc": mean_auroc,
        "judged_val_loss": judged,
        "judged_by": {"statistic": statistic, "sites": sorted(judges)},
    }
    if regressed:
        validation["regressed"] = {"than": than, "sites": regressed}
    if objectors:  # recorded whether or not they object: what the rejected sites' own validation said
        validation[REJECTED_SITES] = {site: dict(metrics) for site, metrics in objectors.items()}
    history_entry(federation.history, version.round)["validation"] = validation
    if harmed:
        validation["harmed"] = {"than": f"the model each site trained itself in round {version.round}", "sites": harmed}
    best = select(federation, version, judged, min_delta, eligible=not regressed and not harmed)
    if best:
        validation["best"] = True
    disagreement = (improves and bool(regressed)) or bool(harmed)
    return Judgement(
        judged, statistic, sorted(judges), mean_auroc, best, reference, regressed, harmed, improves, disagreement
    )


def averaged_sites(history: list[dict[str, Any]], round_number: int) -> list[str]:
    """The sites whose results went into the mean of ``round_number``: accepted, free-riders left out."""
    aggregation = recorded_entry(history, round_number).get("aggregation", {})
    free_riders = set(aggregation.get("free_riders", []))
    return [site for site in aggregation.get("accepted", []) if site not in free_riders]


def own_models(history: list[dict[str, Any]], round_number: int) -> dict[str, dict[str, float]]:
    """site -> its validation of the model it trained itself in ``round_number`` (reported with its result, so
    recorded with the validation of the model it trained from), for each site whose result went into that round's
    mean (accepted, and not a free-rider's unmoved model, which is left out of it)."""
    accepted = set(averaged_sites(history, round_number))
    # the model the round's sites trained from: the round before, unless the workflow recorded another (blind mode
    # keeps the last good model's round when a round adds nothing)
    source = recorded_entry(history, round_number).get("aggregation", {}).get("trained_from", round_number - 1)
    trained_from = recorded_entry(history, source).get("validation", {})
    return {
        site: own_model_figures(metrics)
        for site, metrics in {**trained_from.get(REJECTED_SITES, {}), **trained_from.get("sites", {})}.items()
        if site in accepted
    }


def harmed_sites(
    history: list[dict[str, Any]],
    round_number: int,
    judging: Mapping[str, Mapping[str, float]],
    objecting: Mapping[str, Mapping[str, float]],
) -> dict[str, str]:
    """site -> why, for each site whose result went into the mean of ``round_number`` with exactly one other
    site's (:func:`averaged_sites`) and whose validation of that model (``judging``, or ``objecting``: sites whose
    result of the next round was rejected) is worse than its validation of the model it trained itself in that round
    (``local_val_loss``, reported with its result) by more than :data:`HARM_SIGMAS` standard errors. Averaging with
    the other site's result made the model far worse for this site's data than its own work: the other site's
    result harms it (labels flipped, a poisoned update inside every bound), or this site misreports, and the server
    cannot tell which. Two sites only: the mean of more sites' first updates, nearly orthogonal, moves each site's
    model less far than its own training did (clean four- and five-site federations of the attack suite measure 4 to
    6 standard errors after round 0), so there the rule could not tell harm from averaging; the round's median
    rules (clipping, opposed updates, the judged median) act instead."""
    if len(averaged_sites(history, round_number)) != HARM_SITES:
        return {}
    own = own_models(history, round_number)
    than = f"the model it trained itself in round {round_number}"
    harmed = validation_regressions(judging, own, than, HARM_SIGMAS)
    objections = validation_regressions(objecting, own, than, HARM_SIGMAS)
    return harmed | {site: f"{reason}{OBJECTS}" for site, reason in objections.items()}


def disagreement(version: SavedVersion, verdict: Judgement) -> str:
    """Why a job stops on a model the sites' own validation contradicts: the judged loss says it improves while a site
    finds it worse than the last good model beyond its noise, or it is far worse for a site than the model the site
    trained itself that round. Someone reports figures the model does not earn, or a contribution harms one site's
    data, and the server cannot tell which."""
    said = []
    if verdict.regressed and verdict.improves:
        worse = "; ".join(f"for {site}, {reason}" for site, reason in verdict.regressed.items())
        said.append(
            f"the {verdict.statistic} of {verdict.judges}'s validation losses ({verdict.judged_loss:.4f}) says it is "
            f"the best so far, but {worse}"
        )
    said += [f"it is worse for {site} than its own work: {reason}" for site, reason in verdict.harmed.items()]
    return (
        f"the sites disagree about the global model {model_label(version.round)}: {'; '.join(said)}. A site reports "
        "figures the model does not earn (a hostile or broken site), or a contribution harms one site's data (labels "
        "flipped, an update poisoned inside every bound), and the server cannot tell which. Nothing is published; the "
        f"last good global model (the global model {model_label(verdict.reference)}) stays on disk. Compare the "
        "sites' logs and data; judging_sites names the sites whose validation is trusted"
    )
