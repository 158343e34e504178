"""One site's local training (no FLARE): load a global slice by class name, warm up the head, train, validate.

The FLARE client script and the non-federated baselines both drive this class.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .aggregation import DENSENET_HEAD, to_numpy
from .config import SiteConfig
from .labels import canonical_name
from .metrics import bce_loss, mean_defined, per_class_auroc
from .model import NamedDenseNet121, freeze_batchnorm, load_checkpoint, save_checkpoint, set_backbone_trainable
from .site import SiteData
from .training import Evaluation, make_loader, predict, resolve_device, train_epoch

logger = logging.getLogger(__name__)
Tracker = Callable[[str, float, int], None]  # (tag, value, step), e.g. a TensorBoard writer's add_scalar


def evaluation_metrics(evaluation: Evaluation, prefix: str = "val") -> dict[str, float]:
    """Flat metric dict: ``<prefix>_loss``, ``<prefix>_mean_auroc``, ``<prefix>_auroc/<class>`` (defined ones)."""
    metrics = {f"{prefix}_loss": evaluation.loss, f"{prefix}_mean_auroc": evaluation.mean_auroc}
    metrics.update({f"{prefix}_auroc/{name}": v for name, v in evaluation.per_class_auroc.items() if not math.isnan(v)})
    return {key: float(value) for key, value in metrics.items() if not math.isnan(value)}


def make_optimizer(config: SiteConfig, parameters, learning_rate: float) -> torch.optim.Optimizer:
    trainable = [p for p in parameters if p.requires_grad]
    if config.optimizer == "sgd":
        return torch.optim.SGD(trainable, lr=learning_rate, momentum=0.9, weight_decay=config.weight_decay)
    optimizer = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam
    return optimizer(trainable, lr=learning_rate, weight_decay=config.weight_decay)


@dataclass
class FitReport:
    warmup_losses: list[float] = field(default_factory=list)
    train_losses: list[float] = field(default_factory=list)
    samples: int = 0
    seconds: float = 0.0


class SiteTrainer:
    """Local model, loaders and loops of one site. The model's head rows are the site's classes, in its order."""

    def __init__(
        self,
        config: SiteConfig,
        data: SiteData,
        site_name: str = "site",
        log: logging.Logger = logger,
        tracker: Tracker | None = None,
    ) -> None:
        self.config = config
        self.data = data
        self.site_name = site_name
        self.log = log
        self.tracker = tracker
        if config.cpu_threads:
            torch.set_num_threads(config.cpu_threads)
        torch.manual_seed(config.seed)
        self.device = resolve_device(config.device)
        self.amp = config.amp and self.device.type == "cuda"
        self.scaler = torch.amp.GradScaler("cuda") if self.amp else None
        self.model = NamedDenseNet121(data.class_names, in_channels=config.in_channels).to(self.device)
        self.train_loader = make_loader(data.train, config.batch_size, True, config.workers, config.seed)
        self.val_loader = make_loader(data.val, config.batch_size, False, config.workers)
        self.epochs_done = 0  # step counter for training curves
        self.warmed_up = False

    @property
    def class_names(self) -> list[str]:
        return list(self.data.class_names)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {key: value.detach().cpu() for key, value in self.model.state_dict().items()}

    def save(self, path: str | Path) -> None:
        """Keep the local model on disk: FLARE may restart the site's process between tasks."""
        save_checkpoint(
            path,
            self.state_dict(),
            self.class_names,
            self.config.in_channels,
            epochs_done=self.epochs_done,
            warmed_up=self.warmed_up,
        )

    def restore(self, path: str | Path) -> bool:
        """Reload a model saved by :meth:`save` (same classes only); False when there is none."""
        path = Path(path)
        if not path.is_file():
            return False
        checkpoint = load_checkpoint(path)
        if checkpoint.class_names != self.class_names:
            self.log.warning(
                "%s: ignoring %s, saved for other classes %s", self.site_name, path, checkpoint.class_names
            )
            return False
        self.model.load_state_dict(checkpoint.state)
        self.epochs_done = int(checkpoint.meta.get("epochs_done", 0))
        self.warmed_up = bool(checkpoint.meta.get("warmed_up", False))
        return True

    def _assemble(
        self, state: Mapping[str, Any], class_names: Sequence[str]
    ) -> tuple[dict[str, torch.Tensor], list[str]]:
        """A state dict for the local model: ``state``'s backbone and, by name, its rows for our classes.

        Returns the state and the classes ``state`` has (rows of the others are left at zero).
        """
        index = {canonical_name(name): row for row, name in enumerate(class_names)}
        own = self.class_names
        local = self.model.state_dict()
        assembled: dict[str, torch.Tensor] = {}
        for key, template in local.items():
            if key in DENSENET_HEAD.keys:
                continue
            if key not in state:
                raise KeyError(f"received model has no {key!r}")
            assembled[key] = torch.as_tensor(to_numpy(state[key])).to(template.dtype).reshape(template.shape)
        weight = torch.zeros_like(local[DENSENET_HEAD.weight_key])
        bias = torch.zeros_like(local[DENSENET_HEAD.bias_key])
        received_weight = torch.as_tensor(to_numpy(state[DENSENET_HEAD.weight_key]))
        received_bias = torch.as_tensor(to_numpy(state[DENSENET_HEAD.bias_key]))
        if received_weight.shape[0] != len(class_names):
            raise ValueError(f"received head has {received_weight.shape[0]} rows for {len(class_names)} class names")
        present = [name for name in own if name in index]
        for row, name in enumerate(own):
            if name in index:
                weight[row] = received_weight[index[name]]
                bias[row] = received_bias[index[name]]
        assembled[DENSENET_HEAD.weight_key] = weight
        assembled[DENSENET_HEAD.bias_key] = bias
        return assembled, present

    def load_global(self, state: Mapping[str, Any], class_names: Sequence[str]) -> None:
        """Load a global model slice; it must hold rows for every class of this site."""
        assembled, present = self._assemble(state, class_names)
        missing = [name for name in self.class_names if name not in present]
        if missing:
            raise ValueError(f"the received model has no head rows for this site's classes {missing}")
        self.model.load_state_dict(assembled)

    def fit(self, round_number: int, warmup: bool, batchnorm_frozen: bool) -> FitReport:
        """Head warm-up (backbone frozen) when asked and not done yet, then the local epochs."""
        config = self.config
        freeze_batchnorm(self.model, batchnorm_frozen)
        report = FitReport()
        if warmup and not self.warmed_up and config.warmup_epochs > 0:
            set_backbone_trainable(self.model, False)
            optimizer = make_optimizer(config, self.model.parameters(), config.warmup_learning_rate)
            for epoch in range(config.warmup_epochs):
                result = self._epoch(optimizer, f"round {round_number} head warm-up", epoch, config.warmup_epochs)
                report.warmup_losses.append(result.loss)
                report.seconds += result.seconds
            set_backbone_trainable(self.model, True)
            self.warmed_up = True
        optimizer = make_optimizer(config, self.model.parameters(), config.learning_rate)
        for epoch in range(config.local_epochs):
            result = self._epoch(optimizer, f"round {round_number} training", epoch, config.local_epochs)
            report.train_losses.append(result.loss)
            report.samples = result.samples
            report.seconds += result.seconds
        return report

    def _reseed(self) -> None:
        """Shuffling and augmentation seeded by (seed, epochs so far): reproducible, different every
        epoch, and unaffected by FLARE restarting the site's process between rounds."""
        seed = self.config.seed * 1_000_003 + self.epochs_done
        self.train_loader.generator.manual_seed(seed)
        self.data.train.transform.set_random_state(seed=seed % 2**32)

    def _epoch(self, optimizer: torch.optim.Optimizer, phase: str, epoch: int, epochs: int):
        self._reseed()
        result = train_epoch(
            self.model,
            self.train_loader,
            optimizer,
            self.device,
            amp=self.amp,
            scaler=self.scaler,
            max_steps=self.config.max_batches_per_epoch,
            description=f"{self.site_name} {phase}",
        )
        self.epochs_done += 1
        self.log.info(
            "%s %s epoch %d/%d: loss %.4f on %d images in %.1f s (%.1f images/s)",
            self.site_name,
            phase,
            epoch + 1,
            epochs,
            result.loss,
            result.samples,
            result.seconds,
            result.samples / max(result.seconds, 1e-9),
        )
        self._track("train/loss", result.loss)
        return result

    def _track(self, tag: str, value: float) -> None:
        if self.tracker is not None and not math.isnan(value):
            self.tracker(tag, value, self.epochs_done)

    def validate(self, tag: str | None = None) -> Evaluation:
        """The local model on this site's validation split."""
        evaluation = self._evaluate(self.model, self.class_names)
        if tag:
            self._track(f"{tag}/loss", evaluation.loss)
            self._track(f"{tag}/mean_auroc", evaluation.mean_auroc)
        return evaluation

    def evaluate_state(self, state: Mapping[str, Any], class_names: Sequence[str]) -> Evaluation:
        """Any model (the union global model, another site's model) on this site's validation split,
        over the classes both have, picked by name. The local model is left untouched."""
        assembled, present = self._assemble(state, class_names)
        if not present:
            raise ValueError(f"the model's classes {list(class_names)} share none with this site's {self.class_names}")
        model = NamedDenseNet121(self.class_names, in_channels=self.config.in_channels).to(self.device)
        model.load_state_dict(assembled)
        return self._evaluate(model, present)

    def _evaluate(self, model: torch.nn.Module, classes: Sequence[str]) -> Evaluation:
        probabilities, labels, mask = predict(model, self.val_loader, self.device, self.amp)
        columns = [self.class_names.index(name) for name in classes]
        probabilities, labels, mask = probabilities[:, columns], labels[:, columns], mask[:, columns]
        aurocs = per_class_auroc(labels, probabilities, list(classes), mask)
        return Evaluation(bce_loss(labels, probabilities, mask), aurocs, mean_defined(aurocs), len(labels))


class ExchangeRecorder:
    """Keeps what a site received and sent each round (head rows with names, or full states).

    Lets a hospital verify what left the site, and lets tests check aggregation end to end.
    """

    def __init__(self, folder: str | Path, what: str = "head") -> None:
        self.folder = Path(folder)
        self.what = what

    def record(self, round_number: int, direction: str, state: Mapping[str, Any], class_names: Sequence[str]) -> None:
        if self.what == "off":
            return
        keys = DENSENET_HEAD.keys if self.what == "head" else tuple(state)
        payload = {
            "round": round_number,
            "direction": direction,
            "class_names": list(class_names),
            "state": {key: torch.as_tensor(np.array(to_numpy(state[key]))) for key in keys},
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        torch.save(payload, self.folder / f"round-{round_number:03d}-{direction}.pt")
