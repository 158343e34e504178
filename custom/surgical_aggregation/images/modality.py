"""Chest X-ray images as a modality: folder layouts -> label table -> preprocessing cache -> datasets -> DenseNet121."""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from torch import nn

from ..core.errors import ImageLoadError, ModelFileError, SiteConfigError
from ..data.site_view import SiteView
from ..data.storage import default_cache_root, exclusive
from ..data.table import PATH_COLUMN, PATIENT_COLUMN, LabelTable, MaterialisedTable
from .dataset import ChestXrayDataset, cache_table, list_images
from .decode import read_grayscale
from .layouts import check_options, load_table
from .names import ARCHITECTURE, DENSENET121, KINDS, NETWORK_KEY, SHARED_ROWS
from .settings import ACCEPT_NON_CHEST, ImageSettings
from .synthetic import GENERATED, ensure_generated
from .transforms import image_batch_transform

if TYPE_CHECKING:
    from ..data.bundle_parts import BundleParts


@dataclass(frozen=True)
class ImageModality:
    name: str = "images"
    kinds: tuple[str, ...] = KINDS
    settings_type: type = ImageSettings
    architecture: str = ARCHITECTURE
    row_column: str = "path"  # what identifies an input in predict's output
    sample_noun: str = "images"
    threshold_metrics: bool = False

    def check(self, config: SiteView, where: str) -> None:
        config.settings.check(where)
        check_options(config.data.kind, config.data.options, where)
        if config.data.location is None and config.data.kind not in GENERATED:
            raise SiteConfigError(
                f"{where}: data.location is required for kind {config.data.kind!r} "
                f"(embedded data exists for {list(GENERATED)})"
            )

    def load_table(self, config: SiteView, log: logging.Logger) -> LabelTable:
        data = config.data
        if data.location is not None:
            table = load_table(data.kind, data.location, config.vocabulary, **data.options)
            log.info("%s data at %s: %d images of %d patients", data.kind, data.location, len(table), table.n_patients)
            return table
        embedded = config.settings.embedded
        name = f"{data.kind}-{embedded.patients}p-{embedded.image_size}px-s{embedded.seed}"
        options = {"n_patients": embedded.patients, "image_size": embedded.image_size, "seed": embedded.seed}
        if embedded.absent:
            absent = config.vocabulary.canonical_list(embedded.absent, "embedded.absent")
            options["absent"] = sorted(absent)
            name += "-absent-" + hashlib.sha256("|".join(options["absent"]).encode()).hexdigest()[:10]
        if embedded.co_occurrence != SHARED_ROWS:  # the default is left out: folders generated before keep their name
            options["co_occurrence"] = embedded.co_occurrence
            name += f"-{embedded.co_occurrence}"
        folder = config.cache_root / "embedded" / name
        with exclusive(folder):
            dataset, created = ensure_generated(data.kind, folder, **options)
        log.info(
            "no data location configured for this site: using the %s %s",
            "embedded dataset generated now," if created else "embedded dataset generated earlier,",
            dataset.describe(),
        )
        return load_table(data.kind, dataset.root, config.vocabulary, **data.options)

    def describe(self, config: SiteView, table: LabelTable) -> str:
        origin = "embedded generated data" if config.data.location is None else "local data"
        return f"{config.data.kind} layout, {origin}, {len(table)} images"

    def preprocessing(self, config: SiteView) -> dict[str, Any]:
        settings: ImageSettings = config.settings
        described = {
            "image_size": settings.image_size,
            "in_channels": settings.in_channels,
            "imagenet_normalize": settings.imagenet_normalize,
        }
        if settings.network != DENSENET121:  # absent: DenseNet121, as in every model file written before networks
            described[NETWORK_KEY] = settings.network
        return described

    def materialise(
        self, config: SiteView, table: LabelTable, log: logging.Logger, progress: bool
    ) -> MaterialisedTable:
        settings: ImageSettings = config.settings
        kept, cache, report = cache_table(
            table,
            config.cache_root,
            settings.image_size,
            settings.on_unreadable,
            settings.cache_threads,
            progress,
            settings.accept_non_chest,
        )
        if report.failures:
            log.warning("left out %d unreadable image(s), e.g. %s", len(report.failures), report.failures[:3])

        def dataset(split: LabelTable, train: bool) -> ChestXrayDataset:
            transform = image_batch_transform(
                settings.image_size,
                train=train and settings.augment,
                in_channels=settings.in_channels,
                imagenet_normalize=settings.imagenet_normalize,
            )
            return ChestXrayDataset(split, cache, transform, classes=kept.classes)

        return MaterialisedTable(kept, dataset, report.summary(), report.failures)

    def build_model(self, class_names: Sequence[str], preprocessing: Mapping[str, Any]) -> nn.Module:
        from .model import NamedDenseNet  # MONAI: imported where a model is built

        return NamedDenseNet(
            class_names,
            in_channels=int(preprocessing.get("in_channels", 1)),
            network=str(preprocessing.get(NETWORK_KEY, DENSENET121)),
        )

    def load_pretrained(self, model: nn.Module, weights_path: str) -> None:
        from .model import load_pretrained_backbone

        load_pretrained_backbone(model, weights_path)

    def unlabelled_table(self, source: Path, column: str | None) -> LabelTable:
        paths = list_images(source, column or PATH_COLUMN)
        root = Path(os.path.commonpath(paths)) if paths else Path(".")
        return LabelTable("scored", root, [], pd.DataFrame({PATH_COLUMN: paths, PATIENT_COLUMN: paths}))

    def scoring_dataset(
        self, table: LabelTable, preprocessing: Mapping[str, Any], cache_dir: str | None, on_error: str, device: str
    ) -> tuple[ChestXrayDataset, LabelTable, list[tuple[str, str]]]:
        size = preprocessing.get("image_size")
        if size is None:
            raise ModelFileError("the model file does not say which image size it was trained at: pass --image-size")
        kept, cache, report = cache_table(
            table,
            cache_dir or default_cache_root(),
            int(size),
            on_error,
            workers=4,
            progress=sys.stderr.isatty(),  # a bar at a terminal, else a log line every PROGRESS_SECONDS
            accept_non_chest=bool(preprocessing.get(ACCEPT_NON_CHEST, False)),
        )
        transform = image_batch_transform(
            int(size),
            train=False,
            in_channels=int(preprocessing.get("in_channels", 1)),
            imagenet_normalize=bool(preprocessing.get("imagenet_normalize", True)),
        )
        return ChestXrayDataset(kept, cache, transform), kept, report.failures

    def read_sample(self, table: LabelTable, config: SiteView, limit: int | None) -> list[tuple[str, str]]:
        failures = []
        for path in table.paths[:limit]:
            try:
                read_grayscale(path, config.settings.image_size, config.settings.accept_non_chest)
            except ImageLoadError as error:
                failures.append((path, error.reason))
        return failures

    def unreadable_policy(self, config: SiteView) -> tuple[bool, str]:
        if config.settings.on_unreadable == "error":
            return True, 'on_unreadable: error stops the site; fix the file, or set "skip"'
        return False, "left out: on_unreadable is skip"

    def probe_input(self, preprocessing: Mapping[str, Any]) -> torch.Tensor:
        size = int(preprocessing.get("image_size", 224))
        channels = int(preprocessing.get("in_channels", 1))
        images = torch.randint(
            0, 256, (2, 1, size, size), generator=torch.Generator().manual_seed(0), dtype=torch.uint8
        )
        normalize = bool(preprocessing.get("imagenet_normalize", True))
        return image_batch_transform(size, train=False, in_channels=channels, imagenet_normalize=normalize)(images)

    def bundle_parts(self, preprocessing: Mapping[str, Any], class_count: int) -> BundleParts:
        from .bundle import image_bundle_parts

        return image_bundle_parts(preprocessing, class_count)


MODALITY = ImageModality()
