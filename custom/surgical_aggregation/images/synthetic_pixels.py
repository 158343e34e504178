"""The embedded images' pixels: each finding's glyph, the stand-in pretraining's patterns, the chest-like
background and its clutter, and how a source (a hospital's scanner) renders them."""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from ..core.labels import BUILTIN_VOCABULARY, CANONICAL_FINDINGS

GLYPH_CELLS = 5
_GLYPH_SEED = 20230301  # fixed: a finding's glyph must not depend on any dataset's seed
# The stand-in pretraining's vocabulary: many glyph-like 5x5 shapes, none of them a finding's drawing, so that its
# features can represent shapes it never saw (as ImageNet's do for chest X-rays) without having learnt any finding.
_PATTERN_SEED = 20261128
PATTERN_COUNT = 32  # with ~3 an image, as many positives each as a CPU's pretraining needs to learn them
PATTERN_VOCABULARY = 2  # 1: 24 4x4 patterns (features that did not transfer: one generic score after fine-tuning)
PATTERN_DISTANCE = 6  # cells between any two patterns (or one and the other's mirror image)
FINDING_DISTANCE = GLYPH_CELLS + 3  # cells between a pattern and any finding's glyph: as far as findings lie apart

# How hard the images are (evaluation.probe and the benchmark's pages report what they give).
FINDING_AMPLITUDE = (0.2, 0.45)  # a glyph's added brightness (times its strength: 1, or 0.5 when uncertain)
CLUTTER_SHAPES = 16  # mean number (Poisson) of structures per image that are not findings
CLUTTER_AMPLITUDE = (0.15, 0.4)  # their brightness, added or taken away
RIB_AMPLITUDE = 0.04
SOFT_TISSUE_AMPLITUDE = 0.05  # low-frequency shading over the whole image


# --- pixels -------------------------------------------------------------------------------------


def _acceptable(glyph: np.ndarray, others: Sequence[np.ndarray]) -> bool:
    """9-16 cells, not its own mirror image, >= 8 cells from every other glyph and its mirror image."""
    if not 9 <= glyph.sum() <= 16 or np.abs(glyph - glyph[:, ::-1]).sum() < 4:
        return False
    return all(np.abs(glyph - other).sum() >= 8 and np.abs(glyph - other[:, ::-1]).sum() >= 8 for other in others)


@functools.cache
def finding_glyphs() -> dict[str, np.ndarray]:
    """One distinct 5x5 binary glyph per CXR-LT finding (fixed for all datasets and runs).

    Any two glyphs, and any glyph and another's mirror image, differ in at least 8 of 25 cells.
    """
    rng = np.random.default_rng(_GLYPH_SEED)
    chosen: list[np.ndarray] = []
    for _ in CANONICAL_FINDINGS:
        while True:
            glyph = (rng.random((GLYPH_CELLS, GLYPH_CELLS)) < 0.5).astype(np.float32)
            if _acceptable(glyph, chosen):
                chosen.append(glyph)
                break
    return dict(zip(CANONICAL_FINDINGS, chosen, strict=True))


@functools.cache
def finding_glyph(name: str) -> np.ndarray:
    """The glyph of any finding: the CXR-LT findings' fixed table, else one derived from the name alone (its
    own generator), >= 8 cells from every table glyph; so any dataset's new findings get their own glyphs."""
    table = finding_glyphs()
    if name in table:
        return table[name]
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little"))
    while True:
        glyph = (rng.random((GLYPH_CELLS, GLYPH_CELLS)) < 0.5).astype(np.float32)
        if _acceptable(glyph, list(table.values())):
            return glyph


@dataclass(frozen=True)
class SourceStyle:
    """How one source's images look: the domain shift between hospitals."""

    body: float
    lung: float
    heart: float
    noise: float
    file_suffix: str
    aspect: float  # height / width


@functools.cache
def pattern_glyphs(count: int = PATTERN_COUNT) -> dict[str, np.ndarray]:
    """The stand-in pretraining's ``count`` 5x5 shapes (``"Pattern 001"`` ... beyond 99, else ``"Pattern 01"`` ...; a
    larger vocabulary begins with the smaller's shapes, drawn in the same order), drawn as findings' glyphs are
    (9-16 cells, none its own mirror image), any two (or one and the other's mirror image) at least
    :data:`PATTERN_DISTANCE` cells apart, and each at least :data:`FINDING_DISTANCE` cells from the glyph of every
    finding the built-in vocabulary knows (the main job's and the benchmark's among them) and its mirror image: a
    backbone pretrained on them has learnt no finding. A finding outside that vocabulary (most of PadChest's) has a
    glyph derived from its name, which lies as near a pattern as such glyphs lie to each other (never the same)."""
    findings = [finding_glyph(name) for name in BUILTIN_VOCABULARY.findings()]  # the fixed table's among them
    rng = np.random.default_rng(_PATTERN_SEED)
    chosen: list[np.ndarray] = []
    while len(chosen) < count:
        pattern = (rng.random((GLYPH_CELLS, GLYPH_CELLS)) < 0.5).astype(np.float32)
        if not 9 <= pattern.sum() <= 16 or np.abs(pattern - pattern[:, ::-1]).sum() < 4:
            continue
        if _apart(pattern, findings, FINDING_DISTANCE) and _apart(pattern, chosen, PATTERN_DISTANCE):
            chosen.append(pattern)
    digits = max(2, len(str(count)))
    return {f"Pattern {index:0{digits}d}": pattern for index, pattern in enumerate(chosen, start=1)}


def _apart(shape: np.ndarray, others: Sequence[np.ndarray], cells: int) -> bool:
    """``shape`` differs from each of ``others`` and from its mirror image in at least ``cells`` cells."""
    mirror = shape[:, ::-1]
    return all(np.abs(shape - other).sum() >= cells and np.abs(mirror - other).sum() >= cells for other in others)


def _add_clutter(image: np.ndarray, body: np.ndarray, rng: np.random.Generator) -> None:
    """Structures that are not findings, in place: line segments, rings and blobs of the glyphs' size, each
    brighter or darker than what it lies on."""
    height, width = image.shape
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    for _ in range(rng.poisson(CLUTTER_SHAPES)):
        kind = rng.integers(3)
        centre_y, centre_x = rng.uniform(0.2, 0.85) * height, rng.uniform(0.12, 0.88) * width
        amplitude = rng.uniform(*CLUTTER_AMPLITUDE) * rng.choice((-1.0, 1.0))
        if kind == 0:  # a line segment
            angle = rng.uniform(0, math.pi)
            length, thickness = rng.uniform(0.1, 0.35) * width, rng.uniform(0.8, 1.8) * max(1.0, width / 64)
            along = (x - centre_x) * math.cos(angle) + (y - centre_y) * math.sin(angle)
            across = np.abs((y - centre_y) * math.cos(angle) - (x - centre_x) * math.sin(angle))
            shape = (np.abs(along) < length / 2) & (across < thickness / 2 + 0.5)
        elif kind == 1:  # a ring
            radius = rng.uniform(0.03, 0.08) * width
            shape = np.abs(np.hypot(x - centre_x, y - centre_y) - radius) < max(1.0, width / 64)
        else:  # a blob
            radius = rng.uniform(0.02, 0.07) * width
            shape = np.exp(-((x - centre_x) ** 2 + (y - centre_y) ** 2) / (2 * radius * radius))
        image += amplitude * shape * body


def render_image(
    findings: dict[str, float],
    width: int,
    style: SourceStyle,
    rng: np.random.Generator,
    lateral: bool = False,
    glyphs: Callable[[str], np.ndarray] | None = None,
) -> np.ndarray:
    """A uint8 (height, width) chest-like image; ``findings`` maps finding -> glyph strength (0..1).

    ``glyphs``: a name's drawing (default :func:`finding_glyph`; the pretraining's patterns pass theirs).
    """
    glyph_of = glyphs or finding_glyph
    height = round(width * style.aspect)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    y /= height
    x /= width
    jitter = rng.normal(0, 0.02, 4)
    image = np.full((height, width), 0.08, np.float32)
    body = ((x - 0.5) / 0.46) ** 2 + ((y - 0.55) / 0.52) ** 2 < 1
    image[body] = style.body
    if lateral:
        lungs = ((x - 0.5 - jitter[0]) / 0.3) ** 2 + ((y - 0.5) / 0.33) ** 2 < 1
    else:
        left = ((x - 0.31 - jitter[0]) / 0.15) ** 2 + ((y - 0.5 - jitter[1]) / 0.3) ** 2 < 1
        right = ((x - 0.69 - jitter[2]) / 0.15) ** 2 + ((y - 0.5 - jitter[3]) / 0.3) ** 2 < 1
        lungs = left | right
    image[lungs] = style.lung
    rib_frequency, rib_phase = rng.uniform(9, 13), rng.uniform(0, 2 * math.pi)
    image += RIB_AMPLITUDE * lungs * np.sin(2 * math.pi * rib_frequency * (y + 0.25 * np.abs(x - 0.5)) + rib_phase)
    heart = ((x - 0.56) / 0.13) ** 2 + ((y - 0.66) / 0.12) ** 2 < 1
    image[heart & body] = style.heart
    image *= rng.uniform(0.9, 1.1)
    shading = Image.fromarray(rng.normal(0, 1, (6, 6)).astype(np.float32)).resize((width, height), Image.BICUBIC)
    image += SOFT_TISSUE_AMPLITUDE * np.asarray(shading)
    _add_clutter(image, body, rng)

    cell = max(1, width // 16)
    for name, strength in findings.items():
        if strength <= 0:
            continue
        stamp = np.kron(glyph_of(name), np.ones((cell, cell), np.float32))
        size_y, size_x = stamp.shape
        top = rng.integers(int(0.2 * height), max(int(0.2 * height) + 1, int(0.82 * height) - size_y))
        left_edge = rng.integers(int(0.12 * width), max(int(0.12 * width) + 1, int(0.88 * width) - size_x))
        image[top : top + size_y, left_edge : left_edge + size_x] += strength * rng.uniform(*FINDING_AMPLITUDE) * stamp
    image += rng.normal(0, style.noise, image.shape).astype(np.float32)
    return np.clip(np.rint(image * 255), 0, 255).astype(np.uint8)
