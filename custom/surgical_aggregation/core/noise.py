"""Gaussian noise on the round's aggregate, the server's part of the defences against backdoors.

Sun, Kairouz, Suresh, McMahan (*Can You Really Backdoor Federated Learning?*, 2019) bound each update's norm and add a
little Gaussian noise to the aggregate ("weak differential privacy"); FLAME (Nguyen et al., *FLAME: Taming Backdoors in
Federated Learning*, USENIX Security 2022) sets the noise by the clipping bound: a standard deviation of
``lambda x S`` per value, ``S`` the round's median norm of the updates (the bound its clipping scales every update
to), ``lambda`` 0.001 for image classification. The server's clipping (``clip_updates``) is that bound here; this
module adds the noise, part by part: the backbone's learned weights as one vector, and each head row (weights and
bias, matched by name) over the sites that sent it. The BatchNorm statistics take none (a running variance must stay
positive; the sites measure them, their own checks hold them).

The noise is drawn from a generator seeded by the round's number and the names of its contributors, so a run, a
resumed run and a candidate the round recomputes without a site give the same numbers every time. Plain NumPy, no FLARE.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .checks import server_check
from .checks.update import WEIGHTS, row_part
from .head import NAMED_HEAD, HeadSpec, cast_like, to_numpy
from .robust import flat_values, group_keys, row_updates

FLAME_IMAGE_LAMBDA = 0.001  # FLAME's lambda for image classification


def noise_seed(round_number: int, sites: Sequence[str]) -> list[int]:
    """The generator's seed for a round's aggregate of ``sites``: the same sites in the same round, the same noise."""
    return [round_number, zlib.crc32("\n".join(sorted(sites)).encode())]


def _median_norm(rows: Sequence[np.ndarray]) -> float:
    norms = [float(np.linalg.norm(row)) for row in rows]
    moved = [norm for norm in norms if norm > 0]
    return float(np.median(moved)) if moved else 0.0


@server_check(
    "aggregation",
    "with `update_noise` lambda above 0, after the aggregation the backbone's learned weights and each head row get "
    "Gaussian noise of standard deviation lambda x S per value, S the round's median norm of that part's (clipped) "
    "updates over the sites that moved it: the adaptive noise of FLAME (Nguyen et al., 2022; lambda 0.001 for image "
    "classification) on top of the clipping's norm bound, Sun et al.'s (2019) defence against backdoors; the "
    "BatchNorm statistics take none. Off (0) by default",
    "(recorded in the round's `noise`: the standard deviation each part took)",
)
def noised_state(
    state: Mapping[str, Any],
    global_state: Mapping[str, Any],
    global_classes: Sequence[str],
    sent: Sequence[tuple[Mapping[str, Any], Sequence[str]]],
    averaged_keys: Sequence[str],
    scale: float,
    seed: Sequence[int],
    head: HeadSpec = NAMED_HEAD,
    normalize: Callable[[str], str] | None = None,
) -> tuple[dict[str, Any], dict[str, float]]:
    """``state`` (the round's aggregate) with noise of standard deviation ``scale x S`` added to each part, and part
    -> that standard deviation. ``sent``: each contributor's (clipped) state and its head rows' names; an update is
    what a site sent minus ``global_state``. A part no site moved takes no noise."""
    normalize = normalize or (lambda name: name)
    noised, deviations = dict(state), {}
    if scale <= 0:
        return noised, deviations
    generator = np.random.default_rng(list(seed))
    keys = group_keys(averaged_keys, global_state, WEIGHTS, head)
    if keys:
        base = flat_values(global_state, keys)
        deviation = scale * _median_norm([flat_values(site_state, keys) - base for site_state, _ in sent])
        if deviation > 0:
            deviations[WEIGHTS] = deviation
            for key in keys:
                value = to_numpy(state[key]).astype(np.float64)
                noised[key] = cast_like(state[key], value + generator.normal(0.0, deviation, value.shape))
    new_weight, new_bias = (to_numpy(state[key]).astype(np.float64).copy() for key in head.keys)
    positions = {normalize(name): index for index, name in enumerate(global_classes)}
    updates = row_updates(sent, global_state, global_classes, head, normalize)
    for canonical in sorted(updates, key=positions.__getitem__):  # the global model's row order: the same draws
        deviation = scale * _median_norm(updates[canonical])
        if deviation <= 0:
            continue
        index = positions[canonical]
        deviations[row_part(canonical)] = deviation
        new_weight[index] += generator.normal(0.0, deviation, new_weight.shape[1])
        new_bias[index] += generator.normal(0.0, deviation)
    noised[head.weight_key] = cast_like(state[head.weight_key], new_weight)
    noised[head.bias_key] = cast_like(state[head.bias_key], new_bias)
    return noised, deviations
