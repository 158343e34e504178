"""Finding names: one open vocabulary, the spellings each dataset uses, and their label lists.

Every place that pairs a label with a number (a CSV column, a head row, an AUROC) reads it through a
:class:`Vocabulary`: :data:`BUILTIN_VOCABULARY`; a site's (the built-in one with its own and the job's
aliases), carried on its loaded config and passed where names are read; or the server's
(:func:`job_vocabulary`). So "Effusion" (NIH), "Pleural Effusion" (CheXpert) and "pleural effusions"
are one class. The vocabulary is open: a name that matches nothing known becomes a class of its own
(logged once, with the known names it is close to), so any hospital's labels can join. A consortium
or a site adds synonyms with an alias file (:func:`read_alias_file`), and a consortium that wants a
closed vocabulary lists its accepted classes (:class:`Vocabulary`). No module holds a vocabulary of
its own: each is a value, passed.

Matching reads names in Unicode NFKC and ignores case, runs of spaces, ``_`` and ``-``, and plural
endings ("Nodules", "Opacities", "Masses"); names that differ in meaning are never merged ("Nodule or
Mass" stays apart from "Nodule" and "Mass", "Lung Opacity" from "Consolidation").
"""

from __future__ import annotations

import difflib
import json
import logging
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from .errors import AliasFileError, DuplicateLabelError, UnknownLabelError

logger = logging.getLogger(__name__)

# CXR-LT 2023 spelling (26 names): the 20-label NIH + CheXpert union, "No Finding" and five
# findings that only CXR-LT annotates.
CANONICAL_FINDINGS: tuple[str, ...] = (
    "Atelectasis",
    "Calcification of the Aorta",
    "Cardiomegaly",
    "Consolidation",
    "Edema",
    "Emphysema",
    "Enlarged Cardiomediastinum",
    "Fibrosis",
    "Fracture",
    "Hernia",
    "Infiltration",
    "Lung Lesion",
    "Lung Opacity",
    "Mass",
    "No Finding",
    "Nodule",
    "Pleural Effusion",
    "Pleural Other",
    "Pleural Thickening",
    "Pneumomediastinum",
    "Pneumonia",
    "Pneumoperitoneum",
    "Pneumothorax",
    "Subcutaneous Emphysema",
    "Support Devices",
    "Tortuous Aorta",
)

NO_FINDING = "No Finding"

# Findings that other public datasets label and CXR-LT does not (VinDr-CXR, Google's NIH expert labels).
# Appended after the CXR-LT names so that those keep their place (e.g. their generated glyphs).
OTHER_DATASET_FINDINGS: tuple[str, ...] = (
    "Aortic Enlargement",
    "Calcification",
    "Interstitial Lung Disease",
    "Nodule or Mass",
    "Other Lesion",
)
BUILTIN_FINDINGS: tuple[str, ...] = CANONICAL_FINDINGS + OTHER_DATASET_FINDINGS

# Other spellings of built-in findings seen in NIH ChestX-ray14, CheXpert, MIMIC-CXR, Open-i, CXR-LT,
# PadChest, VinDr-CXR, Google's NIH relabelling, RSNA and SIIM files. Keys are compared in normal form
# (see ``normal_form``), so case, separators and plural forms need no entry of their own.
ALIASES: dict[str, str] = {
    "Effusion": "Pleural Effusion",
    "Pleural_Thickening": "Pleural Thickening",
    "Opacity": "Lung Opacity",
    "Airspace Opacity": "Lung Opacity",  # Google's NIH relabelling
    "Lesion": "Lung Lesion",
    "Enlarged Cardiom.": "Enlarged Cardiomediastinum",
    "Aortic Calcification": "Calcification of the Aorta",
    "Calcification of Aorta": "Calcification of the Aorta",
    "Normal": "No Finding",  # Open-i, PadChest
    "Infiltrates": "Infiltration",  # PadChest
    "Pulmonary Fibrosis": "Fibrosis",  # PadChest, VinDr-CXR
    "Pulmonary Edema": "Edema",
    "Hiatal Hernia": "Hernia",  # PadChest; NIH's Hernia findings are hiatal hernias
    "ILD": "Interstitial Lung Disease",  # VinDr-CXR
    "Nodule/Mass": "Nodule or Mass",  # VinDr-CXR
}

# NIH ChestX-ray14's own spellings ("Finding Labels" tokens), in file order ("No Finding" dropped).
NIH_RAW_LABELS: tuple[str, ...] = (
    "Atelectasis",
    "Cardiomegaly",
    "Consolidation",
    "Edema",
    "Effusion",
    "Emphysema",
    "Fibrosis",
    "Hernia",
    "Infiltration",
    "Mass",
    "Nodule",
    "Pleural_Thickening",
    "Pneumonia",
    "Pneumothorax",
)

_SEPARATORS = re.compile(r"[\s_\-]+")
_KEEP_FINAL_S = ("ss", "us", "is")  # "Mass", "Callus", "Atelectasis" are not plurals
_NOT_PLURALS = frozenset({"ascites", "caries", "diabetes", "facies", "herpes", "pancreas", "series", "species"})


def _singular(word: str) -> str:
    if len(word) <= 3 or not word.endswith("s") or word.endswith(_KEEP_FINAL_S) or word in _NOT_PLURALS:
        return word
    if word.endswith("sses"):
        return word[:-2]
    if word.endswith("ies"):
        return word[:-3] + "y"
    return word[:-1]


def normal_form(name: str) -> str:
    """What names are matched by: Unicode NFKC (fullwidth and other compatibility forms are the plain letters),
    lower case, words split at spaces, ``_`` and ``-``, each word singular."""
    plain = unicodedata.normalize("NFKC", name)
    return " ".join(_singular(word) for word in _SEPARATORS.sub(" ", plain).strip().casefold().split(" "))


def _own_class_name(key: str) -> str:
    """The spelling of a class outside the vocabulary: its normal form with a capital first letter (every
    site that spells it some way gets the same name)."""
    return key[:1].upper() + key[1:]


def _builtin_lookup() -> dict[str, str]:
    lookup = {normal_form(name): name for name in BUILTIN_FINDINGS}
    if len(lookup) != len(BUILTIN_FINDINGS):
        raise AssertionError("two built-in findings share a normal form")
    for alias, target in ALIASES.items():
        lookup.setdefault(normal_form(alias), target)
    return lookup


_BUILTIN = _builtin_lookup()
_reported_outside: set[str] = set()  # names logged once per process as outside the vocabulary


class Vocabulary:
    """Canonical class names: the built-in findings and aliases, alias mappings added on top of them (a
    later mapping wins), and optionally a closed list of accepted classes.

    ``aliases`` are ``(mapping, origin)`` pairs, ``origin`` naming the file or setting for errors. An
    alias's target is itself canonicalised, so ``{"TB": "tuberculosis"}`` and ``{"TB": "Tuberculosis"}``
    mean the same; an alias must not lead back to itself.
    """

    def __init__(
        self,
        aliases: Sequence[tuple[Mapping[str, str], str]] = (),
        accepted: Sequence[str] | None = None,
        accepted_origin: str = "accepted classes",
    ) -> None:
        self._lookup = dict(_BUILTIN)
        self.aliases: dict[str, str] = {}  # the added mappings, alias -> canonical target
        for mapping, origin in aliases:
            self._add(mapping, origin)
        self.accepted: tuple[str, ...] | None = None
        if accepted is not None:
            if isinstance(accepted, str) or not accepted:
                raise UnknownLabelError(f"{accepted_origin}: must list at least one class name, got {accepted!r}")
            self.accepted = tuple(self.canonical_list(accepted, accepted_origin))

    def _add(self, mapping: Mapping[str, str], origin: str) -> None:
        if not isinstance(mapping, Mapping):
            raise AliasFileError(f"{origin}: must map each alias to a class name, got {type(mapping).__name__}")
        for alias, target in mapping.items():
            if not isinstance(alias, str) or not isinstance(target, str) or not alias.strip() or not target.strip():
                raise AliasFileError(f"{origin}: entry {alias!r}: {target!r}: both must be non-empty names")
        lookup = dict(self._lookup)
        for alias, target in mapping.items():
            lookup[normal_form(alias)] = lookup.get(normal_form(target)) or _own_class_name(normal_form(target))
        for key in lookup:  # follow chains ("A" -> "B" here, "B" -> "C" in a later mapping): one step to the end
            seen, name = {key}, lookup[key]
            while lookup.get(normal_form(name), name) != name:
                if normal_form(name) in seen:
                    raise AliasFileError(f"{origin}: the aliases of {name!r} lead back to it")
                seen.add(normal_form(name))
                name = lookup[normal_form(name)]
            lookup[key] = name
        self.aliases.update({alias: lookup[normal_form(alias)] for alias in mapping})
        self.aliases = {alias: lookup[normal_form(alias)] for alias in self.aliases}
        self._lookup = lookup

    def aliases_of(self, names: Iterable[str]) -> dict[str, list[str]]:
        """Each of ``names`` with the spellings this vocabulary reads as it (the built-in aliases and the added ones;
        case, separators and plurals need none), sorted; a name without one maps to an empty list."""
        spellings = {**ALIASES, **self.aliases}
        found: dict[str, list[str]] = {name: [] for name in names}
        for alias in spellings:
            target = self._lookup.get(normal_form(alias))
            if target in found and normal_form(alias) != normal_form(target):
                found[target].append(alias)
        return {name: sorted(set(aliases)) for name, aliases in found.items()}

    def findings(self) -> list[str]:
        """Every class this vocabulary reads a spelling as (the built-in findings and the aliases' targets), sorted."""
        return sorted(set(self._lookup.values()))

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a finding or a spelling of one in this vocabulary (else it is a class of its own)."""
        return isinstance(name, str) and normal_form(name) in self._lookup

    def canonical(self, name: str, where: str = "") -> str:
        """The canonical spelling of ``name``; ``where`` (a file, a site, a config field) goes into errors."""
        found, outside = self._find(name, where)
        if outside:
            self._report_outside({name: found}, where)
        return found

    def canonical_list(self, names: Iterable[str], where: str = "") -> list[str]:
        """Canonicalise a label list, keeping its order; two names of one class are an error naming both.
        Names outside the vocabulary are logged in one line."""
        result: dict[str, str] = {}
        outside: dict[str, str] = {}
        for name in names:
            canonical, new = self._find(name, where)
            if canonical in result:
                origin = f"{where}: " if where else ""
                raise DuplicateLabelError(
                    f"{origin}label {name!r} duplicates {result[canonical]!r}: both mean {canonical!r}"
                )
            result[canonical] = name
            if new:
                outside[name] = canonical
        self._report_outside(outside, where)
        return list(result)

    def renaming(self, names: Iterable[str], where: str = "") -> dict[str, str]:
        """Each of ``names`` (a dataset's own spellings, e.g. its label columns) -> the class it means here; two
        names of one class are an error naming both (:meth:`canonical_list`)."""
        names = list(names)
        return dict(zip(names, self.canonical_list(names, where), strict=True))

    def _find(self, name: str, where: str) -> tuple[str, bool]:
        """(the class ``name`` means, whether it is outside the vocabulary); refuses what a closed one does not
        accept."""
        origin = f"{where}: " if where else ""
        if not isinstance(name, str) or not name.strip():
            raise UnknownLabelError(f"{origin}label {name!r} is not a name")
        key = normal_form(name)
        found = self._lookup.get(key)
        outside = found is None
        if outside:
            found = _own_class_name(key)
        if self.accepted is not None and found not in self.accepted:
            raise UnknownLabelError(
                f"{origin}class {found!r} (from {name!r}) is not one of the job's accepted classes: "
                f"{', '.join(self.accepted)}"
            )
        return found, outside

    def _report_outside(self, outside: Mapping[str, str], where: str) -> None:
        """Log, once per process and class, the classes that are outside the vocabulary (with near misses)."""
        fresh = {name: found for name, found in outside.items() if found not in _reported_outside}
        if not fresh:
            return
        _reported_outside.update(fresh.values())
        origin = f"{where}: " if where else ""
        described = []
        for name, found in fresh.items():
            close = difflib.get_close_matches(normal_form(name), list(self._lookup), n=2, cutoff=0.85)
            hint = f" (close to {[self._lookup[k] for k in close]}: a misspelling? add an alias)" if close else ""
            described.append(f"{name!r} -> the class {found!r}{hint}" if name != found else f"{found!r}{hint}")
        if len(described) == 1:
            logger.info("%slabel %s is outside the built-in vocabulary: a class of its own", origin, described[0])
        else:
            logger.info(
                "%s%d labels are outside the built-in vocabulary, each a class of its own: %s",
                origin,
                len(described),
                "; ".join(described),
            )


BUILTIN_VOCABULARY = Vocabulary()


def read_alias_file(path: str | Path) -> dict[str, str]:
    """An alias file: a JSON or YAML mapping ``{"alias": "class name", ...}``; errors name the file and entry."""
    path = Path(path)
    if not path.is_file():
        raise AliasFileError(f"alias file not found: {path}")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml  # installed with FLARE; only alias files in YAML need it

        try:
            mapping = yaml.load(text, Loader=_yaml_loader_without_repeats(yaml, path))
        except yaml.YAMLError as error:
            raise AliasFileError(f"{path}: not a JSON/YAML mapping: {error}") from None
    else:
        try:  # a repeated entry raises AliasFileError from the hook, naming the entry
            mapping = json.loads(text, object_pairs_hook=lambda pairs: _no_repeats(pairs, path))
        except json.JSONDecodeError as error:
            raise AliasFileError(f"{path}: not a JSON/YAML mapping: {error}") from None
    if not isinstance(mapping, dict):
        raise AliasFileError(f"{path}: must map each alias to a class name, got {type(mapping).__name__}")
    Vocabulary([(mapping, str(path))])  # validates every entry
    return mapping


def job_vocabulary(
    aliases: Mapping[str, str] | None = None, accepted_classes: Sequence[str] | None = None
) -> Vocabulary:
    """A job's vocabulary as its server reads class names: the built-in one, the job's aliases, its accepted
    classes (none: open)."""
    return Vocabulary([(aliases or {}, "the job's label_aliases")], accepted_classes, "the job's accepted_classes")


def label_aliases(source: Mapping[str, str] | str | Path | None) -> dict[str, str]:
    """Aliases as a job or a site gives them: a mapping (checked), an alias file's path (read), or none."""
    if source is None:
        return {}
    if isinstance(source, (str, Path)):
        return read_alias_file(source)
    Vocabulary([(source, "label aliases")])  # validates every entry
    return dict(source)


def _yaml_loader_without_repeats(yaml, path: Path):
    """YAML's safe loader, refusing a mapping that names a key twice (YAML itself keeps the last silently)."""

    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader, node):
        pairs = [(loader.construct_object(key), loader.construct_object(value)) for key, value in node.value]
        return _no_repeats(pairs, path)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return Loader


def _no_repeats(pairs: list[tuple[str, object]], path: Path) -> dict:
    seen: dict[str, object] = {}
    for key, value in pairs:
        if key in seen and seen[key] != value:
            raise AliasFileError(f"{path}: entry {key!r} appears twice, mapped to {seen[key]!r} and {value!r}")
        seen[key] = value
    return seen


# Each dataset's findings in the order of its own label file ("No Finding" dropped, as in
# the papers), in canonical spelling.
NIH_LABELS: tuple[str, ...] = tuple(BUILTIN_VOCABULARY.canonical(raw) for raw in NIH_RAW_LABELS)
CHEXPERT_LABELS: tuple[str, ...] = (
    "Enlarged Cardiomediastinum",
    "Cardiomegaly",
    "Lung Opacity",
    "Lung Lesion",
    "Edema",
    "Consolidation",
    "Pneumonia",
    "Atelectasis",
    "Pneumothorax",
    "Pleural Effusion",
    "Pleural Other",
    "Fracture",
    "Support Devices",
)
# MIMIC-CXR-JPG labels come from the CheXpert labeler: same 13 findings, same columns.
MIMIC_LABELS: tuple[str, ...] = CHEXPERT_LABELS
CXR_LT_LABELS: tuple[str, ...] = tuple(name for name in CANONICAL_FINDINGS if name != NO_FINDING)

DATASET_LABELS: dict[str, tuple[str, ...]] = {
    "nih": NIH_LABELS,
    "chexpert": CHEXPERT_LABELS,
    "mimic": MIMIC_LABELS,
    "cxr-lt": CXR_LT_LABELS,
}


def dataset_labels(dataset: str) -> tuple[str, ...]:
    """The canonical label list of a known dataset kind ("nih", "chexpert", "mimic", "cxr-lt")."""
    try:
        return DATASET_LABELS[dataset.lower()]
    except KeyError:
        raise ValueError(f"unknown dataset kind {dataset!r}; known: {', '.join(DATASET_LABELS)}") from None


def union_labels(*label_lists: Sequence[str], vocabulary: Vocabulary = BUILTIN_VOCABULARY) -> list[str]:
    """Union of label lists in order of first appearance (the order surgical aggregation uses), each name read
    through ``vocabulary``."""
    union: list[str] = []
    for labels in label_lists:
        for name in labels:
            canonical = vocabulary.canonical(name)
            if canonical not in union:
                union.append(canonical)
    return union
