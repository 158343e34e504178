"""Differential privacy at a site: DP-SGD (Opacus) over its local training, and the budget it spends.

A site's config may turn it on (``differential_privacy``: its own budget, set by hospital IT, not by the job). The
unit it protects is a **patient** by default: every training step draws its batch by Poisson sampling over the
training split's patients (each independently, with probability ``batch_size / patients``) and takes one of each
sampled patient's images (at random), so a patient adds at most one clipped gradient to a step; ``unit: "image"``
samples images instead (a patient with several images is then protected less than the epsilon printed). Each
sampled item's gradient is clipped to ``max_grad_norm`` and Gaussian noise of standard deviation
``noise_multiplier * max_grad_norm`` is added to their sum: the sampled Gaussian mechanism Opacus's accountants
account for. The per-item loss is normalised by that item's own labelled entries, never by the batch's (which would
couple one item's gradient to the others').

The noise and the sampling draw from :class:`SecureRandom` (ChaCha20 keyed from the operating system's entropy),
never from the config's ``seed``: knowing the code and the config does not replay them. The noise is Opacus's
``secure_mode`` construction (the sum of four Gaussians halved, against floating-point attacks).

The :class:`LedgerFile` keeps every step at the site (``<site workspace>/local/privacy_ledger.json``), across jobs,
resumed runs and continued federations, keyed by the site and a fingerprint of its training patients; the steps of a
round are written there (atomically) before the round trains, so before its update leaves. A round that would take
the site over its budget is not trained and nothing is sent. An unreadable ledger, or one behind the steps an
earlier job of this site recorded, is refused, never reset.

What the guarantee covers: the model updates the site sends (backbone and head rows), as functions of its training
split, at (epsilon, delta) per patient (or per image), for the steps counted. Nothing else computed on the training
split leaves the site: under DP it sends no training loss and tracks no training-loss curve. It does not cover the
validation metrics the site reports (computed on its validation split, other patients), its class names and counts
sent at the handshake, or a BatchNorm that learns from batch statistics (refused: only FedBN+'s frozen BatchNorm is
allowed).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, Sampler

from ..core.errors import PrivacyLedgerError, SiteConfigError
from ..core.methods import SiteMethod

ACCOUNTANTS = ("rdp", "prv")  # Opacus's Renyi-DP accountant, and its privacy-random-variable one (tighter)
UNITS = ("patient", "image")  # what one neighbouring dataset adds or removes: a patient's images, or one image
# The budgets a site may set: below 0.2 the RDP accountant cannot certify any noise at delta 1e-5 (its floor is
# ~0.1 at noise 1000); above 100 an epsilon promises nothing a reader would recognise as privacy.
EPSILON_RANGE = (0.2, 100.0)
NOISE_MULTIPLIER_RANGE = (0.1, 1000.0)  # below 0.1 one step of any sampling spends epsilon ~90
PRIOR_PREVALENCE_RANGE = (0.001, 0.5)
VALIDATION_RELEASES = ("loss", "full")
# a DP site's validation by default: each image's loss at most this (a confident miss of one finding costs ~16), the
# mean over n images and its standard error rounded to 3 decimals: one patient with m images moves the mean by at
# most VALIDATION_LOSS_CLIP * m / n
VALIDATION_LOSS_CLIP = 2.0
VALIDATION_DECIMALS = 3
DELTA_UNITS_FACTOR = 10  # delta at most 1 / (10 N) for N protected units (patients or images)
NOISE_SEARCH_STEPS = 40  # bisections of the noise for a budget: ~1e-12 of the range, then it stops
LEDGER_FILE = "privacy_ledger.json"  # in the site workspace's local/ folder, beside the site's config
SPENT_FILE = "privacy_spent.json"  # in each job's app folder: the steps it recorded, checked against the ledger
LEDGER_FORMAT = "surgical-aggregation privacy ledger 2"
LEDGER_ENTRY_FIELDS = ("site", "fingerprint", "unit", "accountant", "delta", "history", "patients", "images")
# what a job's record holds a digest of: every field that decides the epsilon an entry's steps spend
DIGESTED_FIELDS = ("site", "fingerprint", "unit", "accountant", "delta")


@dataclass
class DifferentialPrivacy:
    """A site's DP-SGD settings (``differential_privacy`` in its config); off while ``epsilon`` is null.

    ``epsilon``: the site's whole budget over every federation it trains in, at ``delta``, per ``unit`` (a patient
    or an image). The noise is ``noise_multiplier``, or (null) the smallest that keeps ``planned_rounds`` rounds of
    this site's local training within the budget.

    ``prior_prevalence``: at the site's first round, its head rows' biases are set to this prevalence's logit
    (:func:`prior_logit`). Without it, the largest part of every item's gradient says "lower every output" (the
    labels are mostly 0), and under noise only that part comes through: taken through the weights on the pooled
    features (non-negative), it lowers most the outputs of the images with the most signal, the positives, and the
    model ranks below chance while its loss falls (``docs/privacy-utility``). A public constant, so the biases
    reveal nothing about the site's counts.
    """

    epsilon: float | None = None
    delta: float | None = None  # None: 1 / (10 x the units the training split protects), as the field advises
    max_grad_norm: float = 1.0
    noise_multiplier: float | None = None
    planned_rounds: int | None = None
    accountant: str = "rdp"
    unit: str = "patient"
    # the prevalence this site's head rows' biases start from at its first round: public, not its label counts
    prior_prevalence: float = 0.05
    # what its validation sends the server: "loss" (the default: only the mean validation loss and its standard error,
    # each image's loss clipped and the figures rounded: no per-class figure, no count), or "full" (everything a site
    # without DP sends: per-class AUROCs, paired figures, the validation set's size; the site's validation patients
    # are not protected by DP-SGD, which covers its training patients)
    release_validation: str = "loss"

    @property
    def enabled(self) -> bool:
        return self.epsilon is not None

    @property
    def withholds_validation(self) -> bool:
        """Its validation sends only the clipped, rounded mean loss and its standard error (no count, no class)."""
        return self.enabled and self.release_validation == "loss"

    def check(self, where: str) -> None:
        """Refuse settings DP-SGD could not use; the error names ``where`` and the field. A block that sets any DP
        field but gives no ``epsilon`` is refused too: it would train without DP, silently."""

        def fail(name: str, message: str) -> SiteConfigError:
            return SiteConfigError(f"{where}: differential_privacy.{name} {message}")

        if not self.enabled:
            defaults = DifferentialPrivacy()
            named = [
                name for name in vars(self) if name != "epsilon" and getattr(self, name) != getattr(defaults, name)
            ]
            if named:
                raise fail(
                    "epsilon",
                    f"is null, so DP-SGD is off, but the block sets {named}: give epsilon (the budget) to train with "
                    "DP-SGD, or remove those fields (or the whole block) to train without it",
                )
            return

        low, high = EPSILON_RANGE
        if not low <= self.epsilon <= high:  # NaN fails too
            raise fail("epsilon", f"must be a number from {low} to {high}, got {self.epsilon}")
        if self.delta is not None and not 0 < self.delta < 1:
            raise fail("delta", f"must be between 0 and 1 (at most 1 / (10 x the site's patients)), got {self.delta}")
        if not 0 < self.max_grad_norm < math.inf:
            raise fail("max_grad_norm", f"must be a finite positive number, got {self.max_grad_norm}")
        if self.accountant not in ACCOUNTANTS:
            raise fail("accountant", f"must be one of {list(ACCOUNTANTS)}, got {self.accountant!r}")
        if self.unit not in UNITS:
            raise fail("unit", f"must be one of {list(UNITS)}, got {self.unit!r}")
        if self.release_validation not in VALIDATION_RELEASES:
            raise fail(
                "release_validation", f"must be one of {list(VALIDATION_RELEASES)}, got {self.release_validation!r}"
            )
        low, high = PRIOR_PREVALENCE_RANGE
        if not low <= self.prior_prevalence <= high:
            raise fail("prior_prevalence", f"must be a number from {low} to {high}, got {self.prior_prevalence}")
        if (self.noise_multiplier is None) == (self.planned_rounds is None):
            raise fail(
                "noise_multiplier",
                "or planned_rounds: give exactly one (the noise, or the rounds the budget is spread over)",
            )
        low, high = NOISE_MULTIPLIER_RANGE
        if self.noise_multiplier is not None and not low <= self.noise_multiplier <= high:
            raise fail("noise_multiplier", f"must be a number from {low} to {high}, got {self.noise_multiplier}")
        if self.planned_rounds is not None and self.planned_rounds < 1:
            raise fail("planned_rounds", f"must be at least 1, got {self.planned_rounds}")

    def resolved_delta(self, units: int, where: str) -> float:
        """The delta of this site's budget: the one given, which must be at most 1 / (10 x the units the training
        split protects: patients, or images; a delta of 1 / N allows a mechanism that publishes one of them outright),
        or that bound when none is given."""
        bound = 1 / (DELTA_UNITS_FACTOR * max(units, 1))
        if self.delta is None:
            return bound
        if self.delta > bound:
            raise SiteConfigError(
                f"{where}: differential_privacy.delta must be at most 1 / ({DELTA_UNITS_FACTOR} x the training split's "
                f"{units} {self.unit}s) = {bound:.3g}, got {self.delta}; leave it out to use that bound"
            )
        return self.delta


def released_validation(evaluation: Any, settings: DifferentialPrivacy) -> dict[str, float] | None:
    """What a DP site's validation sends (``release_validation: "loss"``): the mean of each image's loss clipped to
    :data:`VALIDATION_LOSS_CLIP` and its standard error, rounded to :data:`VALIDATION_DECIMALS` decimals; None for a
    site that releases everything (no DP, or ``"full"``)."""
    if not settings.withholds_validation:
        return None
    losses = getattr(evaluation, "image_losses", None)
    if losses is None:
        return {}
    losses = np.clip(np.asarray(losses, dtype=np.float64), 0.0, VALIDATION_LOSS_CLIP)
    losses = losses[np.isfinite(losses)]
    if losses.size < 2:
        return {}
    mean, error = float(losses.mean()), float(losses.std(ddof=1) / math.sqrt(losses.size))
    return {"val_loss": round(mean, VALIDATION_DECIMALS), "val_loss_se": round(error, VALIDATION_DECIMALS)}


def prior_logit(prevalence: float) -> float:
    """The output bias at which a model with no other signal predicts ``prevalence``."""
    return math.log(prevalence / (1.0 - prevalence))


def refuse_what_dp_sgd_cannot_bound(
    model: nn.Module, site_method: SiteMethod, gpus: int, compile_mode: str, where: str
) -> None:
    """What DP-SGD cannot be combined with, each refused with the setting that fixes it (the trainer before it
    trains, ``check-site`` before a federation runs)."""
    where = f"{where}: differential_privacy"
    learns_batch_statistics = not site_method.freezes_batchnorm and any(
        isinstance(module, nn.modules.batchnorm._BatchNorm) for module in model.modules()
    )
    if learns_batch_statistics:
        raise SiteConfigError(
            f"{where} needs BatchNorm that does not learn from batch statistics (a batch's statistics mix its "
            f"images, which per-image clipping cannot bound), but the job's backbone strategy "
            f"{site_method.backbone_strategy!r} trains BatchNorm: run the job with backbone_strategy 'fedbn_plus' "
            "(BatchNorm frozen and in eval mode; only the rest trains)"
        )
    if site_method.proximal_mu > 0:
        raise SiteConfigError(f"{where} cannot bound FedProx's proximal term per image: run without proximal_mu")
    if site_method.label_prior:
        raise SiteConfigError(
            f"{where} cannot be combined with FedSLD: its loss weights come from every site's label counts, shared "
            "un-noised at the handshake; run a method without label_prior"
        )
    if gpus > 1:
        raise SiteConfigError(f"{where} trains on one process: set gpus to 1")
    if compile_mode == "on":
        raise SiteConfigError(f"{where} needs the model uncompiled: set compile to off")


def _accountant(kind: str, history: Sequence[tuple[float, float, int]]):
    from opacus.accountants import PRVAccountant, RDPAccountant

    accountant = RDPAccountant() if kind == "rdp" else PRVAccountant()
    accountant.history = [tuple(entry) for entry in history]
    return accountant


@functools.lru_cache(maxsize=4096)
def _rdp_of_one_step(noise_multiplier: float, sample_rate: float) -> np.ndarray:
    """Opacus's RDP of one sampled Gaussian step at its accountant's default orders (a pure function of its
    arguments, and the slow part of every epsilon: a site's noise search and each round's report ask again)."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp

    orders = RDPAccountant.DEFAULT_ALPHAS
    one_step = rdp.compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=orders)
    one_step.setflags(write=False)  # shared by every later call: never changed in place
    return one_step


def _rdp_epsilon(history: Sequence[tuple[float, float, int]], delta: float) -> float:
    """``RDPAccountant.get_epsilon`` of ``history``, the same operations in the same order (each entry's RDP is
    its one step's times its steps, as Opacus's ``compute_rdp`` returns it), the one-step RDP computed once."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp

    # float(): equal keys of another type (a float32 rate) would share a cache entry computed at another precision
    total = sum([_rdp_of_one_step(float(noise), float(rate)) * steps for noise, rate, steps in history])
    epsilon, _ = rdp.get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS, rdp=total, delta=delta)
    return float(epsilon)


Steps = tuple[float, float, int]  # (noise multiplier, sample rate, steps), as Opacus's accountants keep them


@dataclass
class PrivacyLedger:
    """Every DP-SGD step taken on this site's training data: its own ``history``, and the ``inherited`` steps of
    earlier training data that shares patients with it (counted, never written back); the epsilon they spend at
    ``delta``."""

    accountant: str = "rdp"
    history: list[Steps] = field(default_factory=list)
    noise_multiplier: float | None = None  # chosen once (from the budget), kept for every later round
    inherited: list[Steps] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return sum(steps for _, _, steps in self.history)

    def epsilon(self, delta: float, planned: Sequence[Steps] = ()) -> float:
        """The epsilon spent at ``delta`` (0 before any step), with ``planned`` steps added when given."""
        history = [*self.inherited, *self.history, *planned]
        if not history:
            return 0.0
        if self.accountant == "rdp":
            return _rdp_epsilon(history, delta)
        return float(_accountant(self.accountant, history).get_epsilon(delta))

    def record(self, noise_multiplier: float, sample_rate: float, steps: int) -> None:
        """Append the steps: the history only grows (each job's record holds a digest of what it saw of it)."""
        if steps > 0:
            self.history.append((noise_multiplier, sample_rate, steps))

    def to_dict(self) -> dict[str, Any]:
        return {
            "accountant": self.accountant,
            "history": [list(entry) for entry in self.history],
            "noise_multiplier": self.noise_multiplier,
        }

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None, accountant: str) -> PrivacyLedger:
        if not values:
            return cls(accountant)
        if values.get("accountant", accountant) != accountant:
            raise SiteConfigError(
                f"differential_privacy.accountant is {accountant!r}, but this site's steps so far were accounted with "
                f"{values['accountant']!r}: keep the accountant for the whole federation"
            )
        history = [(float(noise), float(rate), int(steps)) for noise, rate, steps in values.get("history", [])]
        return cls(accountant, history, values.get("noise_multiplier"))


def noise_for_budget(settings: DifferentialPrivacy, sample_rate: float, steps: int, delta: float) -> float:
    """The smallest noise multiplier (within NOISE_MULTIPLIER_RANGE, to ~1e-12 of it) that keeps ``steps`` steps at
    ``sample_rate`` within the budget: a bisection of bounded length."""
    low, high = NOISE_MULTIPLIER_RANGE

    def spent(noise: float) -> float:
        return PrivacyLedger(settings.accountant, [(noise, sample_rate, steps)]).epsilon(delta)

    if spent(high) > settings.epsilon:
        raise SiteConfigError(
            f"differential_privacy.epsilon {settings.epsilon} cannot cover {steps} steps at sample rate "
            f"{sample_rate:.4g} (delta {delta:.3g}) even at noise multiplier {high}: raise epsilon, or lower "
            "planned_rounds, local_epochs or the steps per epoch"
        )
    if spent(low) <= settings.epsilon:
        return low
    for _ in range(NOISE_SEARCH_STEPS):
        middle = (low + high) / 2
        low, high = (low, middle) if spent(middle) <= settings.epsilon else (middle, high)
    return high


class SecureRandom:
    """Uniform and Gaussian draws from a cryptographically secure stream: ChaCha20 keyed from the operating system's
    entropy (``os.urandom``), re-keyed every GiB. No seed reaches it: two runs of one config draw differently."""

    REKEY_BYTES = 1 << 30
    CHUNK_BYTES = 1 << 26

    def __init__(self) -> None:
        self._rekey()

    def _rekey(self) -> None:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

        nonce = bytes(4) + os.urandom(12)  # RFC 7539: a 32-bit block counter from 0, then a 96-bit nonce
        self._stream = Cipher(algorithms.ChaCha20(os.urandom(32), nonce), mode=None).encryptor()
        self._left = self.REKEY_BYTES

    def _words(self, count: int) -> np.ndarray:
        parts = []
        for start in range(0, count * 8, self.CHUNK_BYTES):
            size = min(self.CHUNK_BYTES, count * 8 - start)
            if size > self._left:
                self._rekey()
            self._left -= size
            parts.append(np.frombuffer(self._stream.update(bytes(size)), dtype=np.uint64))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)

    def uniform(self, count: int) -> np.ndarray:
        """``count`` float64 draws, uniform on (0, 1): 52 random bits each, centred in their cell, so every value is
        exact and never 0 or 1."""
        return ((self._words(count) >> np.uint64(12)).astype(np.float64) + 0.5) * 2.0**-52

    def standard_normal(self, count: int) -> np.ndarray:
        """``count`` float64 draws of N(0, 1), by the Box-Muller transform."""
        pairs = (count + 1) // 2
        radius = np.sqrt(-2.0 * np.log(self.uniform(pairs)))
        angle = 2.0 * np.pi * self.uniform(pairs)
        return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:count]

    def noise(self, reference: torch.Tensor, std: float) -> torch.Tensor:
        """Gaussian noise of ``std`` shaped, typed and placed like ``reference``: Opacus's ``secure_mode``
        construction, the sum of four draws halved (arXiv:2107.10138, section 5.1)."""
        count = reference.numel()
        draws = self.standard_normal(4 * count).reshape(4, count).sum(axis=0) / 2.0
        noise = torch.from_numpy(draws * std).reshape(reference.shape)
        return noise.to(device=reference.device, dtype=reference.dtype)


def secure_dp_optimizer(
    optimizer: torch.optim.Optimizer,
    noise_multiplier: float,
    max_grad_norm: float,
    expected_batch_size: int,
    random: SecureRandom,
) -> torch.optim.Optimizer:
    """Opacus's DPOptimizer (per-item clipping, noise, averaging by the expected batch size) with its noise drawn
    from ``random`` instead of torch's generator."""
    from opacus.optimizers import DPOptimizer
    from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

    class SecureNoiseDPOptimizer(DPOptimizer):
        def add_noise(self) -> None:
            std = self.noise_multiplier * self.max_grad_norm
            for parameter in self.params:
                _check_processed_flag(parameter.summed_grad)
                noised = parameter.summed_grad + random.noise(parameter.summed_grad, std)
                parameter.grad = noised.view_as(parameter)
                _mark_as_processed(parameter.summed_grad)

    return SecureNoiseDPOptimizer(
        optimizer,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        expected_batch_size=expected_batch_size,
        secure_mode=True,
    )


def refuse_made_up_patients(table: Any, settings: DifferentialPrivacy, where: str) -> None:
    """The patient unit needs real patient ids: where each image stands for its own patient (``patients_known``
    false: VinDr-CXR, RSNA, SIIM, a CSV without a patient column) a patient's several images would each count as a
    patient, and the epsilon printed per patient would hold per image only."""
    if settings.enabled and settings.unit == "patient" and not getattr(table, "patients_known", False):
        raise SiteConfigError(
            f"{where}: differential_privacy.unit 'patient' needs patient ids, but this site's data has none (each "
            "image stands for its own patient): give its patient ids, or set unit 'image' (a patient with k images "
            "is then protected as a group of k)"
        )


def sampling_groups(patients: Sequence[str] | None, size: int, unit: str, where: str) -> list[list[int]]:
    """The items Poisson sampling draws over: each patient's item indices (unit "patient"), or each item alone."""
    if unit == "image":
        return [[index] for index in range(size)]
    if patients is None:
        raise SiteConfigError(f"{where}: differential_privacy.unit 'patient' needs patient ids; these items have none")
    groups: dict[str, list[int]] = {}
    for index, patient in enumerate(patients):
        groups.setdefault(str(patient), []).append(index)
    return list(groups.values())


class PoissonBatches(Sampler[list[int]]):
    """``steps`` batches, each holding every group (a patient's items, or one item) independently with probability
    ``sample_rate`` (Poisson sampling, which the accountants assume; a batch may be empty), one item of each chosen
    group picked at random. Every draw comes from ``random``."""

    def __init__(self, groups: Sequence[Sequence[int]], sample_rate: float, steps: int, random: SecureRandom) -> None:
        self.groups, self.sample_rate, self.steps, self.random = groups, sample_rate, steps, random

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            chosen = np.flatnonzero(self.random.uniform(len(self.groups)) < self.sample_rate)
            picks = self.random.uniform(len(chosen))
            yield [
                self.groups[group][int(pick * len(self.groups[group]))]  # pick < 1: an index of the group
                for group, pick in zip(chosen, picks, strict=True)
            ]


def collate_allowing_empty(dataset: Dataset):
    """The default collation, and for an empty batch tensors of the dataset's item shapes with 0 rows."""
    from torch.utils.data import default_collate

    example = dataset[0]

    def collate(items: list[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if items:
            return default_collate(items)
        return {key: torch.empty((0, *torch.as_tensor(value).shape), dtype=torch.as_tensor(value).dtype)
                for key, value in example.items()}  # fmt: skip

    return collate


def steps_per_epoch(units: int, batch_size: int, cap: int | None) -> tuple[float, int]:
    """(sample rate, steps) of one epoch of Poisson sampling over ``units`` (patients or images):
    ``batch_size / units`` and as many steps as batches of that expected size cover them once (at most ``cap``)."""
    rate = min(1.0, batch_size / max(units, 1))
    steps = max(1, math.ceil(units / batch_size))
    return rate, steps if cap is None else min(steps, cap)


def data_fingerprint(patients: Sequence[str]) -> str:
    """A training split's fingerprint: its set of patient ids, hashed (the ledger's key, with the site)."""
    digest = hashlib.sha256("\n".join(sorted({str(patient) for patient in patients})).encode())
    return digest.hexdigest()[:32]


def _write_atomically(path: Path, values: Mapping[str, Any]) -> None:
    """The whole file or the old one, never half: a temporary file beside it, synced, then renamed over it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w") as handle:
        json.dump(values, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def entry_digest(entry: Mapping[str, Any] | None, items: int) -> str:
    """SHA-256 of a ledger entry's first ``items`` history items and the fields that decide what they spend
    (:data:`DIGESTED_FIELDS`): a job records it, and a later job refuses a ledger whose entry no longer gives it."""
    if entry is None or items > len(entry.get("history", [])):
        return ""
    canonical = {name: entry[name] for name in DIGESTED_FIELDS}
    canonical["history"] = [[float(noise), float(rate), int(steps)] for noise, rate, steps in entry["history"][:items]]
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()


class LedgerFile:
    """A site's privacy ledger on disk (``<site workspace>/local/privacy_ledger.json``), shared by every job of the
    site: entries keyed by (site, fingerprint of the training patients, unit), each with its steps and the salted
    hashes of its patients, so that training data sharing patients with an earlier entry inherits that entry's steps
    (a re-split does not start a new budget). A job records the steps it reserved in its own app folder
    (``privacy_spent.json``); ``earlier_spent`` are those records of this site's earlier jobs: a ledger missing
    steps one of them recorded is refused.
    """

    def __init__(
        self,
        path: Path,
        site: str,
        patients: Sequence[str],
        settings: DifferentialPrivacy,
        spent_file: Path | None = None,
        earlier_spent: Sequence[Path] = (),
        delta: float | None = None,
        contents: Sequence[str] = (),
    ) -> None:
        """``delta``: the budget's (the trainer's resolved one); ``contents``: a digest of each training item's decoded
        pixels (or embedding), so that the same images exported under new patient ids share the ledger's steps."""
        self.path, self.site, self.settings = Path(path), site, settings
        self.patients = sorted({str(patient) for patient in patients})
        self.contents = sorted(set(contents))
        self.fingerprint = data_fingerprint(self.patients)
        self.spent_file, self.earlier_spent = spent_file, list(earlier_spent)
        self.delta = delta

    def _refuse(self, problem: str) -> PrivacyLedgerError:
        return PrivacyLedgerError(
            f"privacy ledger {self.path}: {problem}; refusing to train rather than reset the site's privacy budget "
            "(restore the ledger from a backup)"
        )

    def _read(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"format": LEDGER_FORMAT, "salt": os.urandom(16).hex(), "entries": []}
        try:
            values = json.loads(self.path.read_text())
            if values.get("format") != LEDGER_FORMAT:
                raise ValueError(f"format is {values.get('format')!r}, not {LEDGER_FORMAT!r}")
            for entry in values["entries"]:
                missing = [name for name in LEDGER_ENTRY_FIELDS if name not in entry]
                if missing:
                    raise KeyError(f"an entry lacks {missing}")
                PrivacyLedger.from_dict(entry, entry["accountant"])
            bytes.fromhex(values["salt"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise self._refuse(f"cannot be read ({type(error).__name__}: {error})") from None
        return values

    def _digests(self, salt: str, values: Sequence[str] | None = None) -> list[str]:
        """This data's patients (or ``values``) as the ledger keeps them: salted hashes, not ids."""
        return [hashlib.sha256(f"{salt}{value}".encode()).hexdigest()[:16] for value in values or self.patients]

    def _key(self, entry: Mapping[str, Any]) -> tuple[str, str, str]:
        return entry["site"], entry["fingerprint"], entry["unit"]

    def _ledger(self, values: Mapping[str, Any]) -> PrivacyLedger:
        """This data's ledger: its own entry's steps, and those of this site's entries sharing a patient (by id or by
        an image's content) with it."""
        mine = set(self._digests(values["salt"]))
        images = set(self._digests(values["salt"], self.contents)) if self.contents else set()
        key = (self.site, self.fingerprint, self.settings.unit)
        ledger = PrivacyLedger(self.settings.accountant)
        for entry in values["entries"]:
            if self._key(entry) == key:
                ledger = PrivacyLedger.from_dict(entry, self.settings.accountant)
                if self.delta is not None and not math.isclose(entry["delta"], self.delta, rel_tol=1e-9):
                    raise SiteConfigError(
                        f"differential_privacy.delta resolves to {self.delta:.3g} for this data, but its budget was "
                        f"set at delta {entry['delta']:.3g} (ledger {self.path}): a budget keeps its delta (a larger "
                        "one would make the same steps look cheaper); set delta to that value"
                    )
        for entry in values["entries"]:  # the file is one site workspace's: any entry, whatever name it was kept under
            shares_patients = not mine.isdisjoint(entry["patients"]) or not images.isdisjoint(entry["images"])
            if self._key(entry) == key or not shares_patients:
                continue
            if entry["unit"] != self.settings.unit:
                raise SiteConfigError(
                    f"differential_privacy.unit is {self.settings.unit!r}, but patients of this training split spent "
                    f"budget per {entry['unit']} (ledger {self.path}): keep unit {entry['unit']!r} for this data"
                )
            ledger.inherited.extend(PrivacyLedger.from_dict(entry, entry["accountant"]).history)
        self._check_job_records(values)
        return ledger

    def _check_job_records(self, values: Mapping[str, Any]) -> None:
        """Every step a job of this workspace recorded (this job's too) is in the ledger as it recorded it: an entry
        with the record's fingerprint and unit whose history begins with the items the job saw, unchanged (their
        digest: noise multipliers, sample rates, steps, and the entry's delta, unit and accountant). A ledger missing,
        rolled back, with an entry removed, or with any recorded number edited is refused, whatever data this job
        trains on."""
        entries = {(entry["fingerprint"], entry["unit"]): entry for entry in values["entries"]}
        records = [*self.earlier_spent, *([self.spent_file] if self.spent_file else [])]
        for spent in records:
            if not spent.is_file():
                continue
            try:
                record = json.loads(spent.read_text())
                key, steps = (record["fingerprint"], record["unit"]), int(record["steps"])
                items, digest = int(record["items"]), str(record["digest"])
            except (OSError, ValueError, KeyError, TypeError) as error:
                raise self._refuse(f"the job record {spent} cannot be read ({error})") from None
            entry = entries.get(key)
            held = PrivacyLedger.from_dict(entry, entry["accountant"]).steps if entry else 0
            if steps > held:
                state = "is missing" if not self.path.exists() else f"holds {held} DP-SGD steps for that data"
                raise self._refuse(f"{state}, but job record {spent} says {steps} were taken")
            if entry_digest(entry, items) != digest:
                raise self._refuse(
                    f"its entry for that data is not what job record {spent} recorded: a noise multiplier, sample "
                    "rate, step count, delta, unit or accountant of the steps it saw was changed"
                )

    def read(self) -> PrivacyLedger:
        """This data's ledger as the file has it now."""
        return self._ledger(self._read())

    @contextlib.contextmanager
    def transaction(self) -> Iterator[PrivacyLedger]:
        """This data's ledger, read under the file's lock (jobs of one site may run at once); what the caller
        records in it is written atomically (ledger, then this job's record) when the block ends without error."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(f".{self.path.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            values = self._read()
            ledger = self._ledger(values)
            yield ledger
            key = (self.site, self.fingerprint, self.settings.unit)
            earlier = next((old for old in values["entries"] if self._key(old) == key), None)
            entry = {
                "site": self.site,
                "fingerprint": self.fingerprint,
                "unit": self.settings.unit,
                "delta": earlier["delta"] if earlier else self.delta,
                **ledger.to_dict(),
                "patients": sorted(self._digests(values["salt"])),
                "images": sorted(self._digests(values["salt"], self.contents)) if self.contents else [],
            }
            values["entries"] = [old for old in values["entries"] if self._key(old) != key] + [entry]
            _write_atomically(self.path, values)
            if self.spent_file is not None:
                record = {"site": self.site, "fingerprint": self.fingerprint, "unit": self.settings.unit}
                items = len(entry["history"])
                record |= {"steps": ledger.steps, "items": items, "digest": entry_digest(entry, items)}
                _write_atomically(self.spent_file, {**record, "ledger": str(self.path)})
