"""Frozen features for the embedded images: a bank of the findings' glyph detectors.

For each finding of the CXR-LT table, its glyph (``images.synthetic``) is correlated with the image, normalised by the
image's local contrast (so a glyph scores the same on bright and dark ground), at its best place; each detector gives
that best correlation and the part of it above :data:`DETECTION_LEVEL`. The features are standardised with fixed
statistics, measured once per image size on a reference draw of embedded images, so every site reads its images the
same way whatever its data.

It knows the findings' drawings, as a backbone pretrained on chest X-rays knows the findings of real ones; it is what
the benchmark's head-only variant reads the embedded images with when the question is what each method does with the
heads (the stand-in pretrained backbone knows no finding, and its features are too weak to compare methods on).
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch.nn import functional

from ..core.labels import NIH_LABELS
from .synthetic import GENERATED
from .synthetic_labels import finding_donors, shown_findings
from .synthetic_pixels import finding_glyph, finding_glyphs, render_image

DETECTION_LEVEL = 0.6
REFERENCE_IMAGES = 512  # the reference draw the standardisation is measured on
REFERENCE_SEED = 20241125
MIN_SPREAD = 0.05  # a detector the reference draw hardly ever fires is not blown up by its tiny spread


def _detectors(size: int) -> torch.Tensor:
    cell = max(1, size // 16)
    glyphs = [np.kron(finding_glyph(name), np.ones((cell, cell), np.float32)) for name in finding_glyphs()]
    templates = torch.from_numpy(np.stack(glyphs))
    templates = templates - templates.mean(dim=(1, 2), keepdim=True)
    return (templates / templates.flatten(1).norm(dim=1)[:, None, None]).unsqueeze(1)


def raw_glyph_features(images: torch.Tensor) -> torch.Tensor:
    """(N, 2 x findings) for uint8 images (N, 1, H, W): each detector's best normalised correlation, and its part
    above :data:`DETECTION_LEVEL`."""
    x = images.float().div(255)
    templates = _detectors(x.shape[-1])
    side = templates.shape[-1]
    mean, square = functional.avg_pool2d(x, side, 1), functional.avg_pool2d(x * x, side, 1)
    spread = (square - mean * mean).clamp_min(1e-6).sqrt() * side
    best = (functional.conv2d(x, templates) / (spread + 1e-3)).amax(dim=(2, 3))
    return torch.cat([best, torch.relu(best - DETECTION_LEVEL)], dim=1)


@functools.cache
def _reference_statistics(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation of the raw features on a fixed draw of NIH-layout images of this size (built-in
    label frequencies, so the statistics need no file)."""
    rng = np.random.default_rng(REFERENCE_SEED)
    donors = finding_donors(False)
    style = GENERATED["nih"].style
    images = []
    for index in range(REFERENCE_IMAGES):
        labelled = {name: float(rng.random() < 0.08) for name in NIH_LABELS}
        shown = shown_findings(labelled, NIH_LABELS, donors, rng)
        images.append(render_image(shown, size, style, np.random.default_rng([REFERENCE_SEED, index])))
    raw = raw_glyph_features(torch.from_numpy(np.stack(images)).unsqueeze(1))
    return raw.mean(dim=0), raw.std(dim=0).clamp_min(MIN_SPREAD)


def glyph_features(images: torch.Tensor) -> torch.Tensor:
    """The standardised glyph-detector features of uint8 images (N, 1, H, W) (square, as the cache stores them)."""
    mean, std = _reference_statistics(int(images.shape[-1]))
    return (raw_glyph_features(images) - mean) / std
