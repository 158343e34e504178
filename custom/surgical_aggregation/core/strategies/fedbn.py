"""FedBN: each site keeps and trains its own BatchNorm (personalised FL only: the global model's stays untrained)."""

from __future__ import annotations

from collections.abc import Collection

from .base import BackboneStrategy, batchnorm_keys, register


@register
class FedBN(BackboneStrategy):
    name = "fedbn"
    summary = "each site keeps and trains its own BatchNorm; the rest averaged (personalised FL only)"
    batchnorm = "trained, kept at each site"
    personal_methods_only = True

    def excluded_keys(self, state: Collection[str]) -> set[str]:
        return batchnorm_keys(state)

    def kept_at_site(self, state: Collection[str]) -> set[str]:
        return batchnorm_keys(state)
