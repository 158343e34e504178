"""An offline stand-in for the papers' ImageNet start: a DenseNet121 backbone trained centrally on data that share no
finding with any site.

The papers start every model from ImageNet weights, and FedBN+ freezes BatchNorm at those weights' statistics.
Nothing can be downloaded here, and a DenseNet121 built from scratch holds BatchNorm's default statistics (mean 0,
variance 1): frozen, every BatchNorm is the identity and the network is unnormalised. This module trains the
backbone on generated pattern images (:func:`~surgical_aggregation.images.synthetic.generate_patterns`: 32
glyph-like 5x5 shapes, none of them a finding's drawing, in the same clutter as the sites' images, no finding at all)
at the profile's image size with its own recipe (Adam at 1e-3, batch 64, as a network is trained from scratch),
BatchNorm training normally, and saves it in the format ``--pretrained``
reads: ``{"state_dict": <backbone>, "pretraining": <what it was trained on>}``.

Like ImageNet for real X-rays, it has learnt to tell many small shapes apart in clutter, not the sites' findings:
its features can represent shapes it never saw, so fine-tuning can learn each finding (the 24 4x4 patterns it
learnt before gave features from which the full network learnt one generic score), and a model built on it scores
the findings at chance until the federation trains its head (the benchmark's pages show the
initial model's AUROC), and every method of a grid starts from it. The bundle ships the profiles' stand-in (64 px,
``SHIPPED_STAND_INS``); one at another size is cached under ``<cache>/pretrained/`` by its settings.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..core.errors import SiteConfigError
from ..core.head import NAMED_HEAD, extend_head
from ..data.storage import default_cache_root, exclusive, write_atomically
from ..images.names import DENSENET121
from ..images.synthetic import GENERATOR_VERSION, PATTERN_STRENGTH, generate_patterns
from ..images.synthetic_pixels import PATTERN_COUNT, PATTERN_VOCABULARY, pattern_glyphs
from ..training.checkpoint import initial_global_state
from ..training.config import SiteConfig, site_config_from_dict
from ..training.profiles import DEMO, STAND_IN_PRETRAINING, Profile
from ..training.site_data import prepare_site_data
from ..training.trainer import SiteTrainer

logger = logging.getLogger(__name__)

PRETRAINING_KEY = "pretraining"  # what a pretrained weights file says it was trained on
PRETRAINING_SPLIT = (0.9, 0.1, 0.0)  # train / validation / test: the patterns have no test use
# The profiles' stand-in ships with the bundle, so that no job or grid (a grid's runs span machines) waits 40 minutes
# for it or depends on another CPU building the same bits (its digest: docs/data.md, held by tests/test_recipe.py)
SHIPPED_STAND_INS = Path(__file__).resolve().parent / "stand_in"


@dataclass(frozen=True)
class Pretraining:
    """What the stand-in backbone is trained on and how (the profile gives the rest of the recipe)."""

    image_size: int
    images: int = 2000
    epochs: int = 5
    seed: int = 0
    # from scratch, as ImageNet models are trained: a rate far above the papers' fine-tuning one; the recipe is the
    # pretraining's own (with the image size, all the cached file's name holds), whichever profile asks for it
    learning_rate: float = 1e-3
    batch_size: int = 64
    # the shapes' brightness in multiples of a finding's, uniform in this range (benchmarks/specificity_probe.py)
    pattern_strength: tuple[float, float] = (PATTERN_STRENGTH, PATTERN_STRENGTH)
    # how many shapes it learns to tell apart (benchmarks/specificity_probe.py)
    shapes: int = PATTERN_COUNT
    # 0: each shape drawn on its own (about 3 an image); n: each image shows exactly n (benchmarks/specificity_probe.py)
    shapes_per_image: int = 0

    @classmethod
    def for_profile(cls, profile: Profile) -> Pretraining:
        """At the profile's image size, with its pretraining budget."""
        image_size = site_config_from_dict(profile.site_config({"kind": "nih"})).settings.image_size
        return cls(image_size, **dict(profile.pretraining))

    @property
    def name(self) -> str:
        low, high = self.pattern_strength
        # the default strength leaves the name (and so every cached stand-in) as it was before it could change
        strength = "" if (low, high) == (PATTERN_STRENGTH, PATTERN_STRENGTH) else f"-str{low:g}-{high:g}"
        shapes = "" if self.shapes == PATTERN_COUNT else f"-shapes{self.shapes}"
        per_image = f"-each{self.shapes_per_image}" if self.shapes_per_image else ""
        return (
            f"patterns-v{GENERATOR_VERSION}.{PATTERN_VOCABULARY}-{self.image_size}px-{self.images}i-{self.epochs}e"
            f"-lr{self.learning_rate:g}-b{self.batch_size}-s{self.seed}{strength}{shapes}{per_image}"
        )

    def settings(self) -> dict[str, Any]:
        """What a weights file records of these settings: the default vocabulary's size is left out, as from its name,
        so that a default build writes the record the shipped stand-in holds."""
        settings = asdict(self)
        if self.shapes == PATTERN_COUNT:
            del settings["shapes"]
        if not self.shapes_per_image:
            del settings["shapes_per_image"]
        return settings

    def describe(self) -> str:
        low, high = self.pattern_strength
        brightness = "" if low == high == PATTERN_STRENGTH else f", {low:g}-{high:g} times a finding's brightness"
        each = f", exactly {self.shapes_per_image} an image" if self.shapes_per_image else ""
        return (
            f"pretrained here: DenseNet121 trained centrally for {self.epochs} epochs (Adam at {self.learning_rate:g}) "
            f"on {self.images} generated images of {self.shapes} glyph-like shapes ({self.image_size} px"
            f"{brightness}{each}; no finding of any site)"
        )


def pretraining_site_config(
    pretraining: Pretraining, csv_path: Path, cache_root: str | Path | None = None
) -> SiteConfig:
    """The site config the stand-in trains with: the demo profile's settings around the pretraining's own recipe,
    whichever profile asked for the stand-in. The cached file's name holds only ``pretraining``'s settings, so nothing
    else may change what is trained (the benchmark profile's 15-epoch head warm-up once did, for the grids only)."""
    # the patterns are no finding: declared as the pretraining's own classes (they never leave this machine)
    patterns = list(pattern_glyphs(pretraining.shapes))
    values = DEMO.site_config(
        {"kind": "csv", "location": str(csv_path), "options": {"new_classes": patterns}},
        image_size=pretraining.image_size,
        learning_rate=pretraining.learning_rate,
        warmup_learning_rate=pretraining.learning_rate,
        batch_size=pretraining.batch_size,
        seed=pretraining.seed,
        record_exchanges="off",
    )
    if cache_root is not None:
        values["cache_dir"] = str(cache_root)
    values["data"]["split_fractions"] = list(PRETRAINING_SPLIT)
    return site_config_from_dict(values, "pretraining")


def shipped_stand_in(pretraining: Pretraining) -> Path | None:
    """The bundle's own copy of the stand-in ``pretraining`` names, where it ships one (the profiles' stand-in)."""
    path = SHIPPED_STAND_INS / f"{pretraining.name}.pt"
    return path if path.is_file() else None


def pretrained_backbone(
    pretraining: Pretraining,
    cache_root: str | Path | None = None,
    log: logging.Logger = logger,
    shipped: bool = True,
) -> Path:
    """The stand-in backbone's weights file: the bundle's copy (unless ``shipped`` is off), else the cached one, else
    trained now and cached; returns its path."""
    copy = shipped_stand_in(pretraining) if shipped else None
    if copy is not None:
        log.info("pretrained backbone: %s, shipped with the bundle (%s)", copy, pretraining.describe())
        return copy
    folder = Path(cache_root or default_cache_root()) / "pretrained"
    path = folder / f"{pretraining.name}.pt"
    with exclusive(folder):
        if path.is_file():
            log.info("pretrained backbone: %s (%s)", path, pretraining.describe())
            return path
        started = time.perf_counter()
        images = folder / f"{pretraining.name}-images"
        csv_path = generate_patterns(
            images,
            pretraining.images,
            pretraining.image_size,
            pretraining.seed,
            pretraining.pattern_strength,
            pretraining.shapes,
            pretraining.shapes_per_image,
        )
        config = pretraining_site_config(pretraining, csv_path, cache_root)
        data = prepare_site_data(config, log)
        log.info("pretraining on %s", data.summary())
        trainer = SiteTrainer(config, data, "pretraining", log)
        for epoch in range(pretraining.epochs):
            trainer.fit(epoch, warmup=epoch == 0)
            evaluation = trainer.validate()
            log.info(
                "pretraining epoch %d/%d: validation loss %.4f, mean AUROC %.4f",
                epoch + 1,
                pretraining.epochs,
                evaluation.loss,
                evaluation.mean_auroc,
            )
        backbone = {key: value for key, value in trainer.state_dict().items() if key not in NAMED_HEAD.keys}
        record = {**pretraining.settings(), "description": pretraining.describe(), "classes": len(data.class_names)}
        payload: dict[str, Any] = {"state_dict": backbone, PRETRAINING_KEY: json.dumps(record)}
        write_atomically(path, lambda handle: torch.save(payload, handle), "pretrained backbone")
        log.info("pretrained backbone in %.0f s: %s", time.perf_counter() - started, path)
    return path


def stand_in_preprocessing(image_size: int) -> dict[str, Any]:
    """What the stand-in at ``image_size`` is fed: the images of the pretraining's site config."""
    config = site_config_from_dict(DEMO.site_config({"kind": "nih"}, image_size=image_size))
    return config.modality.preprocessing(config)


def check_stand_in(preprocessing: Mapping[str, Any], where: str) -> None:
    """Refuse the stand-in for a model it cannot start: a DenseNet121 fed one-channel images, normalised as it was."""
    network = preprocessing.get("network", DENSENET121)
    if network != DENSENET121:
        raise SiteConfigError(
            f"{where}: the stand-in backbone is a {DENSENET121}, but the sites train a {network} (their site "
            "configs' network): start from scratch, or from weights of that network"
        )
    if "image_size" not in preprocessing:
        raise SiteConfigError(f"{where}: the stand-in backbone reads images; the sites' model reads {preprocessing}")
    expected = stand_in_preprocessing(int(preprocessing["image_size"]))
    differing = {key: preprocessing.get(key) for key in expected if preprocessing.get(key) != expected[key]}
    if differing:
        raise SiteConfigError(
            f"{where}: the stand-in backbone was trained on images fed as {expected}, but the sites feed {differing}: "
            "start from scratch, or from weights trained so"
        )


def stand_in_backbone(
    preprocessing: Mapping[str, Any], cache_root: str | Path | None = None, log: logging.Logger = logger
) -> Path:
    """The stand-in for a model fed as ``preprocessing`` says (DenseNet121 at its image size), trained now unless
    cached."""
    check_stand_in(preprocessing, "the initial global model")
    pretraining = Pretraining(int(preprocessing["image_size"]), **STAND_IN_PRETRAINING)
    return pretrained_backbone(pretraining, cache_root, log)


@dataclass(frozen=True)
class InitialModel:
    """The model every method of a comparison starts from, exactly as a federation's persistor and controller build
    it: the backbone seeded by the run's seed (or pretrained weights), and fresh head rows seeded by class name."""

    pretrained_weights: str | None = None
    description: str = "from scratch: DenseNet121 seeded by each run's seed, BatchNorm at its default statistics"

    @classmethod
    def from_weights(cls, path: str | Path, description: str | None = None) -> InitialModel:
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
        return cls(str(path), f"{description or 'pretrained weights'}: {path} (sha256 {digest}...)")

    def state(
        self, architecture: str, preprocessing: Mapping[str, Any], seed: int, classes: Sequence[str]
    ) -> dict[str, torch.Tensor]:
        """The initial global model with head rows for ``classes``."""
        state = initial_global_state(architecture, preprocessing, seed, self.pretrained_weights)
        extended, _ = extend_head(state, [], sorted(classes))
        return extended
