"""The linear probe: how much of a site's task a backbone's features already solve, with no training of the backbone.

A logistic regression per class, fitted on a frozen backbone's pooled features of the site's training split
(standardised), scored by AUROC on its test split. On a *randomly initialised* DenseNet121 it says whether the task
needs training at all: the embedded data are built so that it stays near chance (the bundle's test holds the default
job's sites at or below :data:`RANDOM_PROBE_CEILING`), and the trained job's models beat it by a margin the
benchmark's pages report. On the stand-in pretrained backbone it says what the stand-in knows of the sites' findings.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from ..core.devices import resolve_device
from ..core.head import NAMED_HEAD
from ..training.config import SiteConfig
from ..training.loops import head_inputs, make_loader, place_model
from ..training.site_data import SiteData, prepare_site_data
from .metrics import auroc, mean_defined

logger = logging.getLogger(__name__)
RANDOM_PROBE_CEILING = 0.65  # what a randomly initialised backbone's probe may reach on the default job's sites
PROBE_SEED = 0  # the random backbone's seed


@dataclass
class ProbeReport:
    backbone: str  # what the features came from
    per_class_auroc: dict[str, float]  # on the test split; NaN where a class lacks positives or negatives
    mean_auroc: float
    train_images: int
    test_images: int


def without_augmentation(config: SiteConfig) -> SiteConfig:
    """The config with its modality's training augmentation off (features are read once, as they are)."""
    if not hasattr(config.settings, "augment"):
        return config
    return dataclasses.replace(config, settings=dataclasses.replace(config.settings, augment=False))


def backbone_model(config: SiteConfig, classes: list[str], backbone: Mapping[str, Any] | None, seed: int) -> Any:
    """The site's model: ``backbone``'s weights (its head keys ignored) or, without it, seeded at random."""
    torch.manual_seed(seed)
    model = config.modality.build_model(classes, config.modality.preprocessing(config))
    if backbone is not None:
        own = model.state_dict()
        model.load_state_dict({**own, **{k: v for k, v in backbone.items() if k not in NAMED_HEAD.keys}})
    return model


def linear_probe(
    config: SiteConfig,
    backbone: Mapping[str, Any] | None = None,
    description: str = f"DenseNet121 initialised at random (seed {PROBE_SEED})",
    data: SiteData | None = None,
    log: logging.Logger = logger,
) -> ProbeReport:
    """Fit the probe on the site's training split, score it on its test split."""
    config = without_augmentation(config)
    data = data or prepare_site_data(config, log)
    device = resolve_device(config.device)
    model = place_model(backbone_model(config, list(data.class_names), backbone, PROBE_SEED), device)
    train_x, train_y, train_mask = head_inputs(model, make_loader(data.train, config.batch_size, False), device)
    test_x, test_y, test_mask = head_inputs(model, make_loader(data.test, config.batch_size, False), device)
    scaler = StandardScaler().fit(train_x.numpy())
    train_x, test_x = scaler.transform(train_x.numpy()), scaler.transform(test_x.numpy())
    aurocs = {}
    for column, name in enumerate(data.class_names):
        labelled, tested = train_mask[:, column].numpy() > 0, test_mask[:, column].numpy() > 0
        targets = train_y[labelled, column].numpy()
        if len(np.unique(targets)) < 2:  # nothing to fit: undefined, like a class without test positives
            aurocs[name] = math.nan
            continue
        fitted = LogisticRegression(max_iter=2000).fit(train_x[labelled], targets)
        aurocs[name] = auroc(test_y[tested, column].numpy(), fitted.decision_function(test_x[tested]))
    report = ProbeReport(description, aurocs, mean_defined(aurocs), len(train_x), len(test_x))
    log.info("linear probe on %s: mean test AUROC %.3f over %d images", description, report.mean_auroc, len(test_x))
    return report
