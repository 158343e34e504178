"""Surgical aggregation as pure classes on state dicts (no FLARE).

A model is a backbone plus a classification head whose rows belong to named classes. Each
client holds its own class list, in its own order. Per round the server:

* averages the backbone over the clients, the entries its backbone strategy shares
  (:mod:`surgical_aggregation.core.strategies`: ``fedavg`` every entry, BatchNorm running statistics
  included; ``fedbn_plus`` and ``fedbn`` leave BatchNorm out, which keeps its global values);
* averages each head row (weight row + bias) over the clients that hold that class, matched by
  name; a class held by one client takes that client's row; a class nobody sent keeps its
  previous row; a class never seen before is appended to the union head.

With identical class sets this is exactly the backbone strategy (FedAvg for ``fedavg``).
Contributions are added one at a time into running float64 sums: the aggregator itself holds one
sum per entry, whatever the number of clients. Each contribution passes the server's result checks
(:mod:`surgical_aggregation.core.checks`) before it is added; one that fails is rejected with a
reason naming the client and leaves the sums untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .checks.result import CheckedResult, ModelLayout, ResultRejected, check_result
from .head import NAMED_HEAD, HeadSpec, StateDict, cast_like, same_name, to_numpy
from .strategies import strategy

Weighting = Literal["uniform", "samples"]
WEIGHTINGS: tuple[str, ...] = ("uniform", "samples")
ContributionRejected = ResultRejected  # a client's update that cannot be aggregated; ``reason`` says why


@dataclass
class Contribution:
    """One client's update: its full local state (backbone + its own head rows) and class names."""

    client: str
    state: StateDict
    class_names: Sequence[str]
    num_samples: int = 0
    # the classes the client may send rows for (what it declared at the handshake); None: any, new ones appended
    expected_classes: Sequence[str] | None = None
    declared_samples: int | None = None  # its training-set size as declared at the handshake (None: not known)


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
    """Accumulates the averaged backbone entries of state dicts shaped like a template."""

    def __init__(self, template: StateDict, averaged_keys: Sequence[str]):
        self._template = template
        self.keys = list(averaged_keys)
        self._mean = WeightedMean()
        self.total_weight = 0.0

    def add(self, state: StateDict, weight: float) -> None:
        for key in self.keys:
            self._mean.add(key, to_numpy(state[key]), weight)
        self.total_weight += weight

    def result(self) -> dict[str, Any]:
        state = dict(self._template)
        if self.total_weight > 0:
            for key in self.keys:
                state[key] = cast_like(self._template[key], self._mean.mean(key))
        return state


class SurgicalAggregator:
    """One round of surgical aggregation: ``add`` each contribution as it arrives, then ``finalize``.

    ``global_state``/``global_classes`` are the current global model, its head rows in
    ``global_classes`` order (a head with zero rows is allowed: the union then starts empty).
    ``normalize_name`` maps a client's class name to its canonical spelling (e.g. the job's
    :meth:`~surgical_aggregation.core.labels.Vocabulary.canonical`); a name it rejects rejects the
    contribution.
    """

    def __init__(
        self,
        global_state: StateDict,
        global_classes: Sequence[str],
        backbone_strategy: str = "fedavg",
        weighting: Weighting = "uniform",
        head: HeadSpec = NAMED_HEAD,
        normalize_name: Callable[[str], str] | None = None,
    ) -> None:
        _check_choice(weighting, WEIGHTINGS, "weighting")
        for key in head.keys:
            if key not in global_state:
                raise KeyError(f"global model has no head key {key!r}")
        self._head = head
        self._normalize = normalize_name or same_name
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

        self._backbone = _BackboneMean(global_state, strategy(backbone_strategy).shared_keys(global_state, head.keys))
        self._rows = WeightedMean()
        self._contributors: dict[str, list[str]] = {}
        self._first_holder: dict[str, tuple[str, int]] = {}  # new class -> (client, position)
        self._layout = ModelLayout.of(global_state, head)
        self._weighting = weighting
        self.accepted: list[str] = []
        self.rejected: dict[str, str] = {}

    @property
    def class_names(self) -> list[str]:
        return list(self._classes)

    @property
    def averaged_keys(self) -> list[str]:
        """The backbone entries this round averages (the strategy's choice), head excluded."""
        return list(self._backbone.keys)

    def add(self, contribution: Contribution) -> None:
        """Check and accumulate one contribution; raises :class:`ContributionRejected`.

        Every check is complete before anything is accumulated, so a rejected contribution
        leaves no trace in the sums.
        """
        checked = self.check(contribution)
        self._accumulate(contribution, checked)
        self.accepted.append(contribution.client)

    def add_checked(self, contribution: Contribution, checked: CheckedResult) -> None:
        """Accumulate a contribution that :meth:`check` accepted (the server checks each result once, on arrival)."""
        self._accumulate(contribution, checked)
        self.accepted.append(contribution.client)

    def check(self, contribution: Contribution, others: Sequence[str] = ()) -> CheckedResult:
        """Every result check of the server (:func:`surgical_aggregation.core.checks.result.check_result`), without
        accumulating; raises :class:`ContributionRejected` (and records the rejection). ``others``: clients whose
        results this round already holds elsewhere (a second result of theirs is refused)."""
        try:
            return check_result(
                contribution.client,
                contribution.state,
                contribution.class_names,
                self._layout,
                self.averaged_keys,
                self._normalize,
                contribution.expected_classes,
                contribution.num_samples,
                contribution.declared_samples,
                weighted=self._weighting == "samples",
                accepted=[*self.accepted, *others],
            )
        except ContributionRejected as rejection:
            self.rejected[contribution.client] = rejection.reason
            raise

    def _accumulate(self, contribution: Contribution, checked: CheckedResult) -> None:
        state = contribution.state
        weight_rows = to_numpy(state[self._head.weight_key])
        biases = to_numpy(state[self._head.bias_key])
        self._backbone.add(state, checked.weight)
        for position, name in enumerate(checked.class_names):
            row = np.concatenate([weight_rows[position], biases[position : position + 1]])
            self._rows.add(name, row, checked.weight)
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
