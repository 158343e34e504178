"""FedBN+ (the papers' FedFBN): BatchNorm frozen at the initial model's statistics at every site and never averaged."""

from __future__ import annotations

from collections.abc import Collection

from .base import BackboneStrategy, batchnorm_keys, register


@register
class FedBNPlus(BackboneStrategy):
    name = "fedbn_plus"
    summary = "BatchNorm frozen at the initial model's statistics at every site, never averaged; the rest averaged"
    batchnorm = "frozen at the initial model's statistics"
    freezes_batchnorm = True

    def excluded_keys(self, state: Collection[str]) -> set[str]:
        return batchnorm_keys(state)
