"""Surgical aggregation as pure classes on state dicts (no FLARE).

A model is a backbone plus a classification head whose rows belong to named classes. Each
client holds its own class list, in its own order. Per round the server:

* averages the backbone over the clients (``fedavg``: every entry, BatchNorm running
  statistics included; ``fedbn_plus``: BatchNorm parameters and buffers are left out and keep
  their global values, the sites keeping them frozen; ``fedbn``: left out too, each site keeping
  and training its own, as in personalised FL);
* averages each head row (weight row + bias) over the clients that hold that class, matched by
  name; a class held by one client takes that client's row; a class nobody sent keeps its
  previous row; a class never seen before is appended to the union head.

With identical class sets this is exactly the backbone strategy (FedAvg for ``fedavg``).
Contributions are added one at a time into running float64 sums, so server memory does not
grow with the number of clients. A contribution that fails validation is rejected with a
reason naming the client and leaves the sums untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .head import NAMED_HEAD, HeadSpec, StateDict, batchnorm_keys, cast_like, to_numpy

BackboneStrategy = Literal["fedavg", "fedbn", "fedbn_plus"]
Weighting = Literal["uniform", "samples"]
BACKBONE_STRATEGIES: tuple[str, ...] = ("fedavg", "fedbn", "fedbn_plus")
WEIGHTINGS: tuple[str, ...] = ("uniform", "samples")


class ContributionRejected(ValueError):
    """A client's update that cannot be aggregated; ``reason`` says why."""

    def __init__(self, client: str, reason: str):
        super().__init__(f"contribution from {client!r} rejected: {reason}")
        self.client = client
        self.reason = reason


@dataclass
class Contribution:
    """One client's update: its full local state (backbone + its own head rows) and class names."""

    client: str
    state: StateDict
    class_names: Sequence[str]
    num_samples: int = 0
    # the classes the client may send rows for (what it declared at the handshake); None: any, new ones appended
    expected_classes: Sequence[str] | None = None


@dataclass
class AggregationResult:
    state: dict[str, Any]
    class_names: list[str]
    accepted: list[str]
    rejected: dict[str, str]
    contributors: dict[str, list[str]]  # class name -> clients that sent its row this round
    new_classes: list[str]

    @property
    def updated(self) -> bool:
        return bool(self.accepted)


def _finite_problem(name: str, array: np.ndarray) -> str | None:
    if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
        bad = int(array.size - np.isfinite(array).sum())
        return f"{name!r} has {bad} non-finite value(s) (NaN/Inf)"
    return None


class WeightedMean:
    """Running weighted means of named arrays, one float64 sum per name."""

    def __init__(self) -> None:
        self._sums: dict[str, np.ndarray] = {}
        self._weights: dict[str, float] = {}

    def add(self, name: str, value: np.ndarray, weight: float) -> None:
        contribution = value.astype(np.float64) * weight
        if name in self._sums:
            self._sums[name] += contribution
            self._weights[name] += weight
        else:
            self._sums[name] = contribution
            self._weights[name] = weight

    def __contains__(self, name: str) -> bool:
        return name in self._sums

    def mean(self, name: str) -> np.ndarray:
        return self._sums[name] / self._weights[name]


def _check_choice(value: str, choices: Sequence[str], what: str) -> None:
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")


class _BackboneMean:
    """Validates and accumulates the backbone entries of a state dict against a template."""

    def __init__(self, template: StateDict, averaged_keys: Sequence[str]):
        self._template = template
        self._averaged = list(averaged_keys)
        self._mean = WeightedMean()
        self.total_weight = 0.0

    def problems(self, state: StateDict) -> list[str]:
        found: list[str] = []
        missing = [key for key in self._averaged if key not in state]
        if missing:
            found.append(f"missing {len(missing)} key(s), e.g. {missing[:3]}")
        for key in self._averaged:
            if key not in state:
                continue
            array = to_numpy(state[key])
            expected = tuple(to_numpy(self._template[key]).shape)
            if tuple(array.shape) != expected:
                found.append(f"{key!r} has shape {tuple(array.shape)}, expected {expected}")
            elif (problem := _finite_problem(key, array)) is not None:
                found.append(problem)
        return found

    def add(self, state: StateDict, weight: float) -> None:
        for key in self._averaged:
            self._mean.add(key, to_numpy(state[key]), weight)
        self.total_weight += weight

    def result(self) -> dict[str, Any]:
        state = dict(self._template)
        if self.total_weight > 0:
            for key in self._averaged:
                state[key] = cast_like(self._template[key], self._mean.mean(key))
        return state


class SurgicalAggregator:
    """One round of surgical aggregation: ``add`` each contribution as it arrives, then ``finalize``.

    ``global_state``/``global_classes`` are the current global model, its head rows in
    ``global_classes`` order (a head with zero rows is allowed: the union then starts empty).
    ``normalize_name`` maps a client's class name to its canonical spelling (e.g.
    :func:`surgical_aggregation.labels.canonical_name`); a name it rejects rejects the
    contribution.
    """

    def __init__(
        self,
        global_state: StateDict,
        global_classes: Sequence[str],
        backbone_strategy: BackboneStrategy = "fedavg",
        weighting: Weighting = "uniform",
        head: HeadSpec = NAMED_HEAD,
        normalize_name: Callable[[str], str] | None = None,
    ) -> None:
        _check_choice(weighting, WEIGHTINGS, "weighting")
        _check_choice(backbone_strategy, BACKBONE_STRATEGIES, "backbone strategy")
        for key in head.keys:
            if key not in global_state:
                raise KeyError(f"global model has no head key {key!r}")
        self._head = head
        self._normalize = normalize_name or _same_name
        self._global = global_state
        self._classes = [self._normalize(name) for name in global_classes]
        if len(set(self._classes)) != len(self._classes):
            raise ValueError(f"global class names are not unique: {self._classes}")
        head_weight = to_numpy(global_state[head.weight_key])
        head_bias = to_numpy(global_state[head.bias_key])
        if head_weight.ndim != 2 or head_weight.shape[0] != len(self._classes):
            raise ValueError(
                f"global head {head.weight_key!r} has shape {head_weight.shape}, "
                f"expected ({len(self._classes)}, features) for classes {self._classes}"
            )
        if head_bias.shape != (len(self._classes),):
            raise ValueError(
                f"global head {head.bias_key!r} has shape {head_bias.shape}, expected ({len(self._classes)},)"
            )
        self._feature_dim = head_weight.shape[1]

        excluded = batchnorm_keys(global_state) if backbone_strategy in ("fedbn", "fedbn_plus") else set()
        averaged = [key for key in global_state if key not in head.keys and key not in excluded]
        self._backbone = _BackboneMean(global_state, averaged)
        self._rows = WeightedMean()
        self._contributors: dict[str, list[str]] = {}
        self._first_holder: dict[str, tuple[str, int]] = {}  # new class -> (client, position)
        self._allowed_keys = set(global_state)
        self._weighting = weighting
        self.accepted: list[str] = []
        self.rejected: dict[str, str] = {}

    @property
    def class_names(self) -> list[str]:
        return list(self._classes)

    def add(self, contribution: Contribution) -> None:
        """Validate and accumulate one contribution; raises :class:`ContributionRejected`.

        Validation is complete before anything is accumulated, so a rejected contribution
        leaves no trace in the sums.
        """
        weight, checked = self.check(contribution)
        self._accumulate(contribution, weight, checked)
        self.accepted.append(contribution.client)

    def check(self, contribution: Contribution) -> tuple[float, Any]:
        """Every check of :meth:`add`, without accumulating; raises :class:`ContributionRejected` (and records
        the rejection). Returns what :meth:`add` needs."""
        try:
            return self._weight(contribution), self._validate(contribution)
        except ContributionRejected as rejection:
            self.rejected[contribution.client] = rejection.reason
            raise

    def _weight(self, contribution: Contribution) -> float:
        """The contribution's weight, after the checks that do not depend on the model's layout."""
        client = contribution.client
        if client in self.accepted:
            raise ContributionRejected(client, "this client already contributed in this round")
        if not isinstance(contribution.state, Mapping):
            raise ContributionRejected(
                client, f"its weights are a {type(contribution.state).__name__}, not named arrays"
            )
        names = contribution.class_names
        if isinstance(names, str) or not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
            raise ContributionRejected(client, f"its class names are not a list of names: {names!r}"[:200])
        unknown = sorted(set(contribution.state) - self._allowed_keys)
        if unknown:
            raise ContributionRejected(client, f"{len(unknown)} unknown key(s), e.g. {unknown[:3]}")
        if self._weighting == "uniform":
            return 1.0
        samples = contribution.num_samples
        if isinstance(samples, bool) or not isinstance(samples, (int, float, np.number)) or not samples > 0:
            raise ContributionRejected(client, f"weighting by samples needs a positive sample count, got {samples!r}")
        return float(samples)

    def _validate(self, contribution: Contribution) -> tuple[list[str], np.ndarray, np.ndarray]:
        client = contribution.client
        raw_names = list(contribution.class_names)
        if not raw_names:
            raise ContributionRejected(client, "no class names")
        try:
            class_names = [self._normalize(name) for name in raw_names]
        except ValueError as error:
            raise ContributionRejected(client, str(error)) from None
        duplicates = sorted({name for name in class_names if class_names.count(name) > 1})
        if duplicates:
            raise ContributionRejected(client, f"duplicate class names {duplicates} in {raw_names}")
        if contribution.expected_classes is not None:
            expected = {self._normalize(name) for name in contribution.expected_classes}
            undeclared = sorted(set(class_names) - expected)
            if undeclared:
                raise ContributionRejected(client, f"rows for classes it did not declare: {undeclared}")
            left_out = sorted(expected - set(class_names))
            if left_out:
                raise ContributionRejected(client, f"no rows for its classes {left_out}")

        state = contribution.state
        problems = self._backbone.problems(state)
        problems += [f"missing head key {key!r}" for key in self._head.keys if key not in state]
        if problems:
            raise ContributionRejected(client, "; ".join(problems))
        weight_rows = to_numpy(state[self._head.weight_key])
        biases = to_numpy(state[self._head.bias_key])
        expected_rows = (len(class_names), self._feature_dim)
        if weight_rows.shape != expected_rows:
            raise ContributionRejected(
                client,
                f"head {self._head.weight_key!r} has shape {weight_rows.shape}, expected {expected_rows} "
                f"for its {len(class_names)} classes",
            )
        if biases.shape != (len(class_names),):
            raise ContributionRejected(
                client, f"head {self._head.bias_key!r} has shape {biases.shape}, expected ({len(class_names)},)"
            )
        for key, array in ((self._head.weight_key, weight_rows), (self._head.bias_key, biases)):
            if (problem := _finite_problem(key, array)) is not None:
                raise ContributionRejected(client, problem)
        return class_names, weight_rows, biases

    def _accumulate(
        self, contribution: Contribution, weight: float, checked: tuple[list[str], np.ndarray, np.ndarray]
    ) -> None:
        class_names, weight_rows, biases = checked
        self._backbone.add(contribution.state, weight)
        for position, name in enumerate(class_names):
            row = np.concatenate([weight_rows[position], biases[position : position + 1]])
            self._rows.add(name, row, weight)
            self._contributors.setdefault(name, []).append(contribution.client)
            if name not in self._classes:
                holder = (contribution.client, position)
                self._first_holder[name] = min(self._first_holder.get(name, holder), holder)

    def finalize(self) -> AggregationResult:
        """The new global model; without any accepted contribution it equals the old one.

        New classes are appended after the existing ones, ordered by (client name, position in
        that client's list), so the union's order does not depend on arrival order.
        """
        new_classes = sorted(self._first_holder, key=lambda name: self._first_holder[name])
        union = self._classes + new_classes
        state = self._backbone.result()

        template_weight = self._global[self._head.weight_key]
        template_bias = self._global[self._head.bias_key]
        old_weight = to_numpy(template_weight)
        old_bias = to_numpy(template_bias)
        weight = np.zeros((len(union), self._feature_dim), dtype=np.float64)
        bias = np.zeros(len(union), dtype=np.float64)
        for index, name in enumerate(union):
            if name in self._rows:
                row = self._rows.mean(name)
                weight[index], bias[index] = row[:-1], row[-1]
            else:  # nobody sent this class this round: keep its previous row
                weight[index], bias[index] = old_weight[index], old_bias[index]
        state[self._head.weight_key] = cast_like(template_weight, weight)
        state[self._head.bias_key] = cast_like(template_bias, bias)
        return AggregationResult(
            state=state,
            class_names=union,
            accepted=list(self.accepted),
            rejected=dict(self.rejected),
            contributors={name: list(clients) for name, clients in self._contributors.items()},
            new_classes=new_classes,
        )


def _same_name(name: str) -> str:
    return name
