"""Model files whose head rows carry class names, and the fresh global model a federation starts from.

A checkpoint is ``{"model": state_dict, "class_names": [...], "meta": {...}}``: the names travel
with the weights, so a model file is never read by position. ``meta`` records the architecture and
the preprocessing the model was trained with (image size, channels and normalisation, or the
sentence encoder: the modality's description, which builds the model), the round that produced it,
and so on. Files of the bundle's first versions also hold a top-level ``in_channels``; it is read
into their preprocessing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..core.errors import ModelFileError
from ..core.head import NAMED_HEAD
from ..data.storage import read_tensor_file, write_atomically
from ..modalities import DEFAULT_ARCHITECTURE
from ..modalities.registry import modality_for_architecture

PREPROCESSING_KEY = "preprocessing"  # checkpoint meta: what the model is fed (the modality's description)
ARCHITECTURE_KEY = "architecture"
LEGACY_IN_CHANNELS = "in_channels"  # top level of the first versions' files; now in their preprocessing


@dataclass
class Checkpoint:
    """A state dict with its head's class names and free-form metadata (round, metrics, ...)."""

    state: dict[str, torch.Tensor]
    class_names: list[str]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def architecture(self) -> str:
        return str(self.meta.get(ARCHITECTURE_KEY, DEFAULT_ARCHITECTURE))

    @property
    def preprocessing(self) -> dict[str, Any]:
        """What the model reads, as its modality describes it (empty for a file that does not say)."""
        return dict(self.meta.get(PREPROCESSING_KEY) or {})

    def build_model(self) -> nn.Module:
        model = modality_for_architecture(self.architecture).build_model(self.class_names, self.preprocessing)
        model.load_state_dict(self.state)
        return model


def save_checkpoint(
    path: str | Path, state: Mapping[str, torch.Tensor], class_names: Sequence[str], **meta: Any
) -> Path:
    """Write atomically (temp file, fsync, rename) so a crash never leaves a half-written model; a full disk is a
    :class:`~surgical_aggregation.core.errors.StorageError` and the previous file stays. ``meta`` should carry the
    architecture and preprocessing (:data:`ARCHITECTURE_KEY`, :data:`PREPROCESSING_KEY`)."""
    payload = {
        "model": {key: torch.as_tensor(value).detach().cpu() for key, value in state.items()},
        "class_names": list(class_names),
        "meta": meta,
    }
    return write_atomically(Path(path), lambda handle: torch.save(payload, handle), "model file")


def load_checkpoint(path: str | Path) -> Checkpoint:
    path = Path(path)
    payload = read_tensor_file(path, "model file")
    if not isinstance(payload, dict) or "model" not in payload or "class_names" not in payload:
        raise ModelFileError(f"{path} is not a surgical-aggregation checkpoint (needs 'model' and 'class_names')")
    weight = payload["model"].get(NAMED_HEAD.weight_key)
    if weight is not None and weight.shape[0] != len(payload["class_names"]):
        raise ModelFileError(
            f"{path}: head has {weight.shape[0]} rows but {len(payload['class_names'])} class names are stored"
        )
    meta = dict(payload.get("meta", {}))
    if LEGACY_IN_CHANNELS in payload:  # a file of the first versions: its channels, where the modality reads them
        meta[PREPROCESSING_KEY] = {
            LEGACY_IN_CHANNELS: int(payload[LEGACY_IN_CHANNELS]),
            **(meta.get(PREPROCESSING_KEY) or {}),
        }
    checkpoint = Checkpoint(state=payload["model"], class_names=list(payload["class_names"]), meta=meta)
    try:
        modality_for_architecture(checkpoint.architecture)
    except ValueError as error:
        raise ModelFileError(f"{path}: {error}") from None
    return checkpoint


def initial_global_state(
    architecture: str = DEFAULT_ARCHITECTURE,
    preprocessing: Mapping[str, Any] | None = None,
    seed: int = 0,
    pretrained_weights: str | Path | None = None,
) -> dict[str, torch.Tensor]:
    """A fresh global model before any site is known: a seeded (or pretrained) backbone, a head of 0 rows.

    The union head grows as sites report their classes (see ``core.head.extend_head``).
    """
    modality = modality_for_architecture(architecture)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = modality.build_model(["No Finding"], preprocessing or {})  # one placeholder row, dropped below
    if pretrained_weights is not None:
        modality.load_pretrained(model, str(pretrained_weights))
    state = model.state_dict()
    for key in NAMED_HEAD.keys:
        state[key] = state[key][:0].clone()
    return state


def probe_outputs(
    architecture: str, preprocessing: Mapping[str, Any]
) -> Callable[[Mapping[str, Any], Sequence[str]], Any]:
    """The outputs of a model state (any head size) on the modality's fixed probe input, in eval mode: the server's
    model check (:func:`surgical_aggregation.core.checks.model.model_problems`)."""
    modality = modality_for_architecture(architecture)
    inputs = modality.probe_input(preprocessing)
    models: dict[int, nn.Module] = {}

    def outputs(state: Mapping[str, Any], class_names: Sequence[str]) -> Any:
        rows = len(class_names)
        if rows not in models:  # the names only size the head here
            models[rows] = modality.build_model([f"probe class {index}" for index in range(rows)], preprocessing).eval()
        model = models[rows]
        model.load_state_dict({key: torch.as_tensor(np.asarray(value)) for key, value in state.items()})
        with torch.inference_mode():
            return model(inputs).float().numpy()

    return outputs
