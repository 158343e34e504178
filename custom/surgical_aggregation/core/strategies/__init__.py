"""The backbone strategies: one class per strategy, each in its own module, registered by the line below.

Everything else asks :func:`strategy` for the object and never compares a strategy's name. Adding a strategy: its
module (a :class:`~.base.BackboneStrategy` subclass decorated with ``@register``) and its name on that line.
"""

from __future__ import annotations

from . import fedavg, fedbn, fedbn_plus  # noqa: F401  (the registry: each module registers its strategy)
from .base import STRATEGIES, BackboneStrategy, batchnorm_keys

STRATEGY_NAMES: tuple[str, ...] = tuple(STRATEGIES)


def strategy(name: str) -> BackboneStrategy:
    """The strategy called ``name``; an unknown name is a ``ValueError`` listing the known ones."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"backbone_strategy must be one of {list(STRATEGIES)}, got {name!r}") from None


__all__ = ["STRATEGIES", "STRATEGY_NAMES", "BackboneStrategy", "batchnorm_keys", "strategy"]
