"""The report labeller: an MLP over sentence embeddings with a named sigmoid head (the report-labelling paper).

Two hidden layers (512 and 256, ReLU, dropout 0.2) are the "backbone"; the output layer is the
head, one row per finding name, under the same state-dict keys as the DenseNet121's head
(``class_layers.out``), so that the aggregation, the trainer and the controller treat both
models alike: hidden layers averaged, head rows matched by name.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn

from ..core.head import distinct_class_names

HIDDEN_SIZES = (512, 256)
DROPOUT = 0.2


class ReportMLP(nn.Module):
    """Embedding (``in_features``) -> 512 -> 256 -> one logit per class name."""

    def __init__(self, class_names: Sequence[str], in_features: int = 384, dropout_prob: float = DROPOUT) -> None:
        super().__init__()
        names = distinct_class_names(class_names)
        self.class_names = names
        self.in_features = in_features
        layers: list[nn.Module] = []
        width = in_features
        for size in HIDDEN_SIZES:
            layers += [nn.Linear(width, size), nn.ReLU(), nn.Dropout(dropout_prob)]
            width = size
        self.features = nn.Sequential(*layers)
        self.class_layers = nn.Sequential(OrderedDict(out=nn.Linear(width, len(names))))

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        return self.class_layers(self.features(embeddings))
