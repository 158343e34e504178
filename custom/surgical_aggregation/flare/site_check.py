"""``check-site``: a site config checked against the job it will run, before any federation does.

Both sides of the handshake, without FLARE: the site's config is read as the site would read it (the job's label
aliases under its own), its data is loaded and split, its reply is built as the site builds it, and the server's
handshake checks read that reply with the job's settings (vocabulary, accepted classes, limits, the federation's
preprocessing). Then every input of every split is read (images decoded at the job's size; ``--sample N`` reads the
first N of each split) and whatever cannot be read is listed, one line each. Everything the check finds is a line;
a problem is a line that names the field or file and the value to write.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..core.checks.handshake import DEFAULT_MAX_CLASS_NAME_LENGTH, DEFAULT_MAX_CLASSES_PER_SITE
from ..core.devices import resolve_device
from ..core.errors import SiteConfigError, UserError
from ..core.labels import BUILTIN_VOCABULARY, job_vocabulary
from ..core.methods import method_from_meta
from ..data.table import PATIENT_COLUMN
from ..training.config import load_site_config
from ..training.parallel import check_gpus
from ..training.privacy import refuse_made_up_patients, refuse_what_dp_sgd_cannot_bound, sampling_groups
from ..training.site_data import data_warnings, resolve_table, split_table
from .handshake import (
    HandshakeRefused,
    HandshakeRules,
    read_site,
    refuse_look_alikes,
    refuse_other_preprocessing,
    site_handshake,
)
from .job_folder import controller_settings, job_label_aliases, job_sites


@dataclass
class SiteCheck:
    """What ``check-site`` found: every line it says, and the problems among them."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def problem(self, text: str) -> None:
        self.problems.append(text)
        self.lines.append(f"PROBLEM: {text}")


def check_site(
    job: str | Path, config_path: str | Path, site: str | None = None, sample: int | None = None
) -> SiteCheck:
    """Check the site config at ``config_path`` against the job folder ``job`` (``site``: the site's name in it),
    reading every input of its splits, or the first ``sample`` of each."""
    job, config_path = Path(job), Path(config_path)
    result = SiteCheck()
    settings = controller_settings(job)
    sites = job_sites(job)
    name = site or (sites[0] if len(sites) == 1 else "this site")
    quiet = logging.getLogger("surgical_aggregation.check_site")
    try:
        config = load_site_config(config_path, job_label_aliases(job))  # as the site reads it for this job
        check_gpus(config.gpus, resolve_device(config.device), config.device, str(config_path.resolve()))
        result.lines.append(f"site config {config_path.resolve()}: every field is valid")
        table = resolve_table(config, quiet)
        splits = split_table(table, config)
        meta = site_handshake(config, table, bool(settings.get("label_prior")))
    except UserError as error:
        result.problem(str(error))
        return result
    counts = ", ".join(f"{split} {len(part)}" for split, part in splits.items())
    result.lines.append(f"data: {config.modality.describe(config, table)}; patient-level splits: {counts}")
    _check_handshake(result, name, meta, settings)
    _check_private_training(result, config, settings, splits["train"])
    _check_sample(result, config, splits, sample)
    result.lines.extend(f"warning: {line}" for line in data_warnings(table, splits, "data"))
    verdict = "passes" if result.passed else "would be refused at"
    result.lines.append(f"{name} {verdict} the handshake of job {job.name!r} ({job.resolve()})")
    return result


def _check_private_training(result: SiteCheck, config, settings: dict, train) -> None:
    """A site with DP-SGD on: whether the job's method lets it bound what each patient (or image) contributes, and
    whether its delta is below 1 / the units of its training split."""
    privacy = config.differential_privacy
    if not privacy.enabled:
        return
    method = method_from_meta(settings)  # the job's method, as the server sends it with every training task
    model = config.modality.build_model(["a class"], config.modality.preprocessing(config))
    patients = train.frame[PATIENT_COLUMN].astype(str).tolist()
    try:
        refuse_what_dp_sgd_cannot_bound(model, method, config.gpus, config.compile, "this site")
        refuse_made_up_patients(train, privacy, "this site")
        units = len(sampling_groups(patients, len(train), privacy.unit, "this site"))  # as the trainer samples them
        delta = privacy.resolved_delta(units, "this site")
    except SiteConfigError as error:
        result.problem(str(error))
        return
    noise = f"noise multiplier {privacy.noise_multiplier}" if privacy.noise_multiplier else (
        f"noise chosen for {privacy.planned_rounds} rounds"
    )  # fmt: skip
    result.lines.append(
        f"differential privacy: budget epsilon {privacy.epsilon} per {privacy.unit} at delta {delta:.3g}, {noise}"
    )


def _check_handshake(result: SiteCheck, site: str, meta: dict, settings: dict) -> None:
    """The server's handshake checks on the site's reply, with the job's settings."""
    rules = HandshakeRules(
        job_vocabulary(settings.get("label_aliases"), settings.get("accepted_classes")),
        settings.get("max_classes_per_site", DEFAULT_MAX_CLASSES_PER_SITE),
        settings.get("max_class_name_length", DEFAULT_MAX_CLASS_NAME_LENGTH),
        bool(settings.get("label_prior")),
    )
    try:
        info = read_site(site, meta, rules)
    except HandshakeRefused as refusal:
        result.problem(f"the server would refuse the site: {refusal}")
        return
    classes = [
        f"{name} (from {spelling!r})" if name != spelling else name
        for name, spelling in zip(info.classes, info.reported, strict=True)
    ]
    result.lines.append(f"labels, as the server reads them: {len(classes)} classes: {', '.join(classes)}")
    new = [name for name in info.classes if not BUILTIN_VOCABULARY.knows(name)]
    if new:
        result.lines.append(f"new to the built-in vocabulary (each joins as a class of its own): {', '.join(new)}")
    preprocessing = settings.get("preprocessing") or {}
    if preprocessing:
        for problem in refuse_other_preprocessing({site: info}, preprocessing).values():
            result.problem(f"the server would refuse the site: {problem}")
        if not result.problems:
            shown = ", ".join(f"{key} {json.dumps(value)}" for key, value in preprocessing.items())
            result.lines.append(f"preprocessing: {shown}, the federation's")
    for problem in refuse_look_alikes({site: info}, []).values():
        result.problem(f"the server would refuse the site: {problem}")


def _check_sample(result: SiteCheck, config, splits: dict, sample: int | None) -> None:
    """Read every input of every split as training will (images decoded at the job's size), or the first
    ``sample`` of each; each one that cannot be read is a line."""
    read, failures = [], []
    for split, table in splits.items():
        found = config.modality.read_sample(table, config, sample)
        count = len(table) if sample is None else min(sample, len(table))
        read.append(f"{split} {count - len(found)} of {count}")
        failures += found
    how = "every input read" if sample is None else f"the first {sample} inputs of each split read (--sample)"
    result.lines.append(f"{how} as training reads it: {', '.join(read)}")
    stops, consequence = config.modality.unreadable_policy(config)  # else they are left out, and the site says so
    for row, reason in failures:
        text = f"unreadable: {row}: {reason} ({consequence})"
        if stops:
            result.problem(text)
        else:
            result.lines.append(text)
