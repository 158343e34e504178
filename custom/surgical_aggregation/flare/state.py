"""What the server needs to carry a federation across a crash: persisted after every round, read by a resubmitted job.

FLARE 2.9 cannot restore this workflow after a server crash: its component snapshot
(``ServerEngine.persist_components``) saves nothing for a ``ModelController``, and the crashed job stays
RUNNING in the job store. So the controller writes its own state after every completed round to
``<server workspace>/surgical_aggregation/<job name>/federation.pt``, outside any one job's folder; a job
of the same name submitted later finds it and continues from the next round with its union, best
model, early-stopping counters, warm-up state and round history. A federation that finished marks
its state finished, so the next job of that name starts afresh.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.head import to_numpy

STATE_DIR = "surgical_aggregation"
STATE_FILE = "federation.pt"


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
    update_norm_median: float | None = None  # of the last round's accepted updates (the next round's reference)
    aggregated_rounds: int = 0  # rounds that aggregated min_clients valid contributions


def state_path(workspace_root: str | Path, job_name: str) -> Path:
    return Path(workspace_root) / STATE_DIR / job_name / STATE_FILE


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
    """Write atomically (temp file + rename): a crash while writing leaves the previous round's state."""
    payload = asdict(federation)
    payload["latest"] = _version_payload(federation.latest)
    payload["best"] = _version_payload(federation.best)
    payload["personal_parts"] = {site: _tensors(parts) for site, parts in federation.personal_parts.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    torch.save(payload, temporary)
    temporary.replace(path)


def load_state(path: Path) -> FederationState | None:
    if not path.is_file():
        return None
    payload = torch.load(path, map_location="cpu", weights_only=True)
    payload["latest"] = _version(payload["latest"])
    payload["best"] = _version(payload["best"])
    payload["personal_parts"] = {
        site: {key: value.numpy() for key, value in parts.items()} for site, parts in payload["personal_parts"].items()
    }
    return FederationState(**payload)
