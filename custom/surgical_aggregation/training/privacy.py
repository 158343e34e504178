"""Differential privacy at a site: DP-SGD (Opacus) over its local training, and the budget it spends.

A site's config may turn it on (``differential_privacy``: its own budget, set by hospital IT, not by the job). Every
training step then draws its batch by Poisson sampling (each training image independently, with probability
``batch_size / N``), clips each image's gradient to ``max_grad_norm`` and adds Gaussian noise of standard deviation
``noise_multiplier * max_grad_norm`` to their sum: the sampled Gaussian mechanism Opacus's accountants account for.
The :class:`PrivacyLedger` keeps every step taken (across rounds and process restarts, in the local model's file) and
says the epsilon spent at the site's delta; before a round the site checks that the round's steps fit in its budget,
and trains no more once they would not.

What the guarantee covers: the model updates the site sends (backbone and head rows), as functions of its training
split, at (epsilon, delta) per training image, for the steps counted. Nothing else computed on the training split
leaves the site: under DP it sends no training loss and tracks no training-loss curve. It does not cover the
validation metrics the site reports (computed on its validation split, a different set of images), its class names
and counts sent at the handshake, or a BatchNorm that learns from batch statistics (refused: only FedBN+'s frozen
BatchNorm is allowed).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, Sampler

from ..core.errors import SiteConfigError
from ..core.methods import SiteMethod

ACCOUNTANTS = ("rdp", "prv")  # Opacus's Renyi-DP accountant, and its privacy-random-variable one (tighter)


@dataclass
class DifferentialPrivacy:
    """A site's DP-SGD settings (``differential_privacy`` in its config); off while ``epsilon`` is null.

    ``epsilon``: the site's whole budget over the federation, at ``delta``. The noise is ``noise_multiplier``, or
    (null) the smallest that keeps ``planned_rounds`` rounds of this site's local training within the budget.
    """

    epsilon: float | None = None
    delta: float = 1e-5
    max_grad_norm: float = 1.0
    noise_multiplier: float | None = None
    planned_rounds: int | None = None
    accountant: str = "rdp"

    @property
    def enabled(self) -> bool:
        return self.epsilon is not None

    def check(self, where: str) -> None:
        """Refuse settings DP-SGD could not use; the error names ``where`` and the field."""
        if not self.enabled:
            return

        def fail(name: str, message: str) -> SiteConfigError:
            return SiteConfigError(f"{where}: differential_privacy.{name} {message}")

        if not self.epsilon > 0:
            raise fail("epsilon", f"must be positive, got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise fail("delta", f"must be between 0 and 1, got {self.delta}")
        if not self.max_grad_norm > 0:
            raise fail("max_grad_norm", f"must be positive, got {self.max_grad_norm}")
        if self.accountant not in ACCOUNTANTS:
            raise fail("accountant", f"must be one of {list(ACCOUNTANTS)}, got {self.accountant!r}")
        if (self.noise_multiplier is None) == (self.planned_rounds is None):
            raise fail(
                "noise_multiplier",
                "or planned_rounds: give exactly one (the noise, or the rounds the budget is spread over)",
            )
        if self.noise_multiplier is not None and not self.noise_multiplier > 0:
            raise fail("noise_multiplier", f"must be positive, got {self.noise_multiplier}")
        if self.planned_rounds is not None and self.planned_rounds < 1:
            raise fail("planned_rounds", f"must be at least 1, got {self.planned_rounds}")


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
    if gpus > 1:
        raise SiteConfigError(f"{where} trains on one process: set gpus to 1")
    if compile_mode == "on":
        raise SiteConfigError(f"{where} needs the model uncompiled: set compile to off")


def _accountant(kind: str, history: Sequence[tuple[float, float, int]]):
    from opacus.accountants import PRVAccountant, RDPAccountant

    accountant = RDPAccountant() if kind == "rdp" else PRVAccountant()
    accountant.history = [tuple(entry) for entry in history]
    return accountant


@dataclass
class PrivacyLedger:
    """Every DP-SGD step a site took: (noise multiplier, sample rate, steps) entries, as Opacus's accountants keep
    them; the epsilon they spend at ``delta``."""

    accountant: str = "rdp"
    history: list[tuple[float, float, int]] = field(default_factory=list)
    noise_multiplier: float | None = None  # chosen once (from the budget), kept for every later round

    @property
    def steps(self) -> int:
        return sum(steps for _, _, steps in self.history)

    def epsilon(self, delta: float, planned: Sequence[tuple[float, float, int]] = ()) -> float:
        """The epsilon spent at ``delta`` (0 before any step), with ``planned`` steps added when given."""
        history = [*self.history, *planned]
        if not history:
            return 0.0
        return float(_accountant(self.accountant, history).get_epsilon(delta))

    def record(self, noise_multiplier: float, sample_rate: float, steps: int) -> None:
        if steps <= 0:
            return
        last = self.history[-1] if self.history else None
        if last is not None and last[0] == noise_multiplier and last[1] == sample_rate:
            self.history[-1] = (noise_multiplier, sample_rate, last[2] + steps)  # as Opacus merges them
        else:
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


def noise_for_budget(settings: DifferentialPrivacy, sample_rate: float, steps: int) -> float:
    """The smallest noise multiplier that keeps ``steps`` steps at ``sample_rate`` within the budget."""
    from opacus.accountants.utils import get_noise_multiplier

    return float(
        get_noise_multiplier(
            target_epsilon=settings.epsilon,
            target_delta=settings.delta,
            sample_rate=sample_rate,
            steps=steps,
            accountant=settings.accountant,
        )
    )


class PoissonBatches(Sampler[list[int]]):
    """``steps`` batches, each holding every index of ``size`` independently with probability ``sample_rate``
    (Poisson sampling, which the accountants assume; a batch may be empty). Draws come from ``generator``."""

    def __init__(self, size: int, sample_rate: float, steps: int, generator: torch.Generator) -> None:
        self.size, self.sample_rate, self.steps, self.generator = size, sample_rate, steps, generator

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            chosen = torch.rand(self.size, generator=self.generator) < self.sample_rate
            yield chosen.nonzero().flatten().tolist()


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


def steps_per_epoch(samples: int, batch_size: int, cap: int | None) -> tuple[float, int]:
    """(sample rate, steps) of one epoch of Poisson sampling: ``batch_size / samples`` and as many steps as
    batches of that expected size cover the split once (at most ``cap``)."""
    rate = min(1.0, batch_size / max(samples, 1))
    steps = max(1, math.ceil(samples / batch_size))
    return rate, steps if cap is None else min(steps, cap)
