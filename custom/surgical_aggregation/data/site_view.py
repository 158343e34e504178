"""What a modality reads of a site's config: where its data is and what it is (:class:`DataConfig`), and the few
settings :class:`SiteView` names.

The site's whole config (``training.config.SiteConfig``) sits above the modalities and satisfies :class:`SiteView`;
the modalities and their registry type against this view, so they never name the config's module and the two do
not import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..core.labels import Vocabulary


@dataclass
class DataConfig:
    kind: str = "nih"  # what the data is: one of the modalities' kinds (nih, chexpert, ... images; reports)
    location: str | None = None  # data folder (CSV file for csv); null = the generated data of the kind
    options: dict[str, Any] = field(default_factory=dict)  # passed to the loader, e.g. {"uncertainty": "ignore"}
    labels: list[str] | None = None  # the findings this site trains on, in its order (default: all of the dataset's)
    # this site's synonyms for its label names, {"alias": "class name"}: inline, or a JSON/YAML alias file
    # (a path relative to this config file), read when the config is loaded
    label_aliases: dict[str, str] | str | None = None
    split_fractions: list[float] = field(default_factory=lambda: [0.7, 0.1, 0.2])  # train / validation / test
    split_seed: int = 0
    # Simulated federations from one dataset: the train and validation patients are dealt IID
    # (stratified) into ``partition_count`` parts and this site takes part ``partition_index``;
    # the test split stays whole (the federation's common held-out set).
    partition_count: int = 1
    partition_index: int = 0
    train_subsample: float = 1.0  # keep this share of the site's training patients (dataset size N)


class SiteView(Protocol):
    """The fields of a site's config that a modality reads."""

    data: DataConfig
    settings: Any  # the modality's own dataclass of site-config fields (its ``settings_type``)
    device: str

    @property
    def vocabulary(self) -> Vocabulary: ...

    @property
    def cache_root(self) -> Path: ...
