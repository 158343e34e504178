"""FedAvg: the whole backbone averaged, BatchNorm's running statistics included."""

from __future__ import annotations

from .base import BackboneStrategy, register


@register
class FedAvg(BackboneStrategy):
    name = "fedavg"
    summary = "every backbone entry averaged, BatchNorm statistics included"
    batchnorm = "trained"
