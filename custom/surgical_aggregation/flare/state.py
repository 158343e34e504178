"""What the server needs to carry a federation across a crash: persisted after every round, read by a resubmitted job.

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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.errors import ModelFileError, StateFileError
from ..core.head import to_numpy
from ..data.storage import keep_previous, read_tensor_file, write_atomically
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


def select(federation: FederationState, version: SavedVersion, judged_loss: float, min_delta: float) -> bool:
    """Best-model selection and early stopping on the judged validation loss of ``version``: True when it becomes the
    best (lower than the best so far by more than ``min_delta``); otherwise one more round without improvement. A
    model no aggregation went into (the initial one) and a model without a judged loss are never judged."""
    if not version.trained or math.isnan(judged_loss):
        return False
    if judged_loss < federation.best_loss - min_delta:
        federation.best_loss, federation.best = judged_loss, version
        federation.rounds_without_improvement = 0
        return True
    federation.rounds_without_improvement += 1
    return False
