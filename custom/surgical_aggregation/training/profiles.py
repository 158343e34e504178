"""Every authored training setting, once: the papers' settings, the demo runs and the report labeller.

A profile is the site-config fields that differ from :class:`~surgical_aggregation.training.config.SiteConfig`'s
defaults (which are the papers' settings), plus the federation's budget and the patient split. The
bundle's jobs (``flare.recipe``), the experiment grids and the provisioned site-config template all
read these; nothing else authors a learning rate or a number of rounds.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# 10,000 images of the 32 shapes, 8 epochs: ~26 minutes on 2 CPU cores at 64 px (the bundle ships it); its own shapes at
# validation mean AUROC 0.91 after it (docs/stand-in/rebuild-amd-epyc-25-17.json)
STAND_IN_PRETRAINING: Mapping[str, int] = {"images": 10000, "epochs": 8}


# The papers' fine-tuning from ImageNet weights: Adam at 5e-5 after a 15-epoch head warm-up at 5e-3 (their public code
# and the site config's default warm up at 1e-3, as long). From the stand-in the long warm-up matters: after one epoch
# site-nih's logits correlated 0.49-0.66 (mean 0.60) over the next 9 epochs, after fifteen 0.41-0.51 (mean 0.46):
# docs/benchmark/specificity-probe
PAPERS_WARMUP_EPOCHS = 15
PAPERS_FINE_TUNING: Mapping[str, float] = {
    "learning_rate": 5e-5,
    "warmup_learning_rate": 5e-3,
    "warmup_epochs": PAPERS_WARMUP_EPOCHS,
}


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    training: Mapping[str, Any] = field(default_factory=dict)  # site-config fields that differ from the defaults
    rounds: int = 150
    patience: int = 25  # validated rounds without improvement of the mean validation loss
    min_delta: float = 1e-4  # the improvement that counts
    split_fractions: tuple[float, float, float] = (0.7, 0.1, 0.2)  # train / validation / test, by patient
    # the embedded stand-in for ImageNet weights (experiments.pretraining): generated pattern images, epochs; one
    # stand-in for the demo runs and the benchmark, as one ImageNet checkpoint serves every study
    pretraining: Mapping[str, int] = field(default_factory=lambda: dict(STAND_IN_PRETRAINING))
    # the benchmark's head-only variant (experiments.head_only.HeadRecipe): how a site trains its head on features
    head_only: Mapping[str, Any] = field(default_factory=dict)
    embedded_patients: int = 400  # the grids' embedded datasets (experiments.grids.DataSources)

    def __post_init__(self) -> None:
        if not isinstance(self.description, str):  # e.g. the training settings given in its place
            raise TypeError(
                f"profile {self.name!r}: description must be a string, got {type(self.description).__name__}"
            )

    def site_config(self, data: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
        """A site config dict: ``data`` (kind, location, labels, ...) with this profile's split and training."""
        return {
            "data": {**data, "split_fractions": list(self.split_fractions)},
            **copy.deepcopy(dict(self.training)),
            **fields,
        }


PAPER = Profile(
    "paper",
    "The papers' settings (the site config's defaults, but the warm-up's rate): DenseNet121 at 224 px, batch 64, Adam "
    "at 5e-5 after a 15-epoch head warm-up at 5e-3 (the papers'; their public code and the site config's default use "
    "1e-3), 1 local epoch per round, up to 150 rounds with patience 25, 70/10/20 split. Cache threads sized for a GPU "
    "machine (the loader's workers are the default, auto).",
    training={"cache_threads": 8, **PAPERS_FINE_TUNING},
)
DEMO = Profile(
    "demo",
    # from scratch on the embedded data: 3e-4 rather than the warm-up's 1e-3, at which the local
    # models' BatchNorm statistics lag badly
    "Minutes per federation on 2 CPU cores on the embedded data (400 patients a site), from scratch: 64 px, batch "
    "32, Adam at 3e-4 after a 1-epoch head warm-up, up to 12 rounds with patience 4, 60/20/20 split (10% of the "
    "patients would leave findings without a single validation positive).",
    training={
        "image_size": 64,
        "batch_size": 32,
        "learning_rate": 3e-4,
        "warmup_epochs": 1,
        "cache_threads": 2,
    },
    rounds=12,
    patience=4,
    split_fractions=(0.6, 0.2, 0.2),
)
BENCHMARK = Profile(
    "benchmark",
    "The embedded benchmark's grids (docs/benchmark): 64 px, batch 64, from the stand-in pretrained on 10,000 images "
    "of 32 glyph-like shapes for 8 epochs, fine-tuned at the papers' rates (Adam at 5e-5 after a 15-epoch head warm-up "
    "at 5e-3), on 1,600 embedded patients split 40/10/50 (a test split of about 1,600 images), up to 30 rounds with "
    "patience 6; the head-only variant's heads by Adam at 3e-2, 2 local epochs a round (early stopping then ends most "
    "federations within the 30 rounds).",
    training={**DEMO.training, "batch_size": 64, **PAPERS_FINE_TUNING},
    rounds=30,
    patience=6,
    split_fractions=(0.4, 0.1, 0.5),
    head_only={"learning_rate": 3e-2, "local_epochs": 2},
    embedded_patients=1600,
)
# The main job from the stand-in (flare.recipe.nih_chexpert_recipe's default start): the papers' fine-tuning on
# enough embedded patients a site that its best model scores findings apart (benchmarks/stand_in_transfer.py, issue 49:
# site-nih's logits correlated 0.92 at 400 patients a site, 0.78 at 600, 0.56 at 1,500 and 0.60 at 2,500 after a
# 1-epoch head warm-up; 0.46 at 1,500 after the papers' fifteen: docs/default-run/summary.json)
STAND_IN_JOB_PATIENTS = 1500
# Where the main job's backbone starts: the stand-in (``pretrained_weights`` naming it), a random initialisation, or
# a local ImageNet DenseNet121 checkpoint's path
STAND_IN, SCRATCH = JOB_STARTS = ("stand-in", "scratch")
REPORT = Profile(
    "report",
    "The report-labelling paper: the MLP over sentence embeddings, Adam at 1e-3, no warm-up, 20 aggregations, "
    "70/10/20 split.",
    training={"learning_rate": 1e-3, "warmup_epochs": 0},
    rounds=20,
)
# The bundle's demonstration jobs run shorter than their profile's budget. 10 aggregations keep `nvflare simulator
# jobs/report_labeling` to minutes on a CPU (the single-process simulator restarts each site for every task; the
# experiments use the report profile's 20); 3 rounds of seven sites keep jobs/cxr_consortium to minutes as well.
REPORT_JOB_ROUNDS = 10
CONSORTIUM_ROUNDS = 3
PROFILES: dict[str, Profile] = {profile.name: profile for profile in (PAPER, DEMO, BENCHMARK, REPORT)}
