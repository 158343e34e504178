"""What an image site's config says about its images: the fields this modality owns, and their checks.

They sit flat in the site config's JSON next to the general fields (``"image_size": 224``); the config keeps them as
``config.settings``, an :class:`ImageSettings`. Defaults are the papers' settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.errors import SiteConfigError
from .names import CO_OCCURRENCES, DENSENET121, NETWORKS, ON_ERROR_POLICIES, SHARED_ROWS

ACCEPT_NON_CHEST = "accept_non_chest"  # the setting (and predict's given preprocessing) that reads any DICOM
MIN_IMAGE_SIZE = 16  # DenseNet121 halves an image five times
CHANNEL_COUNTS = (1, 3)  # grayscale, or grayscale replicated to RGB (ImageNet weights)


@dataclass
class EmbeddedDataSettings:
    """The generated dataset an image site trains on when ``data.location`` is null."""

    patients: int = 200
    image_size: int = 64
    seed: int = 0
    # findings left out of the images (the benchmark's absent control: a site's unlabelled findings, not drawn)
    absent: list[str] = field(default_factory=list)
    # how the findings its layout does not label are drawn (names.CO_OCCURRENCES): given the 7 shared findings, or
    # from PadChest's rows, which label both vocabularies (the benchmark's co-occurrence check)
    co_occurrence: str = SHARED_ROWS


@dataclass
class ImageSettings:
    embedded: EmbeddedDataSettings = field(default_factory=EmbeddedDataSettings)
    image_size: int = 224  # the side the model sees, in pixels
    in_channels: int = 1
    imagenet_normalize: bool = True
    augment: bool = True
    cache_threads: int = 4  # threads decoding images into the preprocessing cache
    on_unreadable: str = "error"  # unreadable images: error (list them and stop) | skip (leave out, count)
    accept_non_chest: bool = False  # train on DICOMs whose Modality or BodyPartExamined is not a chest radiograph
    network: str = DENSENET121  # the model every site of a job trains (names.NETWORKS: the smoke one is for tests)

    def check(self, where: str) -> None:
        """Refuse a value training could not use; the error names ``where`` (the file) and the field."""

        def fail(name: str, message: str) -> SiteConfigError:
            return SiteConfigError(f"{where}: {name} {message}")

        positive = {
            "image_size": self.image_size,
            "embedded.patients": self.embedded.patients,
            "embedded.image_size": self.embedded.image_size,
            "cache_threads": self.cache_threads,
        }
        for name, value in positive.items():
            if value <= 0:
                raise fail(name, f"must be positive, got {value}")
        if self.image_size < MIN_IMAGE_SIZE:
            raise fail(
                "image_size",
                f"must be at least {MIN_IMAGE_SIZE} pixels (DenseNet121 downsamples 32x), got {self.image_size}",
            )
        if self.in_channels not in CHANNEL_COUNTS:
            raise fail("in_channels", f"must be 1 or 3, got {self.in_channels}")
        if self.network not in NETWORKS:
            raise fail("network", f"must be one of {list(NETWORKS)}, got {self.network!r}")
        if self.embedded.co_occurrence not in CO_OCCURRENCES:
            raise fail(
                "embedded.co_occurrence",
                f"must be one of {list(CO_OCCURRENCES)}, got {self.embedded.co_occurrence!r}",
            )
        if self.on_unreadable not in ON_ERROR_POLICIES:
            raise fail("on_unreadable", f"must be one of {list(ON_ERROR_POLICIES)}, got {self.on_unreadable!r}")
