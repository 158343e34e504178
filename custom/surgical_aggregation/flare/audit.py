"""Everything a site received and sent, kept at the site so a hospital can verify what it learned and what left it.

One JSON line per task and direction in ``audit/exchanges.jsonl`` (task, round, the head's class names
and tensor shapes, which metrics; no weights), for every task type: the handshake, training,
validation, model submission and the publication of the global model. Before publication, a site
of a surgical-aggregation job receives only rows of its own classes, named in its own spelling; the
records prove it. Optionally the head rows (or the whole state) themselves are kept in
``exchanges/<task>-round-NNN-<direction>.pt`` (``-2``, ``-3``, ... for further exchanges of one task and round, such
as the models of a site-to-site evaluation; each record names its file) (``record_exchanges``: head | full | off).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.head import NAMED_HEAD, to_numpy
from ..data.names import RECORD_MODES

AUDIT_DIR = "audit"
AUDIT_FILE = "exchanges.jsonl"
EXCHANGES_DIR = "exchanges"


class SiteAudit:
    """Appends one record per exchange; keeps the exchanged tensors when asked."""

    def __init__(self, app_dir: str | Path, record_tensors: str = "head") -> None:
        if record_tensors not in RECORD_MODES:
            raise ValueError(f"record_tensors must be one of {RECORD_MODES}, got {record_tensors!r}")
        self.app_dir = Path(app_dir)
        self.record_tensors = record_tensors

    @property
    def path(self) -> Path:
        return self.app_dir / AUDIT_DIR / AUDIT_FILE

    def record(
        self,
        task: str,
        round_number: int | None,
        direction: str,
        class_names: Sequence[str] = (),
        state: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
        note: str = "",
        keep_tensors: bool = True,
        privacy: Mapping[str, Any] | None = None,
    ) -> None:
        """``direction``: received | sent, or what the server later said of a sent training result: aggregated |
        not_aggregated (rejected, or it never arrived: a late result is dropped); in blind mode also decrypted (the
        model a received task carried, in clear) | encrypted (a result before its encryption). ``privacy``: a DP-SGD
        site's privacy report, with what it sent.
        ``keep_tensors`` off: the exchange has its own file (the published model), only the record is kept."""
        state = state or {}
        entry = {
            "time": round(time.time(), 3),
            "task": task,
            "round": round_number,
            "direction": direction,
            "class_names": list(class_names),
            "head_shapes": {key: list(to_numpy(state[key]).shape) for key in NAMED_HEAD.keys if key in state},
            "entries": len(state),
            "metrics": sorted(metrics or {}),
        }
        if note:
            entry["note"] = note
        if privacy:  # a DP-SGD site's epsilon spent so far, with its delta and budget
            entry["privacy"] = dict(privacy)
        kept = None
        if state and keep_tensors and self.record_tensors != "off":
            kept = self._free_file(exchange_file_name(task, round_number, direction))
            entry["tensors"] = f"{EXCHANGES_DIR}/{kept.name}"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as log:
            log.write(json.dumps(entry) + "\n")
        if kept is not None:
            self._keep_tensors(kept, task, round_number, direction, class_names, state)

    def _free_file(self, name: str) -> Path:
        """``exchanges/<name>``, or ``<stem>-2.pt``, ``-3``, ... when taken: one file per exchange (the models of a
        site-to-site evaluation all arrive without a round)."""
        folder = self.app_dir / EXCHANGES_DIR
        path, copy = folder / name, 1
        while path.exists():
            copy += 1
            path = folder / f"{Path(name).stem}-{copy}.pt"
        return path

    def _keep_tensors(
        self,
        path: Path,
        task: str,
        round_number: int | None,
        direction: str,
        class_names: Sequence[str],
        state: Mapping,
    ) -> None:
        keys = [key for key in NAMED_HEAD.keys if key in state] if self.record_tensors == "head" else list(state)
        payload = {
            "task": task,
            "round": round_number,
            "direction": direction,
            "class_names": list(class_names),
            "state": {key: torch.as_tensor(np.array(to_numpy(state[key]))) for key in keys},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(payload, path)


def exchange_file_name(task: str, round_number: int | None, direction: str) -> str:
    return f"{task}-round-{-1 if round_number is None else round_number:03d}-{direction}.pt"


def read_audit(app_dir: str | Path) -> list[dict[str, Any]]:
    """A site's audit records, oldest first."""
    path = Path(app_dir) / AUDIT_DIR / AUDIT_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
