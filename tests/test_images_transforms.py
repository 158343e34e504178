from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from surgical_aggregation.images.decode import read_grayscale
from surgical_aggregation.images.transforms import (
    IMAGENET_GRAY_MEAN,
    IMAGENET_GRAY_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    Augmentation,
    ImageBatchTransform,
    image_batch_transform,
)


def test_sixteen_bit_png_is_stretched_to_eight_bits(tmp_path):
    block = np.ones((8, 8), dtype=np.uint16)  # 16 x 16: the smallest image that is read (MIN_IMAGE_SIDE)
    values = np.kron(np.array([[1000, 3000], [5000, 9000]], dtype=np.uint16), block)
    Image.fromarray(values).save(tmp_path / "deep.png")
    array = read_grayscale(tmp_path / "deep.png")
    assert array.dtype == np.uint8
    assert array.tolist() == np.kron(np.array([[0, 64], [128, 255]]), block).tolist()


def test_rgb_and_non_square_images_become_square_gray(tmp_path):
    rgb = np.zeros((30, 20, 3), np.uint8)
    rgb[:, :10, 0] = 255  # left half pure red, right half pure green
    rgb[:, 10:, 1] = 255
    Image.fromarray(rgb).save(tmp_path / "red_green.png")
    array = read_grayscale(tmp_path / "red_green.png", 16)
    assert array.shape == (16, 16)
    assert (array[:, 0] == 76).all() and (array[:, -1] == 150).all()  # ITU-R 601 luma of pure red, of pure green


def test_eval_step_scales_to_unit_range_and_normalises():
    batch = torch.full((2, 1, 16, 16), 255, dtype=torch.uint8)
    plain = image_batch_transform(16, train=False, imagenet_normalize=False)(batch)
    assert plain.shape == (2, 1, 16, 16) and plain.dtype == torch.float32
    assert torch.equal(plain, torch.ones(2, 1, 16, 16))
    normalised = image_batch_transform(16, train=False)(batch)
    assert torch.allclose(normalised, torch.full((2, 1, 16, 16), (1 - IMAGENET_GRAY_MEAN) / IMAGENET_GRAY_STD))
    zeros = image_batch_transform(16, train=False, in_channels=3)(torch.zeros(1, 1, 16, 16, dtype=torch.uint8))
    assert zeros.shape == (1, 3, 16, 16)
    expected = torch.tensor([-m / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD, strict=True)])
    assert torch.allclose(zeros[0, :, 0, 0], expected)
    larger = torch.zeros(1, 1, 16, 16, dtype=torch.uint8)
    assert image_batch_transform(8, train=False)(larger).shape == (1, 1, 8, 8)  # a cache at another size is resized
    with pytest.raises(ValueError, match="in_channels must be 1 or 3"):
        image_batch_transform(32, train=False, in_channels=2)


def _halves(size: int = 8) -> torch.Tensor:
    """One image: the left half black, the right half white."""
    image = torch.zeros(1, 1, size, size, dtype=torch.uint8)
    image[..., size // 2 :] = 255
    return image


def _only(**change) -> Augmentation:
    """Every augmentation off except ``change``, applied to every image."""
    off = {"rotate_degrees": 0.0, "horizontal_flip": False, "zoom": (1.0, 1.0), "contrast_gamma": (1.0, 1.0)}
    return Augmentation(**{**off, "probability": 1.0, **change})


def test_flip_zoom_and_contrast_by_hand():
    plain = ImageBatchTransform(8, imagenet_normalize=False)
    flipped = ImageBatchTransform(8, imagenet_normalize=False, augmentation=_only(horizontal_flip=True))
    assert torch.allclose(flipped(_halves()), plain(_halves()).flip(-1), atol=1e-6)
    # zoom x2 about the centre: output pixel centres sample the input at half their distance from the centre
    zoomed = ImageBatchTransform(8, imagenet_normalize=False, augmentation=_only(zoom=(2.0, 2.0)))(_halves())
    row = torch.tensor([0, 0, 0, 0.25, 0.75, 1, 1, 1])
    assert torch.allclose(zoomed[0, 0], row.expand(8, 8), atol=1e-6)
    # contrast: rescaled by the image's own range (here [0, 1]) and raised to gamma 2
    ramp = torch.arange(0, 256, 17, dtype=torch.uint8)[:8].repeat(8, 1).view(1, 1, 8, 8)
    curved = ImageBatchTransform(8, imagenet_normalize=False, augmentation=_only(contrast_gamma=(2.0, 2.0)))(ramp)
    low, high = ramp.min() / 255, ramp.max() / 255
    expected = ((ramp / 255 - low) / (high - low)) ** 2 * (high - low) + low
    assert torch.allclose(curved, expected.float(), atol=1e-6)
    # a flat image stays flat whatever the warp (border padding)
    flat = torch.full((4, 1, 8, 8), 100, dtype=torch.uint8)
    everything = ImageBatchTransform(8, imagenet_normalize=False, augmentation=Augmentation(probability=1.0))
    assert torch.allclose(everything(flat), torch.full((4, 1, 8, 8), 100 / 255), atol=1e-6)


def test_augmentation_is_per_image_seeded_and_keeps_shape():
    images = torch.randint(0, 256, (6, 1, 32, 32), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    transform = image_batch_transform(32, train=True)
    transform.reseed(1)
    first = transform(images)
    transform.reseed(1)
    assert torch.equal(transform(images), first)  # the same seed, the same augmentation
    transform.reseed(2)
    assert not torch.equal(transform(images), first)
    reference = image_batch_transform(32, train=False)(images)
    assert first.shape == reference.shape == (6, 1, 32, 32)
    assert any(not torch.allclose(first[i], reference[i]) for i in range(6))
    # each operation applies with its probability, image by image: 1,000 flips at p = 0.5
    flip = ImageBatchTransform(8, imagenet_normalize=False, augmentation=_only(horizontal_flip=True, probability=0.5))
    flips = flip(_halves().expand(1000, -1, -1, -1))[:, 0, 0, 0] == 1  # a flipped image starts white
    assert 430 < int(flips.sum()) < 570
