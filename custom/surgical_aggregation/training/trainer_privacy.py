"""A site trainer's DP-SGD (:mod:`.privacy`): the budget each round spends, recorded before it trains, the noise
that spends it, and the steps that take it (Opacus's per-item gradients on Poisson-sampled batches)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.head import NAMED_HEAD
from .config import SiteConfig
from .privacy import (
    PoissonBatches,
    SecureRandom,
    collate_allowing_empty,
    noise_for_budget,
    prior_logit,
    secure_dp_optimizer,
    steps_per_epoch,
)
from .privacy_accounting import PrivacyLedger
from .privacy_ledger import LedgerFile
from .site_data import SiteData


def training_contents(dataset: Any) -> list[str]:
    """A SHA-256 of each training item's content as the model reads it (the cached pixels of an image, a report's
    embedding): the same images exported again under other patient ids are the same items."""
    digests = []
    for index in range(len(dataset)):
        item = dataset[index]
        value = item.get("image", item.get("embedding")) if isinstance(item, dict) else None
        if value is not None:
            array = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
            digests.append(hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest())
    return digests


class PrivateTraining:
    """The DP-SGD part of :class:`~.trainer.SiteTrainer` (its base): what it reads of the trainer is set in the
    trainer's ``__init__``."""

    config: SiteConfig
    data: SiteData
    ledger: PrivacyLedger
    ledger_file: LedgerFile | None
    delta: float | None
    _sampling_groups: list[list[int]]

    def _training_patients(self) -> list[str] | None:
        from ..data.table import PATIENT_COLUMN

        table = getattr(self.data.train, "table", None)
        return None if table is None else [str(patient) for patient in table.frame[PATIENT_COLUMN]]

    def _privacy_units(self) -> int:
        """What DP-SGD samples and protects: the training split's patients (unit "patient") or images."""
        return len(self._sampling_groups)

    def keep_ledger_in(self, path: Path, spent_file: Path | None = None, earlier_spent: Sequence[Path] = ()) -> None:
        """Keep the DP-SGD ledger in the site's ledger file (training.privacy_ledger.LedgerFile), shared by its jobs."""
        patients = self._training_patients()
        if patients is None:
            patients = [f"item {index}" for index in range(len(self.data.train))]
        self.ledger_file = LedgerFile(
            path,
            self.site_name,
            patients,
            self.config.differential_privacy,
            spent_file,
            earlier_spent,
            delta=self.delta,
            contents=training_contents(self.data.train),
        )
        self.ledger = self.ledger_file.read()  # refuses an unreadable ledger, or one behind this site's jobs, now

    def _epoch_plan(self) -> tuple[float, int]:
        return steps_per_epoch(self._privacy_units(), self.config.batch_size, self.config.max_batches_per_epoch)

    def _noise_multiplier(self) -> float:
        """The site's noise: given, or chosen once so that its planned rounds spend its budget (then kept)."""
        settings = self.config.differential_privacy
        if settings.noise_multiplier is not None:
            return settings.noise_multiplier
        if self.ledger.noise_multiplier is None:
            rate, steps = self._epoch_plan()
            config = self.config
            planned = (config.warmup_epochs + settings.planned_rounds * config.local_epochs) * steps
            self.ledger.noise_multiplier = noise_for_budget(settings, rate, planned, self.delta)
        return self.ledger.noise_multiplier

    @contextmanager
    def _ledger_transaction(self) -> Iterator[PrivacyLedger]:
        """The ledger as it stands now, and what is recorded in it kept: in the site's ledger file (read and
        written under its lock), or in this process."""
        if self.ledger_file is None:
            yield self.ledger
            return
        with self.ledger_file.transaction() as ledger:
            self.ledger = ledger
            yield ledger

    def _spend_budget(self, warmup: bool) -> dict[str, Any]:
        """This round's steps recorded in the ledger before any of them is taken, if they fit in the budget."""
        settings = self.config.differential_privacy
        rate, steps = self._epoch_plan()
        epochs = self.config.local_epochs + (self.config.warmup_epochs if warmup else 0)
        with self._ledger_transaction() as ledger:
            spent = ledger.epsilon(self.delta)
            planned = (self._noise_multiplier(), rate, epochs * steps)
            would_spend = ledger.epsilon(self.delta, [planned])
            stopped = would_spend > settings.epsilon
            if not stopped:
                ledger.record(*planned)
        return {
            "stopped": stopped,
            "round_steps": epochs * steps,
            "would_spend": would_spend,
            "budget": settings.epsilon,
            "delta": self.delta,
            "unit": settings.unit,
            "epsilon": spent,
        }

    def _start_biases_at_prior(self) -> None:
        """DP-SGD, the site's first round: its own classes' output biases start at the public prior's logit, so
        that noise does not leave "lower every output" as the only part of the gradient that comes through
        (:class:`~.privacy.DifferentialPrivacy`)."""
        prevalence = self.config.differential_privacy.prior_prevalence
        logit = prior_logit(prevalence)
        rows = [row for row, name in enumerate(self.head_classes) if name in self.class_names]
        bias = dict(self.model.named_parameters())[NAMED_HEAD.bias_key]
        with torch.no_grad():
            bias[rows] = logit
        self.log.info(
            "%s: DP-SGD: the output biases of its %d classes start at %.3f (the logit of a public prior prevalence "
            "of %g, not the site's counts)", self.site_name, len(rows), logit, prevalence,
        )  # fmt: skip

    def _privacy_report(self, stopped: bool) -> dict[str, Any]:
        settings = self.config.differential_privacy
        return {
            "epsilon": self.ledger.epsilon(self.delta),
            "delta": self.delta,
            "budget": settings.epsilon,
            "noise_multiplier": self._noise_multiplier(),
            "max_grad_norm": settings.max_grad_norm,
            "steps": self.ledger.steps,
            "accountant": settings.accountant,
            "unit": settings.unit,
            "stopped": stopped,
        }

    @contextmanager
    def _private_steps(self, optimizer: torch.optim.Optimizer, private: bool) -> Iterator[torch.optim.Optimizer]:
        """A phase's steps under DP-SGD: the model's trainable parameters get per-item gradients (Opacus), clipped
        and noised by its optimizer, on Poisson-sampled batches (of patients, or images); noise and sampling draw
        from a secure source that no seed reaches (the steps are already in the ledger: :meth:`_spend_budget`)."""
        if not private:
            yield optimizer
            return
        from opacus import GradSampleModule

        settings = self.config.differential_privacy
        random = SecureRandom()
        per_item = GradSampleModule(self.model)
        noised = secure_dp_optimizer(
            optimizer, self._noise_multiplier(), settings.max_grad_norm, self.config.batch_size, random
        )
        single, loader = self.training_model, self.train_loader
        rate, steps = self._epoch_plan()
        dataset = loader.dataset
        self.training_model = per_item
        self.train_loader = torch.utils.data.DataLoader(
            dataset,
            batch_sampler=PoissonBatches(self._sampling_groups, rate, steps, random),
            collate_fn=collate_allowing_empty(dataset),
            num_workers=self.workers,
            generator=loader.generator,  # the augmentation's seeds (reseeded every epoch), not the mechanism's
            pin_memory=torch.cuda.is_available(),
        )
        autocast, scaler = self.autocast, self.scaler
        self.autocast, self.scaler = None, None  # per-item gradients in full precision
        try:
            yield noised
        finally:
            self.training_model, self.train_loader = single, loader
            self.autocast, self.scaler = autocast, scaler
            per_item._close()
