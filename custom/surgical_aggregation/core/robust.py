"""Robust aggregation of the sites' updates, part by part: the rules the field benchmarks, from their papers.

A *rule* turns the updates of one part of the model (the backbone weights, the BatchNorm statistics, one head row),
one row per site, into the update the global model takes. ``mean`` is plain averaging; the others bound what
``f`` hostile rows can do when the others are honest. They are written here from their papers' definitions, as
ByzFL (EPFL's maintained library, ``byzfl.aggregators``) implements them: ByzFL itself cannot be imported beside the
CPU build of torch this bundle pins (its package imports torchvision), and Flower's strategies need a protobuf
older than FLARE's. Each rule is tested on a worked example (``tests/test_robust.py``).

Aggregators (rows ``x_1..x_n``, ``f`` the number of hostile rows tolerated, ``2f < n``):

* ``median``: coordinate-wise median (Yin, Chen, Kannan, Bartlett, ICML 2018).
* ``trimmed_mean``: per coordinate, the mean of the values left after the ``f`` largest and ``f`` smallest are
  removed (Yin et al., ICML 2018).
* ``meamed``: per coordinate, the mean of the ``n - f`` values closest to the coordinate's median (Xie, Koyejo,
  Gupta, *Generalized Byzantine-tolerant SGD*, 2018).
* ``geometric_median``: the point minimising the sum of Euclidean distances, by Weiszfeld's iterations (as in RFA:
  Pillutla, Kakade, Harchaoui, *Robust Aggregation for Federated Learning*, IEEE TSP 2022) with Vardi and Zhang's
  step off a row the iterate lands on (PNAS 2000), started at the coordinate-wise median and run until it moves less
  than 1e-6 of its norm (ByzFL runs 3 iterations from zero).
* ``multi_krum``: the mean of the ``n - f`` rows with the smallest Krum scores, a row's score being the sum of its
  squared distances to its ``n - f - 1`` nearest other rows (Blanchard, El Mhamdi, Guerraoui, Stainer, NeurIPS 2017,
  count ``n - f - 2``, which is 0 at three sites; ByzFL's ``n - f - 1``).
* ``centered_clipping``: ``v <- v + mean_i(clip_tau(x_i - v))``, each row's pull on the centre clipped to the norm
  ``tau`` (Karimireddy, He, Jaggi, *Learning from History for Byzantine Robust Optimization*, ICML 2021), iterated to
  its fixed point, which is Huber's M-estimate of location (a row nearer than ``tau`` weighs as in the mean, a farther
  one pulls by ``tau`` only). The paper clips around the last round's aggregated momentum with a fixed ``tau``; a
  round's updates here are whole local trainings whose size differs by part and round, so the centre starts at the
  coordinate-wise median and ``tau`` is the median distance of the rows to it (ByzFL: ``tau`` 100, one iteration, from
  a given or zero centre).
* ``mda``: the mean of the ``n - f`` rows of smallest diameter (El Mhamdi, Guerraoui, Guirguis, Hoang, Rouault, PODC
  2020), by exhaustive search (at most a few hundred subsets for the federations this bundle runs).

Pre-aggregation, written before the aggregator as ``nnm+<aggregator>``:

* ``nnm`` (nearest-neighbour mixing): each row replaced by the mean of its ``n - f`` nearest rows, itself included
  (Allouah, Farhadkhani, Guerraoui, Gupta, Pinot, Stephan, *Fixing by Mixing: A Recipe for Optimal Byzantine ML
  under Heterogeneity*, AISTATS 2023): what makes the aggregators above hold when honest sites' data differ.

Plain NumPy, no FLARE. The rows are float64 copies of the updates.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from .checks import server_check
from .checks.update import STATISTICS, WEIGHTS, UpdateSizes, consensus_cosines, row_part, update_group
from .head import NAMED_HEAD, HeadSpec, cast_like, to_numpy

Aggregator = Callable[[np.ndarray, int], np.ndarray]  # (rows, f) -> the aggregate


def _checked(rows: np.ndarray, f: int) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] < 1:
        raise ValueError(f"robust aggregation needs a 2-D array of rows, got shape {rows.shape}")
    if not isinstance(f, (int, np.integer)) or f < 0 or 2 * f >= rows.shape[0]:
        raise ValueError(f"f = {f!r} hostile rows of {rows.shape[0]}: a rule needs 0 <= 2f < n")
    return rows


def mean(rows: np.ndarray, f: int = 0) -> np.ndarray:
    """The plain mean (no robustness: the reference the others are measured against)."""
    return _checked(rows, f).mean(axis=0)


def median(rows: np.ndarray, f: int = 0) -> np.ndarray:
    """Coordinate-wise median (the mean of the two middle values for an even number of rows)."""
    return np.median(_checked(rows, f), axis=0)


def trimmed_mean(rows: np.ndarray, f: int) -> np.ndarray:
    """Per coordinate, the mean after the ``f`` largest and the ``f`` smallest values are removed."""
    rows = _checked(rows, f)
    ordered = np.sort(rows, axis=0)
    return ordered[f : rows.shape[0] - f].mean(axis=0)


def meamed(rows: np.ndarray, f: int) -> np.ndarray:
    """Mean around the median: per coordinate, the mean of the ``n - f`` values closest to the median."""
    rows = _checked(rows, f)
    centre = np.median(rows, axis=0)
    closest = np.argsort(np.abs(rows - centre), axis=0, kind="stable")[: rows.shape[0] - f]
    return np.take_along_axis(rows, closest, axis=0).mean(axis=0)


def _squared_distances(rows: np.ndarray) -> np.ndarray:
    """The rows' pairwise squared Euclidean distances, from their Gram matrix (exact zeros on the diagonal)."""
    gram = rows @ rows.T
    norms = np.diag(gram)
    distances = np.maximum(norms[:, None] + norms[None, :] - 2 * gram, 0.0)
    np.fill_diagonal(distances, 0.0)
    return distances


ITERATION_TOLERANCE = 1e-6  # an iterative rule stops when a step moves the estimate by less than this share of its norm
ITERATIONS = 100  # at most, for the geometric median and centered clipping
GEOMETRIC_MEDIAN_SMOOTHING = 1e-8  # RFA's nu, as a share of the rows' largest norm (a floor on each distance)


def geometric_median(rows: np.ndarray, f: int = 0) -> np.ndarray:
    """The geometric median by Weiszfeld's iterations, ``z <- sum(x_i / d_i) / sum(1 / d_i)`` over the rows away
    from ``z``, from the coordinate-wise median until ``z`` moves less than 1e-6 of its norm. Where ``z`` lies on
    rows (within ``nu``), Vardi and Zhang's step (PNAS 2000): ``z`` moves towards that average by ``1 - min(1, m /
    r)``, ``m`` the rows on ``z`` and ``r`` the norm of the summed unit vectors from ``z`` to the others, so that
    ``z`` leaves a row that is not the median (RFA's smoothing alone stays on it, and the coordinate-wise median of
    three rows can be one)."""
    rows = _checked(rows, f)
    nu = GEOMETRIC_MEDIAN_SMOOTHING * max(float(np.max(np.linalg.norm(rows, axis=1))), 1e-30)
    estimate = np.median(rows, axis=0)
    difference = np.empty_like(rows)  # reused: a model's rows are millions wide, and each iteration reads them twice
    for _ in range(ITERATIONS):
        np.subtract(rows, estimate, out=difference)
        distances = np.sqrt(np.einsum("ij,ij->i", difference, difference))
        away = distances > nu
        if not away.any():
            break
        weights = np.where(away, 1.0 / np.maximum(distances, nu), 0.0)
        moved = weights @ rows / weights.sum()
        on_rows = int(np.count_nonzero(~away))
        if on_rows:
            pull = float(np.linalg.norm(weights @ difference))  # the unit vectors from z to the other rows, summed
            if pull <= on_rows:  # they cannot outweigh the rows on z: z is the median
                break
            moved = (1 - on_rows / pull) * moved + (on_rows / pull) * estimate
        step = float(np.linalg.norm(moved - estimate))
        estimate = moved
        if step <= ITERATION_TOLERANCE * max(float(np.linalg.norm(estimate)), nu):
            break
    return estimate


def centered_clipping(rows: np.ndarray, f: int = 0) -> np.ndarray:
    """Centered clipping to its fixed point: from the coordinate-wise median ``v``, with ``tau`` the median of the rows'
    distances to it, ``v <- v + mean_i((x_i - v) * min(1, tau / |x_i - v|))`` until ``v`` moves less than 1e-6 of its
    norm. Where ``tau`` is 0 (half the rows or more on the median) that median is the answer."""
    rows = _checked(rows, f)
    estimate = np.median(rows, axis=0)
    difference = rows - estimate
    tau = float(np.median(np.sqrt(np.einsum("ij,ij->i", difference, difference))))
    if tau <= 0:
        return estimate
    for _ in range(ITERATIONS):
        np.subtract(rows, estimate, out=difference)
        distances = np.sqrt(np.einsum("ij,ij->i", difference, difference))
        factors = np.minimum(1.0, tau / np.maximum(distances, 1e-300))
        step = factors @ difference / rows.shape[0]
        estimate = estimate + step
        if float(np.linalg.norm(step)) <= ITERATION_TOLERANCE * max(float(np.linalg.norm(estimate)), tau):
            break
    return estimate


def multi_krum(rows: np.ndarray, f: int) -> np.ndarray:
    """The mean of the ``n - f`` rows with the smallest Krum scores (sum of squared distances to the ``n - f - 1``
    nearest other rows; ties go to the lower index)."""
    rows = _checked(rows, f)
    n = rows.shape[0]
    neighbours = n - f - 1
    distances = _squared_distances(rows)
    others = np.sort(distances + np.diag(np.full(n, np.inf)), axis=1)[:, :neighbours]
    scores = others.sum(axis=1)
    chosen = np.argsort(scores, kind="stable")[: n - f]
    return rows[chosen].mean(axis=0)


def mda(rows: np.ndarray, f: int) -> np.ndarray:
    """Minimum-diameter averaging: the mean of the subset of ``n - f`` rows whose largest pairwise distance is
    smallest (the first such subset in ``itertools.combinations`` order)."""
    rows = _checked(rows, f)
    n = rows.shape[0]
    distances = _squared_distances(rows)
    best, best_diameter = None, math.inf
    for subset in itertools.combinations(range(n), n - f):
        diameter = float(distances[np.ix_(subset, subset)].max())
        if diameter < best_diameter:
            best, best_diameter = subset, diameter
    return rows[list(best)].mean(axis=0)


def nearest_neighbour_mixing(rows: np.ndarray, f: int) -> np.ndarray:
    """NNM: each row replaced by the mean of its ``n - f`` nearest rows (Euclidean), itself included; ties go to
    the lower index."""
    rows = _checked(rows, f)
    n = rows.shape[0]
    distances = _squared_distances(rows)
    nearest = np.argsort(distances, axis=1, kind="stable")[:, : n - f]
    return np.stack([rows[indices].mean(axis=0) for indices in nearest])


# Two updates closer than this (relative to the larger's norm) are one update sent twice. A site that copies another's
# (the mimic attack: Karimireddy, He, Jaggi, ICLR 2022) makes it count twice, and a median of three rows two of which
# are equal is that row, so the third site's update is lost. The attack suite's copy arrived exact; honest sites'
# closest pairs lay hundreds of times further apart (each round records it, `closest_updates`: docs/server-checks.md).
DUPLICATE_DISTANCE = 1e-3


def _relative_distances(rows: np.ndarray) -> np.ndarray:
    """Pairwise distances over the larger norm of each pair (0 for two zero rows)."""
    distances = np.sqrt(np.maximum(_squared_distances(rows), 0.0))
    norms = np.linalg.norm(rows, axis=1)
    larger = np.maximum(norms[:, None], norms[None, :])
    return np.divide(distances, larger, out=np.zeros_like(distances), where=larger > 0)


def duplicate_groups(rows: np.ndarray) -> list[list[int]]:
    """The indices of rows sent more than once: groups of two or more, each row in the group of the first earlier row
    within :data:`DUPLICATE_DISTANCE` of it."""
    return _groups_within(_relative_distances(np.asarray(rows, dtype=np.float64)))


def _groups_within(relative: np.ndarray) -> list[list[int]]:
    first: list[int] = []  # each row's group leader
    for index in range(relative.shape[0]):
        leader = next((other for other in range(index) if first[other] == other and
                       relative[index, other] <= DUPLICATE_DISTANCE), index)  # fmt: skip
        first.append(leader)
    groups: dict[int, list[int]] = {}
    for index, leader in enumerate(first):
        groups.setdefault(leader, []).append(index)
    return [group for group in groups.values() if len(group) > 1]


def distinct_rows(rows: np.ndarray) -> np.ndarray:
    """``rows`` with each group of duplicates (:func:`duplicate_groups`) counted once, as its mean, where its first
    row was."""
    rows = np.asarray(rows, dtype=np.float64)
    return merged_rows(rows, duplicate_groups(rows))


def merged_rows(rows: np.ndarray, duplicates: list[list[int]]) -> np.ndarray:
    """``rows`` with each group of ``duplicates`` (:func:`duplicate_groups`, computed already) counted once, as its
    mean, where its first row was."""
    groups = {group[0]: group for group in duplicates}
    repeated = {index for group in groups.values() for index in group[1:]}
    if not groups:
        return rows
    return np.stack(
        [rows[groups[index]].mean(axis=0) if index in groups else rows[index]
         for index in range(rows.shape[0]) if index not in repeated]
    )  # fmt: skip


def closest_distance(rows: np.ndarray) -> float | None:
    """The smallest relative distance between two rows (None for fewer than two)."""
    return duplicates_and_closest(rows)[1]


def duplicates_and_closest(rows: np.ndarray) -> tuple[list[list[int]], float | None]:
    """:func:`duplicate_groups` and :func:`closest_distance` of ``rows`` from one pairwise-distance matrix (a round's
    backbone updates are millions wide)."""
    rows = np.asarray(rows, dtype=np.float64)
    relative = _relative_distances(rows)
    closest = float(relative[np.triu_indices(rows.shape[0], 1)].min()) if rows.shape[0] > 1 else None
    return _groups_within(relative), closest


AGGREGATORS: dict[str, Aggregator] = {
    "mean": mean,
    "median": median,
    "trimmed_mean": trimmed_mean,
    "meamed": meamed,
    "geometric_median": geometric_median,
    "centered_clipping": centered_clipping,
    "multi_krum": multi_krum,
    "mda": mda,
}
PRE_AGGREGATORS: dict[str, Aggregator] = {"nnm": nearest_neighbour_mixing}
# the server's rule unless a job names another: the attack suite's results chose it (docs/server-checks.md)
DEFAULT_RULE = "geometric_median"
# the parts a rule by part names, each with its own rule: the backbone's learned weights, and each head row
RULE_PARTS = ("backbone", "head_rows")
MIN_ROWS = 3  # a part moved by fewer sites is averaged: no rule tells one hostile row from one honest row among two
# the backbone parts a rule aggregates: its learned weights. BatchNorm's running statistics are averages each site
# measures, bounded by their own checks (valid variances, caps, clipping to the round's median size): the attack
# suite's inflated variances did more harm through the geometric median of the statistics than through their mean
ROBUST_GROUPS = (WEIGHTS,)


@dataclass(frozen=True)
class RobustRule:
    """A pre-aggregation (or none) and an aggregator, e.g. ``nnm+trimmed_mean``; ``byzantine``: the hostile rows it
    tolerates among ``n`` (None: the most it can, ``(n - 1) // 2``; never more); ``head_rows``: the rule of each
    head row, where it is not this one (:data:`RULE_PARTS`)."""

    aggregator: str
    pre: tuple[str, ...] = ()
    byzantine: int | None = None
    head_rows: RobustRule | None = None

    @classmethod
    def parse(cls, text: str | Mapping[str, str], byzantine: int | None = None) -> RobustRule:
        """``"nnm+trimmed_mean"`` (every part) or ``{"backbone": ..., "head_rows": ...}`` (a rule for each) -> the
        rule; a :class:`ValueError` names the unknown part and the choices."""
        if isinstance(text, Mapping):
            if sorted(map(str, text)) != sorted(RULE_PARTS) or not all(isinstance(text[part], str) for part in text):
                raise ValueError(
                    f"a robust aggregation by part names a rule for each of {list(RULE_PARTS)}, got {dict(text)!r}"
                )
            backbone, rows = (cls.parse(text[part], byzantine) for part in RULE_PARTS)
            return backbone if rows == backbone else replace(backbone, head_rows=rows)
        if not isinstance(text, str) or not text:
            raise ValueError(f"a robust aggregation rule is a name such as 'nnm+trimmed_mean', got {text!r}")
        *pre, aggregator = text.split("+")
        if aggregator not in AGGREGATORS:
            raise ValueError(f"unknown robust aggregator {aggregator!r}; choose one of {sorted(AGGREGATORS)}")
        unknown = [name for name in pre if name not in PRE_AGGREGATORS]
        if unknown:
            raise ValueError(f"unknown pre-aggregation {unknown[0]!r}; choose one of {sorted(PRE_AGGREGATORS)}")
        if byzantine is not None and (not isinstance(byzantine, int) or isinstance(byzantine, bool) or byzantine < 0):
            raise ValueError(f"byzantine_sites must be a whole number of at least 0 or null, got {byzantine!r}")
        return cls(aggregator, tuple(pre), byzantine)

    @property
    def name(self) -> str:
        own = "+".join([*self.pre, self.aggregator])
        return own if self.head_rows is None else f"backbone {own}, head rows {self.head_rows.name}"

    @property
    def backbone(self) -> RobustRule:
        """The backbone's rule (this one, without another rule for the head rows)."""
        return replace(self, head_rows=None)

    @property
    def rows(self) -> RobustRule:
        """The rule of each head row that three or more sites moved."""
        return self.head_rows or self

    @property
    def is_mean(self) -> bool:
        """Whether every part takes the plain mean."""
        return self.aggregator == "mean" and not self.pre and (self.head_rows is None or self.head_rows.is_mean)

    def tolerated(self, rows: int) -> int:
        """The hostile rows it tolerates among ``rows``: its ``byzantine`` setting, at most ``(rows - 1) // 2``."""
        most = (rows - 1) // 2
        return most if self.byzantine is None else min(self.byzantine, most)

    def __call__(self, rows: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
        """The aggregate of ``rows`` (one per site) by the backbone's rule; fewer than :data:`MIN_ROWS` rows: their
        mean."""
        rows = np.asarray(rows, dtype=np.float64)
        if rows.shape[0] < MIN_ROWS:
            return rows.mean(axis=0)
        f = self.tolerated(rows.shape[0])
        for name in self.pre:
            rows = PRE_AGGREGATORS[name](rows, f)
        return AGGREGATORS[self.aggregator](rows, f)


# --- applied to a model, part by part -------------------------------------------------------------------------


@dataclass
class SiteResult:
    """What one site sent (after the server's clipping), read against the global model it was sent."""

    state: Mapping[str, Any]
    class_names: Sequence[str]  # its head rows' names, in its own spelling
    site: str = ""  # its name, for the round's record (empty: its position among the results)


@dataclass
class RobustOutcome:
    """A round's model after the robust rules, and what they did."""

    state: dict[str, Any]
    parts: dict[str, int] = field(default_factory=dict)  # part -> how many sites' updates its rule aggregated
    agreement: dict[str, float] = field(default_factory=dict)  # site -> :func:`shared_row_agreement`: a record


def group_keys(
    averaged_keys: Sequence[str], global_state: Mapping[str, Any], group: str, head: HeadSpec = NAMED_HEAD
) -> list[str]:
    """The averaged float entries of one update group (e.g. ``WEIGHTS``: the backbone's learned weights), head aside."""
    return [
        key
        for key in averaged_keys
        if key not in head.keys
        and update_group(key) == group
        and np.issubdtype(to_numpy(global_state[key]).dtype, np.floating)
    ]


def flat_values(state: Mapping[str, Any], keys: Sequence[str]) -> np.ndarray:
    """The values of ``keys`` in ``state`` as one float64 vector, in ``keys`` order (a part of the model as one row)."""
    return np.concatenate([to_numpy(state[key]).astype(np.float64).ravel() for key in keys])


def unflat_values(vector: np.ndarray, keys: Sequence[str], like: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`flat_values` undone: each key's slice of ``vector``, shaped and typed as its entry in ``like``."""
    values, offset = {}, 0
    for key in keys:
        shape = to_numpy(like[key]).shape
        size = int(np.prod(shape))
        values[key] = cast_like(like[key], vector[offset : offset + size].reshape(shape))
        offset += size
    return values


def row_updates(
    sent: Sequence[tuple[Mapping[str, Any], Sequence[str]]],
    global_state: Mapping[str, Any],
    global_classes: Sequence[str],
    head: HeadSpec = NAMED_HEAD,
    normalize: Callable[[str], str] | None = None,
) -> dict[str, list[np.ndarray]]:
    """Canonical class name -> each sender's update of that head row (weights, then bias) against ``global_state``,
    in ``sent`` order; ``sent``: each site's state and its head rows' names. A row the global model lacks is skipped."""
    normalize = normalize or (lambda name: name)
    old_weight, old_bias = (to_numpy(global_state[key]).astype(np.float64) for key in head.keys)
    positions = {normalize(name): index for index, name in enumerate(global_classes)}
    updates: dict[str, list[np.ndarray]] = {}
    for site_state, names in sent:
        weight, bias = (to_numpy(site_state[key]).astype(np.float64) for key in head.keys)
        for row, name in enumerate(names):
            index = positions.get(normalize(name))
            if index is not None:
                old = np.append(old_weight[index], old_bias[index])
                updates.setdefault(normalize(name), []).append(np.append(weight[row], bias[row]) - old)
    return updates


@server_check(
    "aggregation",
    "with `robust_aggregation` (default `geometric_median`; or one rule for the backbone and another for the head "
    "rows), each part of the model (the backbone's learned weights, "
    f"each head row over the sites that hold it) that {MIN_ROWS} or more accepted results moved takes the rule's "
    "aggregate of their (clipped) updates instead of their mean, tolerating `byzantine_sites` hostile ones (default: "
    "the most it can, (n - 1) // 2 of n); two updates of a part within 0.1 % of each other (relative to the larger) "
    "count once (a copy of another site's update, the mimic attack), and a part left with fewer than 3 distinct "
    "updates takes their plain mean; a part fewer sites moved, and the "
    "BatchNorm statistics (running averages the sites measure, held by their own checks), keep their (weighted) mean",
    "(recorded in the round's `robust`: how many sites each part's rule aggregated)",
)
def robust_state(
    mean_state: Mapping[str, Any],
    global_state: Mapping[str, Any],
    global_classes: Sequence[str],
    results: Sequence[SiteResult],
    averaged_keys: Sequence[str],
    rule: RobustRule,
    head: HeadSpec = NAMED_HEAD,
    normalize: Callable[[str], str] | None = None,
) -> RobustOutcome:
    """``mean_state`` (the round's surgical mean of ``results``) with each part that :data:`MIN_ROWS` or more sites
    moved replaced by ``global + rule(updates)``: the backbone's learned weights as one vector (:data:`ROBUST_GROUPS`;
    the BatchNorm statistics keep their mean), and each head row (weights and bias, matched by name) over the sites
    that sent it. An update is what a site sent
    minus the global model's value. A part fewer sites moved keeps its mean. The outcome records each site's
    :func:`shared_row_agreement`."""
    normalize = normalize or (lambda name: name)
    outcome = RobustOutcome(dict(mean_state))
    state, replaced = outcome.state, outcome.parts
    if rule.is_mean or len(results) < MIN_ROWS:
        return outcome
    for group in ROBUST_GROUPS:
        keys = group_keys(averaged_keys, global_state, group, head)
        if not keys or rule.backbone.is_mean:  # a part whose rule is the mean keeps the surgical (weighted) mean
            continue
        base = flat_values(global_state, keys)
        rows = np.stack([flat_values(result.state, keys) - base for result in results])
        state.update(unflat_values(base + rule(distinct_rows(rows)), keys, global_state))
        replaced[group] = len(results)
    positions = {normalize(name): index for index, name in enumerate(global_classes)}
    old_weight, old_bias = (to_numpy(global_state[key]).astype(np.float64) for key in head.keys)
    updates: dict[str, dict[str, np.ndarray]] = {}  # site -> canonical class -> its update of the row
    for number, result in enumerate(results):
        weight, bias = (to_numpy(result.state[key]).astype(np.float64) for key in head.keys)
        rows = updates.setdefault(result.site or str(number), {})
        for row, name in enumerate(result.class_names):
            canonical = normalize(name)
            if canonical in positions:
                index = positions[canonical]
                rows[canonical] = np.append(weight[row], bias[row]) - np.append(old_weight[index], old_bias[index])
    holders: dict[str, list[str]] = {}
    for site, rows in updates.items():
        for canonical in rows:
            holders.setdefault(canonical, []).append(site)
    new_weight, new_bias = (to_numpy(state[key]).astype(np.float64) for key in head.keys)
    consensus: dict[str, np.ndarray] = {}
    for canonical, sites in holders.items():
        if len(sites) < MIN_ROWS:
            continue
        index = positions[canonical]
        consensus[canonical] = rule.rows(distinct_rows(np.stack([updates[site][canonical] for site in sites])))
        if rule.rows.is_mean:
            continue
        moved = np.append(old_weight[index], old_bias[index]) + consensus[canonical]
        new_weight[index], new_bias[index] = moved[:-1], moved[-1]
        replaced[row_part(canonical)] = len(sites)
    outcome.agreement = shared_row_agreement(updates, consensus)
    state[head.weight_key] = cast_like(global_state[head.weight_key], new_weight)
    state[head.bias_key] = cast_like(global_state[head.bias_key], new_bias)
    return outcome


MIN_SHARED_ROWS = 5  # fewer shared rows let honest sites read as opposed (the clean sweep: one row down to -1.00)


@server_check(
    "update",
    "with `reject_opposed_updates` and three or more results left, in the job's first round from untrained heads (the "
    "sites' warm-up round, when every head row starts from scratch) a site whose updates of the head rows it shares "
    f"with two or more other sites (at least {MIN_SHARED_ROWS} such rows) point against those rows' consensus (each "
    "row's robust aggregate over its holders, a copy counted once) on average (a mean cosine of 0 or below, each row "
    "weighing alike) has its result rejected and stays out for the rest of the job, as labels of the same findings "
    "read the other way round (a site trained on inverted labels), unless half or more of the sites that hold such "
    "rows do; a row whose holders split (half or more of them against its consensus) counts in no site's mean, "
    f"unless that leaves the site fewer than {MIN_SHARED_ROWS} rows (then it counts all its shared rows); once a site "
    "is rejected so, the consensus is taken again without it and the rest judged again, the lowest mean cosine first, "
    "one site a pass, while fewer than half of those sites are out (two flippers among a row's four holders pull its "
    "consensus their way); later rounds, a site that joins later and a job that starts from trained heads are not "
    "judged by it (honest sites' rows then pull apart), nor a site with fewer shared rows",
    "in its warm-up round its updates of the 7 head rows it shares with two or more other sites point against their "
    "consensus (mean cosine -0.98 with their robust aggregates): left out for the rest of the job",
)
def opposed_at_warmup(
    against: Mapping[str, SharedRows], judged: Collection[str], left_out_before: int = 0
) -> dict[str, str]:
    """site -> why, for each site of ``judged`` (those in the warm-up round) whose updates of its shared head rows
    point against their consensus on average (``against``: :func:`shared_rows_against_consensus`, every site of the
    round; its ``mean_cosine``, so that no one row, however large, decides). Only sites with :data:`MIN_SHARED_ROWS` or
    more such rows are judged; when half or more of the sites that share a row would be, none is (the consensus is
    then no one's). Set on the clean sweep's records: in the warm-up round honest sites with five or more shared rows
    read 0.89 to 1.00 (concatenated), label flippers -0.97 to -1.00; later rounds overlap (honest sites down to
    -0.32), so they are not judged (``docs/server-checks.md``). ``left_out_before``: how many sites an earlier pass
    of :func:`peeled_opposed_at_warmup` rejected, left out of ``against``'s consensus (the reason says so, naming
    none of them)."""
    plural = "s" if left_out_before > 1 else ""
    again = f" (judged again without the {left_out_before} site{plural} rejected before it)" if left_out_before else ""
    opposed = {
        site: (
            f"in its warm-up round{again} its updates of the {shared.rows} head rows it shares with two or more other "
            f"sites{_split_note(shared)} point against their consensus (mean cosine {shared.mean_cosine:.2f} "
            "with their robust aggregates): left out for the rest of the job"
        )
        for site, shared in sorted(against.items())
        if site in judged and shared.rows >= MIN_SHARED_ROWS and shared.mean_cosine <= 0
    }
    return {} if 2 * len(opposed) >= len(against) else opposed


def _split_note(shared: SharedRows) -> str:
    """What the reason says of the site's rows whose holders split: set aside, or counted as too few were left."""
    if not shared.split:
        return ""
    if shared.split_counted:
        return f" ({shared.split} of them split among their holders, counted as too few would be left without them)"
    return f" (and {shared.split} more whose holders split, which judge no one)"


def peeled_opposed_at_warmup(
    rows: Mapping[str, Mapping[str, np.ndarray]], rule: Callable[[np.ndarray], np.ndarray], judged: Collection[str]
) -> tuple[dict[str, str], dict[str, SharedRows]]:
    """(site -> why, the record) for the warm-up rows rule (:func:`opposed_at_warmup`) judged in passes: each pass
    rejects the one judged site with the lowest mean cosine at 0 or below, and the next reads the rest against the
    consensus of the sites not rejected. ``rows``: site -> canonical class -> its update of that row (every site of
    the round); ``rule``: the consensus of a row's holders. Where the first pass rejects no one the later passes add
    nothing: the rule's error rate on clean federations is the first pass's (``docs/server-checks.md``). Passes stop
    when no judged site reads 0 or below, or when one more would leave half or more of the sites that share rows out.
    The record is the first pass's: every site as sent, against the consensus of all (``shared_rows`` in the round's
    history)."""
    record = shared_rows_against_consensus(rows, rule)
    against, opposed = record, {}
    while True:
        found = opposed_at_warmup(against, [site for site in judged if site in against], len(opposed))
        if not found or 2 * (len(opposed) + 1) >= len(record):
            return opposed, record
        lowest = min(found, key=lambda site: (against[site].mean_cosine, site))
        opposed[lowest] = found[lowest]
        against = shared_rows_against_consensus({site: rows[site] for site in rows if site not in opposed}, rule)


# a round of exactly two results: the figures recorded (two_site_agreement) and judged (two_sites_apart)
BACKBONE_COSINE, STATISTICS_RATIO, SHARED_ROWS, SHARED_ROWS_COSINE = (
    "backbone_cosine",
    "statistics_ratio",
    "shared_rows",
    "shared_rows_mean_cosine",
)


def two_site_agreement(changes: Mapping[str, np.ndarray], sizes: Mapping[str, UpdateSizes]) -> dict[str, Any]:
    """How the two results of a round of two compare (``changes``: site -> its backbone update, ``sizes``: site -> its
    :class:`UpdateSizes`): the cosine of their backbone updates, the larger over the smaller size of their
    BatchNorm-statistics updates, and the mean cosine of the head rows both moved (each row alike) with their count.
    None where a figure is undefined (a zero update, no BatchNorm statistics moved, no shared row)."""
    first, second = sorted(changes)
    agreement: dict[str, Any] = {
        BACKBONE_COSINE: consensus_cosines({first: changes[first]}, changes[second]).get(first)
    }
    pair = sorted(sizes[site].groups.get(STATISTICS, 0.0) for site in (first, second))
    agreement[STATISTICS_RATIO] = pair[1] / pair[0] if pair[0] > 0 else None
    rows = [
        (sizes[first].row_changes[name], sizes[second].row_changes[name])
        for name in sorted(set(sizes[first].row_changes) & set(sizes[second].row_changes))
        if np.any(sizes[first].row_changes[name]) and np.any(sizes[second].row_changes[name])
    ]
    cosines = [consensus_cosines({"row": own}, other).get("row", 0.0) for own, other in rows]
    agreement[SHARED_ROWS] = len(cosines)
    agreement[SHARED_ROWS_COSINE] = float(np.mean(cosines)) if cosines else None
    return agreement


# a round of two is judged by its direction in the job's first round from untrained heads only. There, honest pairs
# of the clean sweeps' two-site federations (62, from scratch and from the stand-in) came to a backbone cosine of
# -0.06 at their lowest and shared rows of 0.15. Later, nothing tells a site that negates the other's update from two
# honest ones: as averaging nears its fixed point, the mean of the two updates tends to zero, so their systematic
# parts cancel and the cosine falls towards -1 (honest pairs reached -0.54 for the backbone and -0.56 for the rows
# within five rounds; stop 93's later-round bounds of -0.5 and -0.9 stopped an honest pair of the stand-in sweep)
OPPOSED_BACKBONE = -0.5


@server_check(
    "update",
    "with `reject_opposed_updates` and exactly two results left (a federation of two, or a round that rejected the "
    "rest), the job stops (non-zero, nothing published, the last good model on disk) when, in the job's first round "
    f"from untrained heads, the head rows both sites moved ({MIN_SHARED_ROWS} or more) point apart (a mean cosine of "
    f"0 or below, each row alike) or their backbone updates point opposite (a cosine of {OPPOSED_BACKBONE:g} or "
    "below): one of them read the same findings' labels the other way round, or negated its update, and with two "
    "sites the server cannot tell which. Later rounds are not judged by direction: two honest updates come to cancel "
    "as averaging nears its fixed point, as a negating site's does",
    "in their warm-up round their updates of the 7 head rows both hold point apart (mean cosine -0.98): one of them "
    "reads those findings' labels the other way round",
)
def two_sites_apart(agreement: Mapping[str, Any], *, warmup_round: bool) -> list[str]:
    """Why the two results of a round of two (``agreement``: :func:`two_site_agreement`) stand further apart than
    honest pairs do in the job's first round from untrained heads (``warmup_round``); empty when they do not, and in
    every later round. There: five or more shared rows with a mean cosine of 0 or below (the warm-up rows rule's
    figures for three or more sites, :func:`opposed_at_warmup`), or a backbone cosine of :data:`OPPOSED_BACKBONE` or
    below. A site honest in that round and hostile later (the suite's ``sign_flip_late``, ``label_flip_late``) is not
    stopped here: only the sites' validation judges it (``core.judging``)."""
    if not warmup_round:
        return []
    found = []
    rows, cosine = agreement.get(SHARED_ROWS, 0), agreement.get(SHARED_ROWS_COSINE)
    backbone = agreement.get(BACKBONE_COSINE)
    if rows >= MIN_SHARED_ROWS and cosine is not None and cosine <= 0:
        found.append(
            f"in their warm-up round their updates of the {rows} head rows both hold point apart (mean cosine "
            f"{cosine:.2f}): one of them reads those findings' labels the other way round"
        )
    if backbone is not None and backbone <= OPPOSED_BACKBONE:
        found.append(
            f"in their warm-up round their backbone updates point opposite (cosine {backbone:.2f}, at most "
            f"{OPPOSED_BACKBONE:g}): one of them negates the other's update"
        )
    return found


class SharedRows(NamedTuple):
    """A site's updates of the head rows three or more sites moved, against their consensus."""

    cosine: float  # of its updates of them, concatenated, with their consensus, concatenated alike
    rows: int  # how many of those rows it is judged on (those whose holders do not split, or all: see below)
    scale: float  # the norm of its updates of them over their consensus's (a record for a rule on later rounds)
    mean_cosine: float  # the mean over the rows it is judged on of each row's cosine with its consensus (each alike)
    split: int = 0  # how many such rows it moved whose holders split (half or more against the consensus)
    split_counted: bool = False  # those rows counted all the same: too few were left to judge it on without them


def shared_rows_against_consensus(
    updates: Mapping[str, Mapping[str, np.ndarray]],
    rule: Callable[[np.ndarray], np.ndarray],
    set_split_rows_aside: bool = True,
) -> dict[str, SharedRows]:
    """site -> :class:`SharedRows`: the head rows it moved that :data:`MIN_ROWS` or more sites moved, against their
    consensus (``rule`` over each row's holders, one row per holder, a copy counted once: :func:`distinct_rows`).
    A row whose holders split, half or more of them pointing against its consensus (a cosine of 0 or below), has no
    one's consensus (two colluders among its four holders can take it: ``docs/server-checks.md``), so its cosines
    count in no site's mean (``split``; ``set_split_rows_aside=False``: they count, as before stop 114, for
    ``benchmarks/warmup_passes.py``), except a site left with fewer than :data:`MIN_SHARED_ROWS` rows that do not
    split, which is read on every shared row as before (a row an honest holder disagrees on splits with a flipper's,
    and must not leave the flipper unjudged); the concatenated cosine and the scale read every shared row. ``updates``:
    site -> canonical class -> its update of that row (weights and bias). Sites that share no such row have no entry.
    Recorded every round (``shared_rows`` in the round's history); only the warm-up round is judged by it
    (:func:`opposed_at_warmup`)."""
    holders: dict[str, list[str]] = {}
    for site, rows in updates.items():
        for name, row in rows.items():
            if np.any(row):
                holders.setdefault(name, []).append(site)
    consensus = {
        name: rule(distinct_rows(np.stack([updates[site][name] for site in sites])))
        for name, sites in holders.items()
        if len(sites) >= MIN_ROWS
    }
    each = {
        name: {site: consensus_cosines({site: updates[site][name]}, row).get(site, 0.0) for site in holders[name]}
        for name, row in consensus.items()
    }
    split = {
        name
        for name, cosines in each.items()
        if set_split_rows_aside and 2 * sum(value <= 0 for value in cosines.values()) >= len(cosines)
    }
    against = {}
    for site, cosine in shared_row_agreement(updates, consensus).items():
        names = _shared_names(updates[site], consensus)
        own, theirs = (
            np.linalg.norm(np.concatenate([part[name] for name in names])) for part in (updates[site], consensus)
        )
        kept = [name for name in names if name not in split]
        counted = len(kept) < MIN_SHARED_ROWS  # too few left to judge it on: every shared row, as before stop 114
        judged = [each[name][site] for name in (names if counted else kept)]
        mean = float(np.mean(judged)) if judged else 0.0  # no row to judge it on (fewer than MIN_SHARED_ROWS)
        found = len(names) - len(kept)
        against[site] = SharedRows(cosine, len(judged), float(own / theirs), mean, found, counted and found > 0)
    return against


def _shared_names(rows: Mapping[str, np.ndarray], consensus: Mapping[str, np.ndarray]) -> list[str]:
    """The classes of ``rows`` (one site's row updates) that have a consensus and that the site moved."""
    return [name for name in rows if name in consensus and np.any(rows[name])]


def shared_row_agreement(
    updates: Mapping[str, Mapping[str, np.ndarray]], consensus: Mapping[str, np.ndarray]
) -> dict[str, float]:
    """site -> the cosine between its updates of the head rows in ``consensus`` (those three or more sites moved),
    concatenated, and those rows' consensus updates, concatenated alike. ``updates``: site -> canonical class ->
    its (clipped) update of that row. A site that moved none of those rows (or whose rows' consensus is zero) has no
    entry. A record, not a rule: a label flipper's is -0.68 to -1.00, but honest sites' reach -1.00 too (a site whose
    one shared row its data push the other way), so no threshold on it alone spares them (``docs/server-checks.md``)."""
    agreement = {}
    for site, rows in updates.items():
        names = _shared_names(rows, consensus)
        if names:
            own = np.concatenate([rows[name] for name in names])
            agreement |= consensus_cosines({site: own}, np.concatenate([consensus[name] for name in names]))
    return agreement
