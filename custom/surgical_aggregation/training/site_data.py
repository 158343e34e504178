"""A site's data, built from its :class:`SiteConfig`: table -> label subset -> materialised -> patient split.

What the data is (images or reports) is the modality's business (``modalities``); this module
restricts the table to the site's labels, cuts it by patient and checks the splits are usable.
When the config names no data location an image site uses the embedded generated dataset of its
kind, generated once into the cache folder on first use and reused afterwards.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import ConcatDataset, Dataset

from ..core.errors import DataNotFoundError, DatasetFormatError, SiteConfigError
from ..data.quality import duplicate_images, one_sided_classes
from ..data.splits import DEFAULT_SPLIT_NAMES, patient_split
from ..data.table import PATH_COLUMN, LabelTable, MaterialisedTable
from .config import DATA_LOCATION_PLACEHOLDER, SiteConfig

logger = logging.getLogger(__name__)


def resolve_table(config: SiteConfig, log: logging.Logger = logger) -> LabelTable:
    """The site's label table (real data, or the embedded dataset), restricted to its labels. Its label
    names are read through the config's vocabulary (the site's own aliases, and the job's it was loaded for)."""
    data = config.data
    if data.location == DATA_LOCATION_PLACEHOLDER:
        raise DataNotFoundError(
            "data.location still holds the template's placeholder: set it to the dataset folder at this site (the CSV "
            "file for kind csv)"
        )
    where = (
        f"data.location {str(Path(data.location).resolve())!r}" if data.location else f"the embedded {data.kind} data"
    )
    try:
        table = config.modality.load_table(config, log)
    except DataNotFoundError as error:
        if data.location is None:
            raise
        raise DataNotFoundError(f"{where}: {error}") from None
    noun = config.modality.sample_noun
    if len(table) == 0:
        raise DatasetFormatError(
            f"{where}: no {noun} in this {data.kind} data (an empty label file?); a site needs some"
        )
    if not table.classes:
        raise DatasetFormatError(f"{where}: no label columns in this {data.kind} data; a site needs at least one")
    if data.labels is not None:
        missing = [name for name in data.labels if name not in table.classes]
        if missing:
            raise SiteConfigError(
                f"data.labels {missing} are not labelled in this {data.kind} data; it labels {table.classes}"
            )
        table.split_classes = table.split_classes or list(table.classes)
        table.classes = list(data.labels)
    labelled = table.frame[list(table.classes)].notna().to_numpy().any()
    if not labelled:
        raise DatasetFormatError(f"{where}: none of its {len(table)} {noun} has a label for {table.classes}")
    for line in data_warnings(table, split_table(table, config), where):
        log.warning(line)
    return table


def data_warnings(table: LabelTable, splits: Mapping[str, LabelTable], where: str) -> list[str]:
    """What a site should know of its data before it trains (``data.quality``): images listed twice, classes one-sided
    in a split. An image under two patients is refused here."""
    return duplicate_images(table, where) + one_sided_classes(splits, where)


class CombinedDataset(ConcatDataset):
    """Several sites' datasets over one class list (centralized training), reseeded together."""

    def __init__(self, parts: Sequence[Dataset]) -> None:
        names = {tuple(part.class_names) for part in parts}
        if len(names) != 1:
            raise ValueError(f"datasets to combine must have the same label columns, got {sorted(names)}")
        super().__init__(parts)
        self.class_names = list(parts[0].class_names)

    def reseed(self, seed: int) -> None:
        for offset, part in enumerate(self.datasets):
            part.reseed(seed + offset)

    def batch_transform(self, inputs: torch.Tensor) -> torch.Tensor:
        """The parts come from one config's preprocessing (the centralized baseline): the first part's step."""
        return self.datasets[0].batch_transform(inputs)


@dataclass
class SiteData:
    """Train / validation / test datasets of one site, over its own classes in its own order
    (or of several sites pooled, for the centralized baseline)."""

    class_names: list[str]
    train: Dataset
    val: Dataset
    test: Dataset
    sample_noun: str = "images"

    def summary(self) -> str:
        return (
            f"{len(self.class_names)} classes; {len(self.train)} train / {len(self.val)} validation / "
            f"{len(self.test)} test {self.sample_noun}"
        )


def split_table(table: LabelTable, config: SiteConfig) -> dict[str, LabelTable]:
    """Train / val / test by patient; then this site's IID part of train and val, and its subsample of train."""
    data = config.data
    splits = patient_split(table, data.split_fractions, data.split_seed, DEFAULT_SPLIT_NAMES)
    if data.partition_count > 1:
        names = [f"part{index}" for index in range(data.partition_count)]
        equal = [1.0 / data.partition_count] * data.partition_count
        for split in ("train", "val"):
            parts = patient_split(splits[split], equal, data.split_seed + 1, names)
            splits[split] = parts[names[data.partition_index]]
    if data.train_subsample < 1:
        kept = data.train_subsample
        splits["train"] = patient_split(splits["train"], [kept, 1 - kept], data.split_seed + 2, ["kept", "rest"])[
            "kept"
        ]
    return splits


def _usable_rows(split: LabelTable, usable: set[str]) -> LabelTable:
    return split.subset(split.frame[PATH_COLUMN].isin(usable).to_numpy())


def prepare_site_data(
    config: SiteConfig, log: logging.Logger = logger, progress: bool = False, table: LabelTable | None = None
) -> SiteData:
    """Everything a site trains and validates on. Unreadable images are dealt with here, up front.

    ``table`` is the already resolved label table, if the caller has it.
    """
    table = table if table is not None else resolve_table(config, log)
    modality = config.modality
    # split before anything is left out, so the handshake's counts (the same split) hold, less unreadable images
    splits = split_table(table, config)
    materialised = modality.materialise(config, table, log, progress)
    log.info(materialised.summary)
    usable = set(materialised.table.paths)
    train, val, test = (
        materialised.dataset(_usable_rows(splits[name], usable), name == "train") for name in DEFAULT_SPLIT_NAMES
    )
    for name, split in (("training", train), ("validation", val)):
        if len(split) == 0:
            raise SiteConfigError(
                f"the {name} split of this site's data is empty ({len(materialised.table)} usable "
                f"{modality.sample_noun})"
            )
    return SiteData(list(materialised.table.classes), train, val, test, modality.sample_noun)


def prepare_cache(config: SiteConfig, log: logging.Logger = logger, progress: bool = True) -> MaterialisedTable:
    """Decode every image (or embed every report) of a site's data once into the cache, ahead of training."""
    return config.modality.materialise(config, resolve_table(config, log), log, progress)
