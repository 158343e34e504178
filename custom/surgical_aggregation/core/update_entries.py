"""A site's update as named entries: what a privacy filter of the site's results sees and changes.

The update is ``sent - received`` for every floating-point entry of the state a site sends: each backbone key by
its name, and each head row by its class's name (``class_layers.out/<class>``: the row's weights then its bias, one
vector, so a filter never sees a bias as a lone scalar, which FLARE's filters pass through unfiltered). Integer
entries (BatchNorm's ``num_batches_tracked``) are counters, not learned from images: they are sent as they are.

:func:`update_entries` takes the update apart; :func:`apply_entries` puts a (filtered) update back onto the received
model. An entry a filter leaves out arrives as the site received it: an update of zero. The differences are taken
in float64, so an entry the filter leaves unchanged arrives exactly as trained.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .head import NAMED_HEAD, HeadSpec, StateDict, to_numpy

HEAD_ROW_SEPARATOR = "/"


def head_row_entry(class_name: str, head: HeadSpec = NAMED_HEAD) -> str:
    """The entry name of a class's head row: ``class_layers.out/Pneumonia``."""
    return f"{head.weight_key.rsplit('.', 1)[0]}{HEAD_ROW_SEPARATOR}{class_name}"


def _is_update(value: np.ndarray) -> bool:
    return np.issubdtype(value.dtype, np.floating)


def _received_rows(
    received: StateDict, received_classes: Sequence[str], head: HeadSpec, sent_classes: Sequence[str]
) -> dict[str, np.ndarray]:
    """Each received class's head row (weights then bias) by name, in float64; every sent row must have one (under
    the same name: the site's spelling, as the server sends it)."""
    weight, bias = (to_numpy(received[key]).astype(np.float64) for key in head.keys)
    if len(weight) != len(received_classes) or len(bias) != len(received_classes):
        raise ValueError(
            f"the received head has {len(weight)} rows for {len(received_classes)} class names; rows cannot be named"
        )
    rows = {name: np.append(weight[row], bias[row]) for row, name in enumerate(received_classes)}
    unknown = [name for name in sent_classes if name not in rows]
    if unknown:
        raise ValueError(
            f"the result's head rows {unknown} were not in the model this site received (its rows: "
            f"{list(received_classes)}); their update cannot be taken"
        )
    return rows


def _check_received(sent: StateDict, received: StateDict, head: HeadSpec) -> None:
    for key, value in sent.items():
        if key in head.keys or not _is_update(to_numpy(value)):
            continue
        if key not in received:
            raise ValueError(f"the received model has no {key!r}: the update of that entry cannot be taken")
        if np.shape(received[key]) != np.shape(value):
            raise ValueError(
                f"{key!r} has shape {np.shape(value)} in the result but {np.shape(received[key])} in the received model"
            )


def update_entries(
    sent: StateDict,
    sent_classes: Sequence[str],
    received: StateDict,
    received_classes: Sequence[str],
    head: HeadSpec = NAMED_HEAD,
) -> dict[str, np.ndarray]:
    """``sent - received`` by entry name (float64): each floating-point backbone key, and each head row by class
    name. Every row sent must have been received under the same name."""
    _check_received(sent, received, head)
    changes = {
        key: to_numpy(value).astype(np.float64) - to_numpy(received[key]).astype(np.float64)
        for key, value in sent.items()
        if key not in head.keys and _is_update(to_numpy(value))
    }
    old_rows = _received_rows(received, received_classes, head, sent_classes)
    weight, bias = (to_numpy(sent[key]).astype(np.float64) for key in head.keys)
    for row, name in enumerate(sent_classes):
        changes[head_row_entry(name, head)] = np.append(weight[row], bias[row]) - old_rows[name]
    return changes


def apply_entries(
    sent: StateDict,
    sent_classes: Sequence[str],
    received: StateDict,
    received_classes: Sequence[str],
    changes: Mapping[str, np.ndarray],
    head: HeadSpec = NAMED_HEAD,
) -> dict[str, np.ndarray]:
    """The state to send: ``received + changes[entry]`` for every entry of :func:`update_entries`, in the sent dtypes
    and head row order; an entry missing from ``changes`` is sent as received; integer entries as sent."""
    _check_received(sent, received, head)
    result: dict[str, np.ndarray] = {}
    for key, value in sent.items():
        value = to_numpy(value)
        if key in head.keys:
            continue
        if not _is_update(value):
            result[key] = value
            continue
        change = changes.get(key)
        old = to_numpy(received[key]).astype(np.float64)
        result[key] = (old if change is None else old + np.reshape(change, old.shape)).astype(value.dtype)
    old_rows = _received_rows(received, received_classes, head, sent_classes)
    weight, bias = (to_numpy(sent[key]) for key in head.keys)
    new_weight, new_bias = np.empty_like(weight), np.empty_like(bias)
    for row, name in enumerate(sent_classes):
        change = changes.get(head_row_entry(name, head))
        values = old_rows[name] if change is None else old_rows[name] + np.reshape(change, old_rows[name].shape)
        new_weight[row], new_bias[row] = values[:-1], values[-1]
    result[head.weight_key], result[head.bias_key] = new_weight, new_bias
    return result
