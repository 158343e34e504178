"""Non-federated baselines, trained by the same site trainer as the federation (no FLARE):

* centralized: the sites' data pooled into one training set over the union of their classes,
  a class a dataset does not label counting as negative there (the papers' convention);
* individual: one model per dataset, on all of that dataset's labels.

Both train like the federation they are compared with: the same initial model (the same backbone, the
same fresh head rows by class name), the same BatchNorm handling (the method's backbone strategy: FedBN+
freezes it), the federation's budget (``rounds`` x the local epochs, after the same head warm-up; a
per-site cap of batches per epoch becomes the pooled cap of all sites) and the same model selection: the
round with the lowest validation loss is kept, with the same early stopping. Validation never counts a
missing class as negative. The last round's model is kept too.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.head import backbone_digest
from ..core.labels import union_labels
from ..core.methods import SiteMethod
from ..training.checkpoint import ARCHITECTURE_KEY, PREPROCESSING_KEY, save_checkpoint
from ..training.config import SiteConfig
from ..training.site_data import CombinedDataset, SiteData, prepare_site_data
from ..training.trainer import SiteTrainer

logger = logging.getLogger(__name__)


@dataclass
class BaselineResult:
    checkpoint: Path  # the selected model (lowest validation loss)
    last_checkpoint: Path  # the last round's
    class_names: list[str]
    best_epoch: int
    best_val_loss: float
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0
    initial_backbone: str = ""  # backbone_digest of the model as training started
    batchnorm: str = ""  # what training did with BatchNorm (its backbone strategy's record)


def pooled_site_data(configs: Mapping[str, SiteConfig], log: logging.Logger = logger) -> SiteData:
    """The sites' splits pooled over the union of their classes (training: missing = negative)."""
    parts = {site: prepare_site_data(config, log) for site, config in configs.items()}
    union = union_labels(*(parts[site].class_names for site in sorted(parts)))

    def pooled(split: str, missing: str) -> CombinedDataset:
        return CombinedDataset([getattr(part, split).relabelled(union, missing) for part in parts.values()])

    noun = next(iter(parts.values())).sample_noun
    return SiteData(union, pooled("train", "negative"), pooled("val", "unlabelled"), pooled("test", "unlabelled"), noun)


def pooled_config(configs: Mapping[str, SiteConfig]) -> SiteConfig:
    """The training settings of a model trained on the pooled data of ``configs``: the first config's, with a cap
    of batches per epoch (the sites' each) summed over the sites, so that a round sees as many images as a round of
    the federation."""
    config = next(iter(configs.values()))
    if config.max_batches_per_epoch is None or len(configs) == 1:
        return config
    return dataclasses.replace(config, max_batches_per_epoch=config.max_batches_per_epoch * len(configs))


def train_pooled(
    configs: Mapping[str, SiteConfig],
    rounds: int,
    checkpoint: str | Path,
    patience: int = 25,
    min_delta: float = 1e-4,
    name: str = "centralized",
    log: logging.Logger = logger,
    site_method: SiteMethod | None = None,
    initial_state: Callable[[list[str]], dict[str, Any]] | None = None,
) -> BaselineResult:
    """Train one model on the pooled data of ``configs`` (a single config: that site alone).

    The first config's training settings (image size, optimiser, learning rates, epochs) are used. ``site_method``: the
    backbone strategy the federations of the comparison use (FedBN+ freezes BatchNorm); ``initial_state(classes)``:
    the model every method starts from, with head rows for ``classes`` (None: the trainer's own seeded model).
    The selected model is written to ``checkpoint``, the last round's beside it (``<stem>-last.pt``).
    """
    if not configs:
        raise ValueError("train_pooled needs at least one site config")
    started = time.perf_counter()
    config = pooled_config(configs)
    data = pooled_site_data(configs, log) if len(configs) > 1 else prepare_site_data(config, log)
    log.info("%s: %s", name, data.summary())
    trainer = SiteTrainer(config, data, name, log)
    if site_method is not None:
        trainer.set_method(site_method)
    if initial_state is not None:
        trainer.load_global(initial_state(list(data.class_names)), data.class_names)
    meta = {ARCHITECTURE_KEY: trainer.modality.architecture, PREPROCESSING_KEY: trainer.preprocessing}
    initial_backbone = backbone_digest(trainer.state_dict())
    best_loss, best_epoch, stale = math.inf, -1, 0
    history: list[dict[str, float]] = []
    checkpoint = Path(checkpoint)
    last = checkpoint.with_name(f"{checkpoint.stem}-last{checkpoint.suffix}")
    for round_number in range(rounds):
        report = trainer.fit(round_number, warmup=round_number == 0)
        evaluation = trainer.validate()
        history.append(
            {
                "round": round_number,
                "train_loss": report.train_losses[-1],
                "val_loss": evaluation.loss,
                "val_mean_auroc": evaluation.mean_auroc,
            }
        )
        log.info(
            "%s round %d/%d: train loss %.4f, validation loss %.4f, mean AUROC %.4f",
            name,
            round_number + 1,
            rounds,
            report.train_losses[-1],
            evaluation.loss,
            evaluation.mean_auroc,
        )
        if evaluation.loss < best_loss - min_delta:
            best_loss, best_epoch, stale = evaluation.loss, round_number, 0
            save_checkpoint(
                checkpoint,
                trainer.state_dict(),
                trainer.head_classes,
                round=round_number,
                method=name,
                **meta,
            )
        else:
            stale += 1
        save_checkpoint(
            last,
            trainer.state_dict(),
            trainer.head_classes,
            round=round_number,
            method=name,
            **meta,
        )
        if stale >= patience:
            log.info("%s: early stop after %d rounds without improvement", name, patience)
            break
    return BaselineResult(
        checkpoint,
        last,
        trainer.head_classes,
        best_epoch,
        best_loss,
        history,
        time.perf_counter() - started,
        initial_backbone,
        trainer.site_method.strategy.batchnorm,
    )
