"""The size of each part of an update against references no single site controls, its direction, and how the
round's updates are clipped and weighted."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..head import NAMED_HEAD, HeadSpec, StateDict, cast_like, to_numpy
from . import NameNormalizer, Reasons, at_most, server_check

WEIGHTS, STATISTICS, ROWS = "backbone weights", "BatchNorm statistics", "head rows"
UPDATE_GROUPS = (WEIGHTS, STATISTICS, ROWS)
# The most one round may move each part, as a share of the part's own size in the global model: references no
# site controls. Measured on the default job: honest rounds move the backbone weights by ~1 % of their norm,
# the BatchNorm statistics by 5-60 % (most in the first round) and head rows by 4-45 % (most in the warm-up).
UPDATE_CAPS = {WEIGHTS: 1.0, STATISTICS: 4.0, ROWS: 10.0}
ROW_NORM_FLOOR = 0.1  # a head row's size is at least this much (a row trained towards zero still has a bound)
DEFAULT_UPDATE_BOUND = 10.0  # an update may be this many times the typical accepted update of earlier rounds
HISTORY_ROUNDS = 10  # the earlier rounds that make the typical update
SAMPLES = "samples"  # the typical accepted site's sample count, kept beside the typical update of each part
# A site with more training samples than the typical accepted site takes more optimiser steps a round and moves
# further (seed 139 of the clean sweep: 842 samples beside 71 and 37 moved a shared head row 12 times as far), so its
# bound grows with its share of the typical count, at most this much: 32 covers sites of 50 to 800 patients.
MAX_SIZE_SCALE = 32.0


@dataclass
class UpdateSizes:
    """How much one result moved each part of the model, as a share of that part's size in the model the site
    received (0.01: by 1 % of its norm)."""

    groups: dict[str, float] = field(default_factory=dict)  # WEIGHTS, STATISTICS -> share
    rows: dict[str, float] = field(default_factory=dict)  # the site's spelling of a class -> its row's share
    samples: float | None = None  # the training samples the site reported for this result (None: not known)
    # each row's update itself (weights and bias) by canonical class name, for the round's record of shared rows
    row_changes: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)
    # canonical class -> the cosine of its row's weight update with the row's weights as received (bias left out: it
    # follows the site's prevalence): a site training on inverted labels turns the rows it trains back (negative)
    row_turns: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def typical_row(self) -> float | None:
        """The median over the rows the site moved. A row it left exactly as received is not part of its update:
        with FL + partial loss a site sends the union's rows and leaves those of classes it does not label alone,
        so a median over all rows would be 0 and make every later row update look out of proportion."""
        moved = [size for size in self.rows.values() if size > 0]
        return float(np.median(moved)) if moved else None

    def summary(self) -> dict[str, float]:
        """One number per group (rows: the median over the rows the site moved), rounded for the round's record."""
        values, row = dict(self.groups), self.typical_row
        if row is not None:
            values[ROWS] = row
        return {group: float(f"{value:.4g}") for group, value in values.items()}


def update_group(key: str) -> str:
    """The part of the model a backbone entry belongs to: the BatchNorm statistics or the learned weights."""
    return STATISTICS if key.endswith((".running_mean", ".running_var")) else WEIGHTS


def _norm(arrays: Sequence[np.ndarray]) -> float:
    return math.sqrt(sum(float(np.sum(np.square(array, dtype=np.float64))) for array in arrays))


def update_sizes(
    sent: StateDict,
    sent_classes: Sequence[str],
    received: StateDict,
    received_classes: Sequence[str],
    averaged_keys: Sequence[str],
    head: HeadSpec = NAMED_HEAD,
    normalize: NameNormalizer | None = None,
) -> UpdateSizes:
    """The relative size of ``sent - received`` for the learned backbone weights, the BatchNorm statistics
    (running means and variances) and each head row (matched by name), over the keys the aggregation averages."""
    normalize = normalize or (lambda name: name)
    weights: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
    statistics: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
    for key in averaged_keys:
        old = to_numpy(received[key])
        if not np.issubdtype(old.dtype, np.floating) or key in head.keys:
            continue
        change = to_numpy(sent[key]).astype(np.float64) - old.astype(np.float64)
        group = statistics if update_group(key) == STATISTICS else weights
        group[0].append(change)
        group[1].append(old)
    sizes = UpdateSizes()
    for name, (changes, olds) in ((WEIGHTS, weights), (STATISTICS, statistics)):
        if olds:
            sizes.groups[name] = _norm(changes) / max(_norm(olds), 1e-12)
    for name, (old, new) in head_rows(sent, sent_classes, received, received_classes, head, normalize).items():
        sizes.row_changes[normalize(name)] = new - old
        sizes.row_turns.update(consensus_cosines({normalize(name): new[:-1] - old[:-1]}, old[:-1]))
        sizes.rows[name] = _norm([new - old]) / max(_norm([old]), ROW_NORM_FLOOR)
    return sizes


def head_rows(
    sent: StateDict,
    sent_classes: Sequence[str],
    received: StateDict,
    received_classes: Sequence[str],
    head: HeadSpec = NAMED_HEAD,
    normalize: NameNormalizer | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each head row the site was sent and sent back, matched by name: its spelling -> (received, sent), each the
    row's weights with its bias appended, float64."""
    normalize = normalize or (lambda name: name)
    received_rows = {normalize(name): row for row, name in enumerate(received_classes)}
    old_weight, old_bias = (to_numpy(received[key]).astype(np.float64) for key in head.keys)
    new_weight, new_bias = (to_numpy(sent[key]).astype(np.float64) for key in head.keys)
    rows = {}
    for row, name in enumerate(sent_classes):
        old_row = received_rows.get(normalize(name))
        if old_row is not None:
            rows[name] = (np.append(old_weight[old_row], old_bias[old_row]), np.append(new_weight[row], new_bias[row]))
    return rows


@dataclass
class UpdateReference:
    """The typical accepted update of earlier rounds, per group: the median over the last rounds of each round's
    median over its accepted sites (free-riders and head warm-ups left out). One site among three or more cannot
    move it; with two, a round's median is the mean of both."""

    rounds: list[dict[str, float]] = field(default_factory=list)  # each round's medians, oldest first

    def typical(self, group: str) -> float | None:
        values = [entry[group] for entry in self.rounds[-HISTORY_ROUNDS:] if group in entry]
        return float(np.median(values)) if values else None

    def record(self, sizes: Sequence[UpdateSizes], warmed_up: Sequence[bool]) -> None:
        entry = {}
        for group in (WEIGHTS, STATISTICS):
            values = [size.groups[group] for size in sizes if group in size.groups]
            if values:
                entry[group] = float(np.median(values))
        rows = [size.typical_row for size, warmup in zip(sizes, warmed_up, strict=True) if not warmup]
        rows = [row for row in rows if row is not None]
        if rows:
            entry[ROWS] = float(np.median(rows))
        samples = [size.samples for size in sizes if size.samples]
        if entry and samples:
            entry[SAMPLES] = float(np.median(samples))
        if entry:
            self.rounds.append(entry)


@server_check(
    "update",
    "each part of the update (the backbone weights, the BatchNorm statistics, each head row) at most its cap "
    f"share of that part's size in the global model ({', '.join(f'{g}: {c:g}' for g, c in UPDATE_CAPS.items())}), "
    "and at most `update_bound` (default 10) times the typical accepted update of earlier rounds, times the site's "
    f"sample count over the typical accepted site's where that is larger (at most {MAX_SIZE_SCALE:g} times)",
    "its update of the backbone weights is 2.1 times their size; this federation accepts at most 1 in one round",
)
def update_problems(
    sizes: UpdateSizes, reference: UpdateReference, bound: float | None, warmup: bool
) -> tuple[Reasons, list[str]]:
    """(reasons told to the site, details for the server's log only). A head warm-up's rows are held to their cap
    only: the first rows of a class move further than later rounds' do."""
    if bound is None:
        return [], []
    told, details = [], []
    scale = size_scale(sizes.samples, reference.typical(SAMPLES))
    scaled = f" x {scale:.3g} ({sizes.samples:g} samples against {reference.typical(SAMPLES):g})" if scale > 1 else ""

    def judge(part: str, size: float, group: str, use_history: bool) -> None:
        cap = UPDATE_CAPS[group]
        typical = reference.typical(group) if use_history else None
        if size > cap:
            told.append(
                f"its update of {part} is {size:.3g} times their size; this federation accepts at most {cap:g} in "
                "one round"
            )
        elif typical is not None and size > bound * typical * scale:
            told.append(
                f"its update of {part} is {size:.3g} times their size, more than update_bound ({bound:g}) times the "
                "typical accepted update of earlier rounds" + (" for its sample count" if scale > 1 else "")
            )
            details.append(f"{part}: {size:.4g} > {bound:g} x {typical:.4g}{scaled}")

    for group, size in sizes.groups.items():
        judge(f"the {group}", size, group, use_history=True)
    for name, size in sizes.rows.items():
        judge(f"the head row of {name!r} (weights and bias)", size, ROWS, use_history=not warmup)
    return at_most(told, 4, " parts"), details


def size_scale(samples: float | None, typical_samples: float | None) -> float:
    """How much further than the typical accepted site a site may move the model: its sample count over the
    typical one's, never below 1 (a smaller site keeps the plain bound) and at most :data:`MAX_SIZE_SCALE`."""
    if not samples or not typical_samples:
        return 1.0
    return min(max(samples / typical_samples, 1.0), MAX_SIZE_SCALE)


FREE_RIDER_SHARE = 1e-3  # an update below this share of the round's largest accepted one changes almost nothing


@server_check(
    "update",
    "an update of the backbone weights that is zero, or below 0.1 % of the round's largest accepted one, makes its "
    "site a free-rider: recorded as such, left out of the mean (a zero update only shrinks the others' step, by "
    "the share its claimed sample count buys) unless every valid result is one, and never part of the typical update "
    "(so sites that send nothing cannot shrink it until honest updates exceed the bound)",
    "(recorded in the round's `free_riders`, not a rejection)",
)
def free_riders(sizes: Mapping[str, UpdateSizes]) -> list[str]:
    """The sites whose results barely moved the backbone weights, among a round's accepted results."""
    weights = {site: size.groups[WEIGHTS] for site, size in sizes.items() if WEIGHTS in size.groups}
    largest = max(weights.values(), default=0.0)
    return sorted(site for site, size in weights.items() if size == 0 or size < FREE_RIDER_SHARE * largest)


def weight_change(
    sent: StateDict, received: StateDict, averaged_keys: Sequence[str], head: HeadSpec = NAMED_HEAD
) -> np.ndarray:
    """A result's update of the backbone weights (the BatchNorm statistics and the head left out), flattened in key
    order, float32."""
    changes = [
        (to_numpy(sent[key]).astype(np.float32) - to_numpy(received[key]).astype(np.float32)).ravel()
        for key in averaged_keys
        if key not in head.keys
        and update_group(key) == WEIGHTS
        and np.issubdtype(to_numpy(received[key]).dtype, np.floating)
    ]
    return np.concatenate(changes) if changes else np.zeros(0, dtype=np.float32)


MIN_SITES_FOR_DIRECTION = 3  # a coordinate-wise median of three or more updates lies between honest values
# `reject_opposed_updates`' value that judges each site's direction once: in the first round that measures it
OPPOSED_FIRST_ROUND = "first_round"


@server_check(
    "update",
    'with `reject_opposed_updates` (on: every round, the default from scratch; `"first_round"`: once a site, in the '
    "first round that judges its update's direction, the job's first or the one a site that missed it comes in, "
    "recorded as `direction_judged`, after it its running opposition, below: the bundle's jobs' setting from "
    "pretrained weights) and three or more results "
    "left, an update of the backbone weights that points against the round's consensus (a cosine of 0 or below with "
    "the robust aggregate of every result's update, a copy counted once: the job's robust rule, or the coordinate-wise"
    " median where the rule is the mean) is rejected, and with it all the site sent this round (its head rows "
    "included: a row only it and one other site hold has no other protection), unless half or more of the round's "
    "updates do (the consensus is then no one's: nobody is judged)",
    "its update of the backbone weights points against the round's consensus (cosine -0.97 with the robust aggregate)",
)
def opposed_updates(changes: Mapping[str, np.ndarray], consensus: np.ndarray) -> dict[str, str]:
    """site -> why, for each site whose update (``changes``: site -> :func:`weight_change`) has a cosine of 0 or below
    with ``consensus`` (the robust aggregate of all of them: with honest sites in the majority it lies among their
    updates, and each honest update, its own pull included, has a positive cosine with it, even when honest updates
    are nearly orthogonal to each other). Fewer than three sites, or half or more of them opposed: none. Zero updates
    are left alone (free-riders)."""
    if len(changes) < MIN_SITES_FOR_DIRECTION:
        return {}
    opposed = {}
    for site, cosine in sorted(consensus_cosines(changes, consensus).items()):
        if cosine <= 0:
            opposed[site] = (
                "its update of the backbone weights points against the round's consensus "
                f"(cosine {cosine:.2f} with the robust aggregate)"
            )
    return {} if consensus_is_no_ones(opposed, len(changes)) else opposed


def consensus_is_no_ones(opposed: Collection[str], results: int) -> bool:
    """Whether half or more of a round's ``results`` point against its consensus (``opposed``): it is then no one's,
    and the direction check judges nobody that round."""
    return 2 * len(opposed) >= results


# Page's CUSUM (1954) over a site's rounds after its first-round judgment: its running opposition to the rounds'
# consensus grows by -cosine - OPPOSITION_REFERENCE a round (at least 0), and an update that takes it above
# OPPOSITION_LIMIT is refused. The reference value is halfway between the honest sites' mean later-round opposition
# from the stand-in (-0.48: their cosines' mean 0.48 in the clean sweep) and a flipped update's (1), as Page's rule
# sets it; the limit is half a flipped update, above any one honest later round recorded (the lowest cosine -0.32).
# It never exceeds one flipped round past the limit: refused rounds count, and a site that comes back honest is
# readmitted within a round or two (a flipped update from there is refused again: it adds 0.75 to any value).
OPPOSITION_REFERENCE = 0.25
OPPOSITION_LIMIT = 0.5
OPPOSITION_CAP = OPPOSITION_LIMIT + 1 - OPPOSITION_REFERENCE


def _opposition_shown(value: float) -> str:
    """A running opposition above the limit, as a reason shows it (never rounded down to the limit)."""
    for digits in range(2, 8):
        shown = f"{value:.{digits}f}"
        if float(shown) > OPPOSITION_LIMIT:
            return shown
    return repr(value)


@server_check(
    "update",
    'under `"first_round"`, in each later round with three or more results left, a site judged before has a running '
    "opposition to the rounds' consensus, Page's CUSUM of its update's cosines: in a round whose consensus is "
    f"someone's it grows by -cosine - {OPPOSITION_REFERENCE} (at least 0, at most {OPPOSITION_CAP}), and an update "
    f"that takes it above {OPPOSITION_LIMIT} is rejected, with all the site sent that round; in a round whose "
    f"consensus is no one's it is carried, and a site still above {OPPOSITION_LIMIT} is rejected. Recorded as "
    "`opposition`. Over any run of consecutive judged rounds in which a site's updates are accepted, their "
    f"opposition (-cosine with each round's consensus) adds up to at most {OPPOSITION_LIMIT} + "
    f"{OPPOSITION_REFERENCE} a round, where a flipped update adds 1 a round",
    "its updates of the backbone weights keep pointing against the rounds' consensus (running opposition 0.71 above "
    f"{OPPOSITION_LIMIT}; cosine -0.96 with the robust aggregate this round)",
)
def persistently_opposed(
    cosines: Mapping[str, float], running: Mapping[str, float], consensus_is_someones: bool = True
) -> tuple[dict[str, float], dict[str, str]]:
    """Page's CUSUM of each site in ``running`` (site -> its running opposition before this round) that has a cosine
    in ``cosines`` (site -> its update's cosine with the round's consensus): (site -> its running opposition after
    this round, site -> why, for those taken above :data:`OPPOSITION_LIMIT`). In a round whose consensus is no one's
    nothing is measured and nothing changes, but a site still above the limit stays out."""
    after, refused = {}, {}
    for site, cosine in sorted(cosines.items()):
        if site not in running:
            continue
        if not consensus_is_someones:
            if running[site] > OPPOSITION_LIMIT:
                refused[site] = (
                    f"its running opposition to the rounds' consensus, {_opposition_shown(running[site])}, is still "
                    f"above {OPPOSITION_LIMIT} (this round's consensus is no one's: not measured)"
                )
            continue
        after[site] = min(OPPOSITION_CAP, max(0.0, running[site] - cosine - OPPOSITION_REFERENCE))
        if after[site] > OPPOSITION_LIMIT:
            refused[site] = (
                "its updates of the backbone weights keep pointing against the rounds' consensus (running opposition "
                f"{_opposition_shown(after[site])} above {OPPOSITION_LIMIT}; cosine {cosine:.2f} with the robust "
                "aggregate this round)"
            )
    return after, refused


def consensus_cosines(changes: Mapping[str, np.ndarray], consensus: np.ndarray) -> dict[str, float]:
    """site -> the cosine of its update with ``consensus`` (sites with a zero update, or a zero consensus, left out)."""
    reference = consensus.astype(np.float64)
    reference_norm = float(np.linalg.norm(reference))
    cosines = {}
    for site, change in changes.items():
        norm = float(np.linalg.norm(change))
        if norm > 0 and reference_norm > 0:
            cosines[site] = float(np.dot(change.astype(np.float64), reference)) / (norm * reference_norm)
    return cosines


MIN_SITES_TO_CLIP = 3  # the round's median of a part's updates lies between honest values with 3 or more sites


def row_part(name: str) -> str:
    """The clipping's name of one head row (its canonical class name)."""
    return f"head row {name}"


@server_check(
    "update",
    "with `clip_updates` (default on), each part of an accepted update (the backbone weights, the BatchNorm "
    f"statistics, each head row) that {MIN_SITES_TO_CLIP} or more sites moved this round is scaled down to the "
    "round's median size of that part's updates, so no site moves a part further than a typical site did; a part "
    "two of them moved (a head row two sites hold), to the smaller of their two sizes (a median of two is their "
    "mean, which the larger decides: a site boosting its update of a row it shares with one other site would "
    "otherwise move it alone); a round of two sites is not clipped (nothing tells which is typical)",
    "(recorded in the round's `clipped`: the factor each part was scaled by, not a rejection)",
)
def clip_factors(
    sizes: Mapping[str, UpdateSizes], normalize: NameNormalizer | None = None
) -> dict[str, dict[str, float]]:
    """site -> part (``WEIGHTS``, ``STATISTICS`` or :func:`row_part` of a canonical class) -> the factor below 1 its
    update of that part is scaled by: the round's median size of that part over the sites that moved it (with
    fewer than :data:`MIN_SITES_TO_CLIP` of them, two: the smaller size), divided by the site's. A part one site
    moved is not clipped, nor is an unmoved one, nor anything in a round of fewer than :data:`MIN_SITES_TO_CLIP`
    sites (``sizes``)."""
    normalize = normalize or (lambda name: name)
    by_part: dict[str, dict[str, float]] = {}
    for site, size in sizes.items():
        for group, value in size.groups.items():
            by_part.setdefault(group, {})[site] = value
        for name, value in size.rows.items():
            by_part.setdefault(row_part(normalize(name)), {})[site] = value
    factors: dict[str, dict[str, float]] = {}
    for part, values in by_part.items():
        moved = {site: value for site, value in values.items() if value > 0}
        if len(moved) < 2 or len(sizes) < MIN_SITES_TO_CLIP:
            continue
        values_moved = list(moved.values())
        median = float(np.median(values_moved) if len(moved) >= MIN_SITES_TO_CLIP else min(values_moved))
        for site, value in moved.items():
            if value > median:
                factors.setdefault(site, {})[part] = median / value
    return factors


def clipped_state(
    sent: StateDict,
    sent_classes: Sequence[str],
    received: StateDict,
    received_classes: Sequence[str],
    factors: Mapping[str, float],
    averaged_keys: Sequence[str],
    head: HeadSpec = NAMED_HEAD,
    normalize: NameNormalizer | None = None,
) -> dict[str, Any]:
    """``sent`` with its update of each part in ``factors`` (from :func:`clip_factors`) scaled: received + factor x
    (sent - received), entry by entry (a running variance then lies between two positive values)."""
    normalize = normalize or (lambda name: name)
    state = dict(sent)
    for key in averaged_keys:
        old = to_numpy(received[key])
        factor = factors.get(update_group(key))
        if factor is None or key in head.keys or not np.issubdtype(old.dtype, np.floating):
            continue
        new = to_numpy(sent[key]).astype(np.float64)
        state[key] = cast_like(sent[key], old + factor * (new - old))
    received_rows = {normalize(name): row for row, name in enumerate(received_classes)}
    weight_key, bias_key = head.keys
    weights, biases = (to_numpy(sent[key]).astype(np.float64) for key in head.keys)
    old_weights, old_biases = (to_numpy(received[key]).astype(np.float64) for key in head.keys)
    for row, name in enumerate(sent_classes):
        factor, old_row = factors.get(row_part(normalize(name))), received_rows.get(normalize(name))
        if factor is None or old_row is None:
            continue
        weights[row] = old_weights[old_row] + factor * (weights[row] - old_weights[old_row])
        biases[row] = old_biases[old_row] + factor * (biases[row] - old_biases[old_row])
    if any(part.startswith(row_part("")) for part in factors):
        state[weight_key], state[bias_key] = cast_like(sent[weight_key], weights), cast_like(sent[bias_key], biases)
    return state


@server_check(
    "update",
    "with `weighting: samples`, no site weighs more than all the others together (its sample count is capped at "
    "the sum of theirs), so no claimed or declared training-set size buys a majority of the aggregate",
    "(recorded in the round's `capped_weights`: the count claimed and the weight used, not a rejection)",
)
def capped_weights(weights: Mapping[str, float]) -> dict[str, float]:
    """Each site's aggregation weight at most the sum of the others' (two or more sites; one keeps its own)."""
    if len(weights) < 2:
        return dict(weights)
    total = sum(weights.values())
    return {site: min(weight, total - weight) for site, weight in weights.items()}
