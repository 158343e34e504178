"""MONAI transform chains: uint8 grayscale array -> normalised float tensor (C, size, size).

As in the papers: resize, intensities to [0, 1], optionally ImageNet statistics, and at
training time random rotation, horizontal flip, zoom and contrast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from monai.transforms import (
    CastToType,
    Compose,
    EnsureChannelFirst,
    EnsureType,
    NormalizeIntensity,
    RandAdjustContrast,
    RandFlip,
    RandRotate,
    RandZoom,
    RepeatChannel,
    Resize,
    ScaleIntensityRange,
)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# One gray channel stands for R=G=B: use the channel means of ImageNet's statistics.
IMAGENET_GRAY_MEAN = sum(IMAGENET_MEAN) / 3
IMAGENET_GRAY_STD = sum(IMAGENET_STD) / 3


@dataclass(frozen=True)
class Augmentation:
    """Training-time augmentation; each applies with probability ``probability``."""

    rotate_degrees: float = 10.0
    horizontal_flip: bool = True
    zoom: tuple[float, float] = (0.9, 1.1)
    contrast_gamma: tuple[float, float] = (0.8, 1.2)
    probability: float = 0.5


def image_transforms(
    size: int,
    train: bool,
    in_channels: int = 1,
    imagenet_normalize: bool = True,
    augmentation: Augmentation | None = None,
) -> Compose:
    """The transform chain for one uint8 (H, W) image; ``train`` adds the augmentation."""
    if in_channels not in (1, 3):
        raise ValueError(f"in_channels must be 1 or 3, got {in_channels}")
    steps: list = [
        EnsureChannelFirst(channel_dim="no_channel"),
        CastToType(dtype="float32"),
        ScaleIntensityRange(a_min=0.0, a_max=255.0, b_min=0.0, b_max=1.0, clip=True),
        Resize((size, size), mode="area"),
    ]
    if train:
        aug = augmentation or Augmentation()
        p = aug.probability
        if aug.rotate_degrees > 0:
            steps.append(RandRotate(range_x=math.radians(aug.rotate_degrees), prob=p, padding_mode="border"))
        if aug.horizontal_flip:
            steps.append(RandFlip(prob=p, spatial_axis=1))
        if aug.zoom != (1.0, 1.0):
            steps.append(RandZoom(min_zoom=aug.zoom[0], max_zoom=aug.zoom[1], prob=p, padding_mode="edge"))
        if aug.contrast_gamma != (1.0, 1.0):
            steps.append(RandAdjustContrast(prob=p, gamma=aug.contrast_gamma))
    if in_channels == 3:
        steps.append(RepeatChannel(repeats=3))
    if imagenet_normalize:
        mean = IMAGENET_MEAN if in_channels == 3 else (IMAGENET_GRAY_MEAN,)
        std = IMAGENET_STD if in_channels == 3 else (IMAGENET_GRAY_STD,)
        steps.append(NormalizeIntensity(subtrahend=mean, divisor=std, channel_wise=True))
    steps.append(EnsureType(data_type="tensor", track_meta=False))
    return Compose(steps)
