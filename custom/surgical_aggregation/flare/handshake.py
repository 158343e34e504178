"""The handshake: what each site says of itself, read and checked before it joins the federation.

A site reports its class names (in its own spelling and order), the size of its training set, a one-line
description of its data and its preprocessing (and, for FedSLD, per-class counts). Each reply goes through
the server's handshake checks (:mod:`surgical_aggregation.core.checks`); a site that fails one is left out
with one reason, and the job goes on with the others when ``min_clients`` allows. No FLARE here: the
controller sends the task and hands the replies' meta to :func:`read_site`; a site builds its reply with
:func:`site_handshake`, and ``check-site`` runs both sides before a federation does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.checks.handshake import (
    class_count_problem,
    class_name_problem,
    confusable_problems,
    declared_samples_problem,
    label_counts_problem,
    preprocessing_problem,
    vocabulary_problem,
)
from ..core.labels import BUILTIN_FINDINGS, Vocabulary
from ..core.methods import LabelCounts
from ..data.table import LabelTable
from ..training.config import SiteConfig
from ..training.site_data import split_table
from .protocol import (
    META_CLASS_NAMES,
    META_DATA,
    META_LABEL_COUNTS,
    META_NUM_SAMPLES,
    META_PREPROCESSING,
    META_VALIDATION_SIZE,
)

MAX_DATA_DESCRIPTION = 200  # characters of a site's one-line description of its data kept by the server


def site_handshake(config: SiteConfig, table: LabelTable, with_label_counts: bool = False) -> dict[str, Any]:
    """What a site answers at the handshake (the meta of its ``describe`` result): its class names in its own order,
    its training-set size, one line on its data, its preprocessing; per-class training counts only when asked
    (FedSLD shares them by design)."""
    splits = split_table(table, config)
    train = splits["train"]
    meta = {
        META_CLASS_NAMES: list(table.classes),
        META_NUM_SAMPLES: len(train),
        META_VALIDATION_SIZE: len(splits["val"]),
        META_DATA: config.modality.describe(config, table),
        META_PREPROCESSING: config.modality.preprocessing(config),
    }
    if with_label_counts:
        meta[META_LABEL_COUNTS] = {
            name: [int((train.frame[name] == 1).sum()), int(train.frame[name].notna().sum())] for name in table.classes
        }
    return meta


class HandshakeRefused(ValueError):
    """Why a site is left out of the federation at the handshake (told in the server's log)."""


@dataclass
class SiteInfo:
    classes: list[str]  # canonical names
    reported: list[str]  # the site's own spelling and order, echoed back to it
    num_samples: int  # its training-set size, as declared
    data: str
    preprocessing: dict[str, Any]
    label_counts: dict[str, LabelCounts] = field(default_factory=dict)  # FedSLD only
    validation_size: int | None = None  # the validation images it declared (None: not said)


@dataclass(frozen=True)
class HandshakeRules:
    """What the job accepts at the handshake."""

    vocabulary: Vocabulary
    max_classes: int
    max_name_length: int
    label_prior: bool = False


def read_site(site: str, meta: Mapping[str, Any], rules: HandshakeRules) -> SiteInfo:
    """A site's reply, checked; raises :class:`HandshakeRefused` with the first reason it fails."""
    names = meta.get(META_CLASS_NAMES)
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise HandshakeRefused(f"site {site} reported no list of class names")
    if problem := class_count_problem(site, names, rules.max_classes):
        raise HandshakeRefused(problem)
    for name in names:
        if problem := class_name_problem(name, rules.max_name_length):
            raise HandshakeRefused(f"site {site}: {problem}")
    reported = list(names)
    classes, problem = vocabulary_problem(reported, rules.vocabulary, f"site {site}'s class names")
    if problem:
        raise HandshakeRefused(problem)
    samples = meta.get(META_NUM_SAMPLES, 0)
    if problem := declared_samples_problem(site, samples):
        raise HandshakeRefused(problem)
    counts = (
        _label_counts(site, reported, meta.get(META_LABEL_COUNTS), int(samples), rules) if rules.label_prior else {}
    )
    preprocessing = meta.get(META_PREPROCESSING) or {}
    if not isinstance(preprocessing, Mapping):
        raise HandshakeRefused(
            f"site {site} described its preprocessing as {type(preprocessing).__name__}, not a mapping"
        )
    description = str(meta.get(META_DATA, ""))
    if len(description) > MAX_DATA_DESCRIPTION or not description.isprintable():
        description = "".join(c for c in description[:MAX_DATA_DESCRIPTION] if c.isprintable()) + " [cut]"
    size = meta.get(META_VALIDATION_SIZE)
    size = int(size) if isinstance(size, (int, float)) and not isinstance(size, bool) and 0 < size < 1e9 else None
    return SiteInfo(classes, reported, int(samples), description, dict(preprocessing), counts, size)


def _label_counts(
    site: str, reported: list[str], counts: Any, samples: int, rules: HandshakeRules
) -> dict[str, LabelCounts]:
    """FedSLD: the site's per-class training counts, by canonical name."""
    checked, problem = label_counts_problem(reported, counts, samples)
    if problem:
        raise HandshakeRefused(f"site {site}: {problem}")
    return {rules.vocabulary.canonical(name): LabelCounts(*pair) for name, pair in checked.items()}


def refuse_look_alikes(sites: Mapping[str, SiteInfo], existing: Sequence[str]) -> dict[str, str]:
    """Site -> reason, for sites bringing a class that looks like another class of the federation (the model's
    classes, the built-in findings, or an earlier site's in name order)."""
    known = [*existing, *BUILTIN_FINDINGS]
    refused = {}
    for site, info in sorted(sites.items()):
        new = {name: spelling for name, spelling in zip(info.classes, info.reported, strict=True) if name not in known}
        problems = confusable_problems(new, known)
        if problems:
            refused[site] = f"site {site}: {problems[0]}"
        else:
            known.extend(new)
    return refused


def refuse_other_preprocessing(sites: Mapping[str, SiteInfo], federation: Mapping[str, Any]) -> dict[str, str]:
    """Site -> reason, for sites whose preprocessing is not the federation's."""
    refused = {}
    for site, info in sites.items():
        if problem := preprocessing_problem(info.preprocessing, federation):
            refused[site] = problem
    return refused


@dataclass
class Admission:
    """Who takes part after the handshake, and why the others do not (each is told)."""

    sites: dict[str, SiteInfo]  # admitted, in name order
    unreadable: dict[str, str]  # site -> why its answer could not be read or broke a rule
    refused: dict[str, str]  # site -> why it is refused beside the others (look-alike classes, preprocessing)
    preprocessing: dict[str, Any]  # the federation's


def admit(
    answers: Mapping[str, Mapping[str, Any]],
    rules: HandshakeRules,
    preprocessing: Mapping[str, Any] | None,
    existing_classes: Sequence[str],
) -> Admission:
    """The handshake's checks on every site's answer (site -> its meta): each read on its own (:func:`read_site`),
    then against the others and ``existing_classes`` (the model's): look-alike classes, and a preprocessing other
    than ``preprocessing`` (None: the first admitted site's, in name order)."""
    sites: dict[str, SiteInfo] = {}
    unreadable: dict[str, str] = {}
    for site, meta in answers.items():
        try:
            sites[site] = read_site(site, meta, rules)
        except HandshakeRefused as refusal:
            unreadable[site] = str(refusal)
    sites = dict(sorted(sites.items()))
    federation = dict(preprocessing or (next(iter(sites.values())).preprocessing if sites else {}))
    refused = {**refuse_look_alikes(sites, existing_classes), **refuse_other_preprocessing(sites, federation)}
    for site in refused:
        sites.pop(site, None)
    return Admission(sites, unreadable, dict(sorted(refused.items())), federation)
