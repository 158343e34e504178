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

The :class:`~.privacy_ledger.LedgerFile` keeps every step at the site (``<site
workspace>/local/privacy_ledger.json``), across jobs, resumed runs and continued federations, keyed by the site and
a fingerprint of its training patients; the steps of a round are written there (atomically) before the round trains,
so before its update leaves. A round that would take the site over its budget is not trained and nothing is sent. An
unreadable ledger, or one behind the steps an earlier job of this site recorded, is refused, never reset.

What the guarantee covers: the model updates the site sends (backbone and head rows), as functions of its training
split, at (epsilon, delta) per patient (or per image), for the steps counted. Nothing else computed on the training
split leaves the site: under DP it sends no training loss and tracks no training-loss curve. It does not cover the
validation metrics the site reports (computed on its validation split, other patients), its class names and counts
sent at the handshake, or a BatchNorm that learns from batch statistics (refused: only FedBN+'s frozen BatchNorm is
allowed).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, Sampler

from ..core.errors import SiteConfigError
from ..core.methods import SiteMethod
from .privacy_accounting import PrivacyLedger

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
                raise dp_off_but_set(named, where)
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


def dp_off_but_set(named: list[str], where: str) -> SiteConfigError:
    """The refusal of a ``differential_privacy`` block that sets the fields ``named`` while its epsilon is null (it
    would train without DP, silently): by their values (:meth:`DifferentialPrivacy.check`) or by their presence in a
    partial block (``training.config``)."""
    return SiteConfigError(
        f"{where}: differential_privacy.epsilon is null, so DP-SGD is off, but the block sets {named}: give epsilon "
        '(the budget) to train with DP-SGD, or remove those fields (or the whole block, or leave only "epsilon": '
        "null) to train without it"
    )


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
