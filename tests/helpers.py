"""Helpers shared by tests: toy state dicts, head rows by name, reference-data gate."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from surgical_aggregation.aggregation import HeadSpec
from surgical_aggregation.data.reference import reference_file

TOY_HEAD = HeadSpec("head.weight", "head.bias")
TOY_FEATURES = 4


def toy_state(n_classes: int, seed: int) -> dict[str, torch.Tensor]:
    """A miniature model's state: a conv, a BatchNorm (params + buffers) and a head of n rows."""
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    return {
        "backbone.conv.weight": rand(TOY_FEATURES, 1, 3, 3),
        "backbone.bn.weight": rand(TOY_FEATURES),
        "backbone.bn.bias": rand(TOY_FEATURES),
        "backbone.bn.running_mean": rand(TOY_FEATURES),
        "backbone.bn.running_var": rand(TOY_FEATURES).abs() + 0.5,
        "backbone.bn.num_batches_tracked": torch.tensor(seed * 7 + 3, dtype=torch.int64),
        "head.weight": rand(n_classes, TOY_FEATURES),
        "head.bias": rand(n_classes),
    }


def rows_by_name(state: dict, classes: Sequence[str], head: HeadSpec = TOY_HEAD) -> dict[str, np.ndarray]:
    """class name -> its head row (weight row followed by bias) as float64."""
    weight = np.asarray(state[head.weight_key], dtype=np.float64)
    bias = np.asarray(state[head.bias_key], dtype=np.float64)
    return {name: np.append(weight[i], bias[i]) for i, name in enumerate(classes)}


def require_reference(name: str) -> Path:
    """A torchxrayvision data file; CI installs it, so there its absence fails instead of skipping."""
    path = reference_file(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} missing: CI must install torchxrayvision (pip install --no-deps torchxrayvision)")
        pytest.skip(f"{name} not installed (pip install --no-deps torchxrayvision)")
    return path


def tiny_job(spec, cache: Path, rounds: int):
    """A job spec shrunk for tests: 30 patients of 32 px per site, 2 batches per epoch, short timeouts."""
    for site in spec.sites.values():
        site.update(
            embedded={"patients": 30, "image_size": 32, "seed": site.get("embedded", {}).get("seed", 0)},
            image_size=32,
            batch_size=8,
            max_batches_per_epoch=2,
            cache_dir=str(cache),
        )
    spec.controller.update(num_rounds=rounds, handshake_timeout=300, train_timeout=300, validate_timeout=300)
    return spec
