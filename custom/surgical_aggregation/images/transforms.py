"""Image batches on the training device: uint8 batches from the preprocessing cache -> normalised float batches.

The loader only collates the cached uint8 images (no per-sample float work); this step runs once per
batch on the device that trains (GPU or CPU alike). As in the papers: intensities to [0, 1], optionally
ImageNet statistics, and at training time random rotation, horizontal flip, zoom and contrast.

Plain ``torch``: rotation, zoom and flip are one affine warp per image (``affine_grid`` +
``grid_sample``, border padding) and contrast is a gamma curve, a few lines each with no dependency
beyond torch; a library of batched augmentations (kornia) would add a package for these four
operations. The random parameters come from a CPU generator (seeded per epoch by the trainer), so a
seed gives the same augmentation on any device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# One gray channel stands for R=G=B: use the channel means of ImageNet's statistics.
IMAGENET_GRAY_MEAN = sum(IMAGENET_MEAN) / 3
IMAGENET_GRAY_STD = sum(IMAGENET_STD) / 3
CONTRAST_EPSILON = 1e-7  # keeps a flat image flat under the gamma curve


@dataclass(frozen=True)
class Augmentation:
    """Training-time augmentation; each applies to an image with probability ``probability``, independently.

    Rotation by an angle uniform in +-``rotate_degrees``; a horizontal flip; zoom by a factor uniform in
    ``zoom`` (above 1 enlarges and crops, below 1 shrinks and repeats the border); contrast: the image
    rescaled to [0, 1] by its own minimum and maximum, raised to a gamma uniform in ``contrast_gamma`` and
    scaled back.
    """

    rotate_degrees: float = 10.0
    horizontal_flip: bool = True
    zoom: tuple[float, float] = (0.9, 1.1)
    contrast_gamma: tuple[float, float] = (0.8, 1.2)
    probability: float = 0.5


class ImageBatchTransform:
    """uint8 (B, 1, H, W) on any device -> float32 (B, in_channels, size, size) on that device."""

    def __init__(
        self,
        size: int,
        in_channels: int = 1,
        imagenet_normalize: bool = True,
        augmentation: Augmentation | None = None,
    ) -> None:
        if in_channels not in (1, 3):
            raise ValueError(f"in_channels must be 1 or 3, got {in_channels}")
        self.size = size
        self.in_channels = in_channels
        self.augmentation = augmentation
        if imagenet_normalize:
            mean = IMAGENET_MEAN if in_channels == 3 else (IMAGENET_GRAY_MEAN,)
            std = IMAGENET_STD if in_channels == 3 else (IMAGENET_GRAY_STD,)
        else:
            mean, std = (0.0,) * in_channels, (1.0,) * in_channels
        self.mean = torch.tensor(mean).view(1, -1, 1, 1)
        self.std = torch.tensor(std).view(1, -1, 1, 1)
        self.generator = torch.Generator().manual_seed(0)

    def _statistics_on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The normalisation's mean and std on ``device``, copied there once rather than every batch."""
        if self.mean.device != device:
            self.mean, self.std = self.mean.to(device), self.std.to(device)
        return self.mean, self.std

    def reseed(self, seed: int) -> None:
        """The augmentation's random draws from here on (no effect without augmentation)."""
        self.generator.manual_seed(seed % 2**63)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if images.dim() == 3:
            images = images.unsqueeze(1)
        batch = images.float().div_(255.0)
        if batch.shape[-2:] != (self.size, self.size):
            batch = functional.interpolate(batch, size=(self.size, self.size), mode="area")
        if self.augmentation is not None and len(batch):
            batch = self._augment(batch, self.augmentation)
        if self.in_channels == 3:
            batch = batch.expand(-1, 3, -1, -1)
        mean, std = self._statistics_on(batch.device)
        return (batch - mean) / std

    def _draw(self, count: int, low: float, high: float, applies: torch.Tensor, neutral: float) -> torch.Tensor:
        values = low + (high - low) * torch.rand(count, generator=self.generator, dtype=torch.float64)
        return torch.where(applies, values, torch.full_like(values, neutral))

    def _augment(self, batch: torch.Tensor, aug: Augmentation) -> torch.Tensor:
        count, device = batch.shape[0], batch.device
        chosen = [torch.rand(count, generator=self.generator) < aug.probability for _ in range(4)]
        radians = math.radians(aug.rotate_degrees)
        angle = self._draw(count, -radians, radians, chosen[0] & (aug.rotate_degrees > 0), 0.0)
        flip = chosen[1] & aug.horizontal_flip
        zoom = self._draw(count, *aug.zoom, chosen[2], 1.0)
        gamma = self._draw(count, *aug.contrast_gamma, chosen[3], 1.0)

        warped = (angle != 0) | flip | (zoom != 1)
        if bool(warped.any()):
            # output -> input coordinates: (1 / zoom) * rotation * flip
            cos, sin, sign = torch.cos(angle) / zoom, torch.sin(angle) / zoom, torch.where(flip, -1.0, 1.0)
            theta = torch.zeros(count, 2, 3, dtype=torch.float64)
            theta[:, 0, 0], theta[:, 0, 1] = cos * sign, -sin
            theta[:, 1, 0], theta[:, 1, 1] = sin * sign, cos
            grid = functional.affine_grid(theta.to(device, batch.dtype), list(batch.shape), align_corners=False)
            moved = functional.grid_sample(batch, grid, mode="bilinear", padding_mode="border", align_corners=False)
            batch = torch.where(warped.to(device).view(-1, 1, 1, 1), moved, batch)

        contrasted = gamma != 1
        if bool(contrasted.any()):
            low = batch.amin(dim=(1, 2, 3), keepdim=True)
            spread = batch.amax(dim=(1, 2, 3), keepdim=True) - low
            exponent = gamma.to(device, batch.dtype).view(-1, 1, 1, 1)
            curved = ((batch - low) / (spread + CONTRAST_EPSILON)).pow(exponent) * spread + low
            batch = torch.where(contrasted.to(device).view(-1, 1, 1, 1), curved, batch)
        return batch


def image_batch_transform(
    size: int,
    train: bool,
    in_channels: int = 1,
    imagenet_normalize: bool = True,
    augmentation: Augmentation | None = None,
) -> ImageBatchTransform:
    """The batch step for training (``train``: with ``augmentation``, default :class:`Augmentation`) or
    evaluation."""
    chosen = (augmentation or Augmentation()) if train else None
    return ImageBatchTransform(size, in_channels, imagenet_normalize, chosen)
