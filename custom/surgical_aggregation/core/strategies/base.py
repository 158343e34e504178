"""What a backbone strategy decides, and the state-dict keys it decides about (no torch: the command line lists the
strategies' names)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

BATCHNORM_SUFFIXES = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def batchnorm_keys(state: Iterable[str] | Mapping[str, Any]) -> set[str]:
    """Keys of BatchNorm parameters and buffers, recognised by their ``running_mean`` sibling.

    Works on any state dict (DenseNet, MLP, ...) without knowing layer names.
    """
    keys = set(state)
    found: set[str] = set()
    for key in keys:
        if key.endswith(".running_mean"):
            prefix = key[: -len("running_mean")]
            found.update(prefix + suffix for suffix in BATCHNORM_SUFFIXES if prefix + suffix in keys)
    return found


STRATEGIES: dict[str, BackboneStrategy] = {}  # name -> the strategy, filled by @register in each strategy's module


def register(cls: type[BackboneStrategy]) -> type[BackboneStrategy]:
    """Class decorator: make the strategy known by its name."""
    if not cls.name or cls.name in STRATEGIES:
        raise ValueError(f"a backbone strategy needs a name of its own, got {cls.name!r}")
    STRATEGIES[cls.name] = cls()
    return cls


class BackboneStrategy:
    """How the backbone (everything but the head rows) is shared. A strategy says which entries the server averages,
    which entries each site keeps for itself, whether the sites train with BatchNorm frozen, and which methods it
    serves; one subclass per strategy, registered in :mod:`surgical_aggregation.core.strategies`."""

    name: str = ""
    summary: str = ""  # one line for documentation and the records of a comparison
    batchnorm: str = ""  # what happens to BatchNorm, for the records of a comparison
    freezes_batchnorm: bool = False  # the sites train with BatchNorm frozen (eval mode, no gradient)
    personal_methods_only: bool = False  # it leaves the global model without trained parts: PFL only

    def shared_keys(self, state: Collection[str], head_keys: Sequence[str]) -> list[str]:
        """The backbone entries the server averages, in the state's order."""
        excluded = set(head_keys) | self.excluded_keys(state)
        return [key for key in state if key not in excluded]

    def excluded_keys(self, state: Collection[str]) -> set[str]:
        """Backbone entries the server does not average (they keep the global model's values)."""
        return set()

    def kept_at_site(self, state: Collection[str]) -> set[str]:
        """Backbone entries each site keeps as its own once it has trained (personal models carry them)."""
        return set()

    def check_method(self, method: str, personal_methods: Collection[str]) -> None:
        """Refuse a method this strategy cannot serve (raises ``ValueError`` naming both)."""
        if self.personal_methods_only and method not in personal_methods:
            raise ValueError(
                f"backbone_strategy {self.name!r} keeps each site's BatchNorm at the site, so the global model would "
                f"carry untrained BatchNorm statistics; use it with method 'personal' (PFL), or use 'fedbn_plus'"
            )
