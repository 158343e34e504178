"""A site's data, built from its :class:`SiteConfig`: table -> label subset -> cache -> patient split.

When the config names no data location the site uses the embedded generated dataset of its
kind, generated once into the cache folder on first use and reused afterwards.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from torch.utils.data import Dataset

from .config import SiteConfig, SiteConfigError
from .data.cache import CacheReport, ImageCache, default_cache_root, exclusive
from .data.dataset import ChestXrayDataset, CombinedDataset, cache_table
from .data.sources import load_table
from .data.splits import DEFAULT_SPLIT_NAMES, patient_split
from .data.synthetic import ensure_generated
from .data.table import LabelTable
from .data.transforms import Augmentation, image_transforms
from .reports.data import REPORT_KINDS, load_reports
from .training import resolve_device

logger = logging.getLogger(__name__)


def cache_root(config: SiteConfig) -> Path:
    return Path(config.cache_dir) if config.cache_dir else default_cache_root()


def resolve_table(config: SiteConfig, log: logging.Logger = logger) -> LabelTable:
    """The site's label table (real data, or the embedded dataset), restricted to its labels."""
    data = config.data
    if data.kind in REPORT_KINDS:
        table, summary = load_reports(data.kind, data.location, **data.options)
        log.info(summary.describe())
    elif data.location is None:
        embedded = config.embedded
        folder = (
            cache_root(config)
            / "embedded"
            / f"{data.kind}-{embedded.patients}p-{embedded.image_size}px-s{embedded.seed}"
        )
        folder.mkdir(parents=True, exist_ok=True)
        with exclusive(folder):
            dataset, created = ensure_generated(
                data.kind, folder, n_patients=embedded.patients, image_size=embedded.image_size, seed=embedded.seed
            )
        log.info(
            "no data location configured for this site: using the %s %s",
            "embedded dataset generated now," if created else "embedded dataset generated earlier,",
            dataset.describe(),
        )
        table = load_table(data.kind, dataset.root, **data.options)
    else:
        table = load_table(data.kind, data.location, **data.options)
        log.info("%s data at %s: %d images of %d patients", data.kind, data.location, len(table), table.n_patients)
    if data.labels is not None:
        missing = [name for name in data.labels if name not in table.classes]
        if missing:
            raise SiteConfigError(
                f"data.labels {missing} are not labelled in this {data.kind} data; it labels {table.classes}"
            )
        table.split_classes = table.split_classes or list(table.classes)
        table.classes = list(data.labels)
    return table


@dataclass
class SiteData:
    """Train / validation / test datasets of one site, over its own classes in its own order
    (or of several sites pooled, for the centralized baseline)."""

    class_names: list[str]
    train: ChestXrayDataset | CombinedDataset
    val: ChestXrayDataset | CombinedDataset
    test: ChestXrayDataset | CombinedDataset
    cache: ImageCache | None = None
    cache_report: CacheReport | None = None

    def summary(self) -> str:
        return (
            f"{len(self.class_names)} classes; {len(self.train)} train / {len(self.val)} validation / "
            f"{len(self.test)} test images"
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


def prepare_site_data(
    config: SiteConfig, log: logging.Logger = logger, progress: bool = False, table: LabelTable | None = None
) -> SiteData:
    """Everything a site trains and validates on. Unreadable images are dealt with here, up front.

    ``table`` is the already resolved label table, if the caller has it.
    """
    table = table if table is not None else resolve_table(config, log)
    if config.data.kind in REPORT_KINDS:
        return _report_data(config, table, progress)
    kept, cache, report = cache_table(
        table, cache_root(config), config.image_size, config.on_unreadable, config.cache_threads, progress
    )
    log.info(report.summary())
    if report.failures:
        log.warning("left out %d unreadable image(s), e.g. %s", len(report.failures), report.failures[:3])
    splits = split_table(kept, config)
    augmentation = Augmentation() if config.augment else None

    def dataset(name: str, train: bool) -> ChestXrayDataset:
        transform = image_transforms(
            config.image_size,
            train=train and config.augment,
            in_channels=config.in_channels,
            imagenet_normalize=config.imagenet_normalize,
            augmentation=augmentation,
        )
        return ChestXrayDataset(splits[name], cache, transform, classes=kept.classes)

    train, val, test = (dataset(name, name == "train") for name in DEFAULT_SPLIT_NAMES)
    _check_not_empty(train, val, f"{len(kept)} usable images")
    return SiteData(list(kept.classes), train, val, test, cache, report)


def _check_not_empty(train: Dataset, val: Dataset, available: str) -> None:
    for name, split in (("training", train), ("validation", val)):
        if len(split) == 0:
            raise SiteConfigError(f"the {name} split of this site's data is empty ({available})")


def _report_data(config: SiteConfig, table: LabelTable, progress: bool) -> SiteData:
    """Reports: split like images (a report is its own patient), each report embedded once (cached)."""
    from .reports.dataset import ReportDataset, embed_table  # loads the sentence encoder only when needed

    device = "cuda" if resolve_device(config.device).type == "cuda" else "cpu"
    vectors = embed_table(table, cache_root(config), config.embedding_model, device, progress)
    splits = split_table(table, config)
    train, val, test = (ReportDataset(splits[name], vectors, table.classes) for name in DEFAULT_SPLIT_NAMES)
    _check_not_empty(train, val, f"{len(table)} reports")
    return SiteData(list(table.classes), train, val, test)
