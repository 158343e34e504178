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
    image_transforms,
)


def test_sixteen_bit_png_is_stretched_to_eight_bits(tmp_path):
    values = np.array([[1000, 3000], [5000, 9000]], dtype=np.uint16)
    Image.fromarray(values).save(tmp_path / "deep.png")
    array = read_grayscale(tmp_path / "deep.png")
    assert array.dtype == np.uint8
    assert array.tolist() == [[0, 64], [128, 255]]


def test_rgb_and_non_square_images_become_square_gray(tmp_path):
    rgb = np.zeros((30, 20, 3), np.uint8)
    rgb[..., 0] = 255
    Image.fromarray(rgb).save(tmp_path / "red.jpg", quality=100)
    array = read_grayscale(tmp_path / "red.jpg", 16)
    assert array.shape == (16, 16)
    assert abs(int(array.mean()) - 76) <= 2  # ITU-R 601 luma of pure red


def test_eval_transform_scales_to_unit_range_and_normalises():
    image = np.full((20, 20), 255, np.uint8)
    plain = image_transforms(16, train=False, imagenet_normalize=False)(image)
    assert isinstance(plain, torch.Tensor) and plain.shape == (1, 16, 16) and plain.dtype == torch.float32
    assert torch.allclose(plain, torch.ones(1, 16, 16))
    normalised = image_transforms(16, train=False)(image)
    assert torch.allclose(normalised, torch.full((1, 16, 16), (1 - IMAGENET_GRAY_MEAN) / IMAGENET_GRAY_STD))
    zeros = image_transforms(16, train=False, in_channels=3)(np.zeros((16, 16), np.uint8))
    assert zeros.shape == (3, 16, 16)
    assert torch.allclose(
        zeros[:, 0, 0], torch.tensor([-m / s for m, s in zip(IMAGENET_MEAN, (0.229, 0.224, 0.225), strict=True)])
    )


def test_train_transform_augments_but_keeps_shape():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (32, 32), dtype=np.uint8)
    transform = image_transforms(32, train=True)
    transform.set_random_state(seed=1)
    outputs = [transform(image) for _ in range(6)]
    assert all(o.shape == (1, 32, 32) for o in outputs)
    reference = image_transforms(32, train=False)(image)
    assert any(not torch.allclose(o, reference) for o in outputs)
    with pytest.raises(ValueError, match="in_channels must be 1 or 3"):
        image_transforms(32, train=False, in_channels=2)
