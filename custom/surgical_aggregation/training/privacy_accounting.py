"""What DP-SGD steps spend: Opacus's accountants (RDP, PRV) over a site's steps, and :class:`PrivacyLedger`, the
steps taken on one training split with those inherited from earlier splits sharing its patients."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.errors import SiteConfigError


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
