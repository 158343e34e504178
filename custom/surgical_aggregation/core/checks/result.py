"""The checks of a training result: its structure and values, before anything of it is aggregated."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..head import NAMED_HEAD, HeadSpec, StateDict, to_numpy
from . import NameNormalizer, Reasons, at_most, cut_short, server_check, shown_repr, value_checks


@dataclass(frozen=True)
class ModelLayout:
    """What a result must look like, read from the global model: each entry's shape (the head's by row count)
    and exact dtype, and which entries hold BatchNorm statistics."""

    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, np.dtype]
    head: HeadSpec
    feature_dim: int

    @classmethod
    def of(cls, state: StateDict, head: HeadSpec = NAMED_HEAD) -> ModelLayout:
        arrays = {key: to_numpy(value) for key, value in state.items()}
        return cls(
            shapes={key: tuple(array.shape) for key, array in arrays.items()},
            dtypes={key: array.dtype for key, array in arrays.items()},
            head=head,
            feature_dim=int(arrays[head.weight_key].shape[1]),
        )

    def expected_shape(self, key: str, rows: int) -> tuple[int, ...]:
        if key == self.head.weight_key:
            return (rows, self.feature_dim)
        if key == self.head.bias_key:
            return (rows,)
        return self.shapes[key]


@server_check(
    "result",
    "weights as named arrays and class names as a list of names",
    "its weights are a list, not named arrays",
)
def container_problems(state: Any, class_names: Any) -> Reasons:
    if not isinstance(state, Mapping):
        return [f"its weights are a {type(state).__name__}, not named arrays"]
    if isinstance(class_names, str) or not isinstance(class_names, Sequence):
        return [f"its class names are not a list of names: {shown_repr(class_names)}"]
    if not all(isinstance(name, str) for name in class_names):
        return [f"its class names are not a list of names: {shown_repr(class_names)}"]
    return []


@server_check("result", "only the model's keys", "3 unknown key(s), e.g. ['extra.weight']")
def unknown_key_problems(state: Mapping[str, Any], layout: ModelLayout) -> Reasons:
    unknown = sorted(str(key) for key in state if key not in layout.shapes)
    return [f"{len(unknown)} unknown key(s), e.g. {[cut_short(key) for key in unknown[:3]]}"] if unknown else []


@server_check(
    "result",
    "one result per site and round",
    "this client already contributed in this round",
)
def repeated_result_problem(site: str, accepted: Sequence[str]) -> str | None:
    return "this client already contributed in this round" if site in accepted else None


@server_check(
    "result",
    "a sample count that is a whole number no larger than the training-set size the site declared at the "
    "handshake (positive with `weighting: samples`)",
    "it reports 1000000000000 training samples, more than the 10 it declared at the handshake",
)
def sample_count_problem(samples: Any, declared: int | None, weighted: bool) -> str | None:
    if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 0:
        return f"its sample count {shown_repr(samples)} is not a whole number"
    if declared is not None and samples > declared:
        return f"it reports {int(samples)} training samples, more than the {declared} it declared at the handshake"
    if weighted and samples == 0:
        return "weighting by samples needs a positive sample count, got 0"
    return None


@server_check(
    "result",
    "class names present, each a name of the vocabulary (closed vocabularies: accepted), none twice, and exactly "
    "the classes the site declared at the handshake (any spelling that means them)",
    "rows for classes it did not declare: ['Fracture']",
)
def class_name_problems(
    class_names: Sequence[str], normalize: NameNormalizer, expected: Sequence[str] | None
) -> tuple[list[str], Reasons]:
    """(the canonical names, problems)."""
    if not class_names:
        return [], ["no class names"]
    try:
        canonical = [normalize(name) for name in class_names]
    except ValueError as error:
        return [], [str(error)]
    duplicates = sorted({name for name in canonical if canonical.count(name) > 1})
    if duplicates:
        return canonical, [f"duplicate class names {duplicates} in {shown_repr(list(class_names), 200)}"]
    if expected is None:
        return canonical, []
    declared = {normalize(name) for name in expected}
    undeclared = sorted(set(canonical) - declared)
    if undeclared:
        return canonical, [f"rows for classes it did not declare: {shown_repr(undeclared, 200)}"]
    left_out = sorted(declared - set(canonical))
    return canonical, [f"no rows for its classes {left_out}"] if left_out else []


@server_check(
    "result",
    "every key of the model, each of its shape (head: one row per class)",
    "'features.conv0.weight' has shape (1, 1), expected (64, 1, 7, 7)",
)
def shape_problems(state: Mapping[str, Any], layout: ModelLayout, rows: int, keys: Sequence[str]) -> Reasons:
    """``keys``: the entries the result must carry (what the aggregation reads)."""
    missing = [key for key in keys if key not in state and key not in layout.head.keys]
    problems = [f"missing {len(missing)} key(s), e.g. {missing[:3]}"] if missing else []
    problems += [f"missing head key {key!r}" for key in layout.head.keys if key not in state]
    for key in keys:
        if key in state:
            shape = tuple(np.shape(to_numpy(state[key])))
            expected = layout.expected_shape(key, rows)
            if shape != expected:
                problems.append(f"{key!r} has shape {shape}, expected {expected}")
    return problems


@server_check(
    "result",
    "each entry of exactly the global model's dtype (float32 where it is float32: no float64, complex, strings or "
    "objects; int64 counters)",
    "'features.conv0.weight' is complex64, the global model's is float32",
    on_values=True,
)
def dtype_problems(state: Mapping[str, Any], layout: ModelLayout) -> Reasons:
    problems = []
    for key, value in state.items():
        dtype = to_numpy(value).dtype
        if dtype != layout.dtypes[key]:
            problems.append(f"{key!r} is {dtype}, the global model's is {layout.dtypes[key]}")
    return at_most(problems, 3)


@server_check(
    "result",
    "finite values (no NaN or Inf)",
    "'features.conv0.weight' has 12 non-finite value(s) (NaN/Inf)",
    on_values=True,
)
def finite_problems(state: Mapping[str, Any], layout: ModelLayout | None = None) -> Reasons:
    problems = []
    for key, value in state.items():
        array = to_numpy(value)
        if np.issubdtype(array.dtype, np.inexact):
            bad = int(array.size - np.count_nonzero(np.isfinite(array)))
            if bad:
                problems.append(f"{key!r} has {bad} non-finite value(s) (NaN/Inf)")
    return problems


@server_check(
    "result",
    "valid BatchNorm statistics: every running variance above 0, every batch counter a whole number 0 or more",
    "'features.denseblock1.denselayer1.norm1.running_var' has 4 value(s) at or below 0 (a variance is positive)",
    on_values=True,
)
def batchnorm_problems(state: Mapping[str, Any], layout: ModelLayout | None = None) -> Reasons:
    problems = []
    for key in sorted(state):
        if key.endswith(".running_var"):
            bad = int(np.count_nonzero(~(to_numpy(state[key]) > 0)))
            if bad:
                problems.append(f"{key!r} has {bad} value(s) at or below 0 (a variance is positive)")
        elif key.endswith(".num_batches_tracked") and np.any(to_numpy(state[key]) < 0):
            problems.append(f"{key!r} is negative (a count of batches)")
    return at_most(problems, 3)


@dataclass(frozen=True)
class CheckedResult:
    """A training result that passed every result check: its canonical class names and weight."""

    class_names: list[str]
    weight: float


class ResultRejected(ValueError):
    """A training result the server does not aggregate; ``reason`` says why (and is what the site is told)."""

    def __init__(self, client: str, reason: str):
        super().__init__(f"contribution from {client!r} rejected: {reason}")
        self.client = client
        self.reason = reason


def check_result(
    client: str,
    state: Any,
    class_names: Any,
    layout: ModelLayout,
    averaged_keys: Sequence[str],
    normalize: NameNormalizer,
    expected_classes: Sequence[str] | None = None,
    num_samples: Any = 0,
    declared_samples: int | None = None,
    weighted: bool = False,
    accepted: Sequence[str] = (),
) -> CheckedResult:
    """Every result check in order; the first that fails rejects the result (later checks rely on the earlier
    ones: a dtype is read only once the keys are known). Raises :class:`ResultRejected`."""

    def refuse(problems: Reasons | str | None) -> None:
        if problems:
            raise ResultRejected(client, problems if isinstance(problems, str) else "; ".join(problems))

    refuse(container_problems(state, class_names))
    refuse(repeated_result_problem(client, accepted))
    refuse(unknown_key_problems(state, layout))
    refuse(sample_count_problem(num_samples, declared_samples, weighted))
    canonical, problems = class_name_problems(list(class_names), normalize, expected_classes)
    refuse(problems)
    refuse(shape_problems(state, layout, len(canonical), [*averaged_keys, *layout.head.keys]))
    for value_check in value_checks():  # dtypes, finite values, BatchNorm statistics, and any registered after them
        refuse(value_check(state, layout))
    return CheckedResult(canonical, float(num_samples) if weighted else 1.0)
