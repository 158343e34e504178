"""Local training and validation loops (no FLARE), for any model of the bundle: the site trainer and the
baselines share them. BatchNorm freezing (FedBN+) and the head warm-up's frozen backbone live here too."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from monai.data import DataLoader
from torch import nn
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from .core.head import NAMED_HEAD
from .core.methods import label_prior_weights
from .metrics import bce_loss, mean_defined, per_class_auroc

logger = logging.getLogger(__name__)


def batchnorm_modules(model: nn.Module) -> Iterator[nn.modules.batchnorm._BatchNorm]:
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            yield module


def freeze_batchnorm(model: nn.Module, frozen: bool = True) -> None:
    """FedBN+: BatchNorm affine parameters stop learning (their statistics stay put via :func:`train_mode`)."""
    for module in batchnorm_modules(model):
        for parameter in module.parameters():
            parameter.requires_grad_(not frozen)


def train_mode(model: nn.Module, frozen_batchnorm: bool = False) -> None:
    """``model.train()``, with every BatchNorm layer kept in eval mode (running statistics fixed) when frozen."""
    model.train()
    if frozen_batchnorm:
        for module in batchnorm_modules(model):
            module.eval()


def set_backbone_trainable(model: nn.Module, trainable: bool, frozen_batchnorm: bool = False) -> None:
    """Head warm-up freezes everything but the named head; frozen BatchNorm (FedBN+) stays frozen."""
    frozen_bn = (
        {id(parameter) for module in batchnorm_modules(model) for parameter in module.parameters()}
        if frozen_batchnorm
        else set()
    )
    for name, parameter in model.named_parameters():
        if name in NAMED_HEAD.keys:
            parameter.requires_grad_(True)
        elif id(parameter) not in frozen_bn:
            parameter.requires_grad_(trainable)


def make_loader(dataset: Dataset, batch_size: int, train: bool, workers: int = 0, seed: int = 0) -> DataLoader:
    """MONAI's DataLoader seeds each worker's random transforms differently (plain torch does not)."""
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=train,
        drop_last=train and len(dataset) > batch_size,
        num_workers=workers,
        generator=generator,
        persistent_workers=workers > 0,
        pin_memory=torch.cuda.is_available(),
    )


def masked_bce_with_logits(
    logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """BCE averaged over the labelled entries only (mask 1); unlabelled entries add nothing.

    ``weights`` (same shape) re-weights the entries, e.g. FedSLD's label-prior weights.
    """
    losses = nn.functional.binary_cross_entropy_with_logits(logits.float(), target, reduction="none")
    if weights is not None:
        losses = losses * weights
    return (losses * mask).sum() / mask.sum().clamp_min(1.0)


def _autocast(device: torch.device, amp: bool):
    return torch.autocast(device_type="cuda", dtype=torch.float16) if amp and device.type == "cuda" else nullcontext()


@dataclass
class EpochResult:
    loss: float
    samples: int
    seconds: float


def train_epoch(
    model: nn.Module,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    amp: bool = False,
    scaler: torch.amp.GradScaler | None = None,
    max_steps: int | None = None,
    progress: bool = False,
    description: str = "train",
    class_prior: torch.Tensor | None = None,
    penalty: Callable[[], torch.Tensor] | None = None,
    frozen_batchnorm: bool = False,
) -> EpochResult:
    """One pass over ``loader`` (or ``max_steps`` batches); returns the sample-weighted mean loss.

    ``class_prior`` (C,) turns on FedSLD's re-weighting; ``penalty()`` is added to every batch's
    loss (e.g. FedProx's proximal term) but not to the reported loss. ``frozen_batchnorm`` keeps
    BatchNorm statistics fixed (FedBN+).
    """
    prior = None if class_prior is None else class_prior.to(device)
    train_mode(model, frozen_batchnorm)
    started = time.perf_counter()
    total, samples = 0.0, 0
    batches = tqdm(loader, desc=description, unit="batch", disable=not progress, leave=False)
    for step, batch in enumerate(batches):
        if max_steps is not None and step >= max_steps:
            break
        images = batch["image"].to(device, non_blocking=True)
        target = batch["label"].to(device, non_blocking=True)
        mask = batch["mask"].to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with _autocast(device, amp):
            weights = None if prior is None else label_prior_weights(target, mask, prior)
            loss = masked_bce_with_logits(model(images), target, mask, weights)
        objective = loss if penalty is None else loss + penalty()
        if not torch.isfinite(objective):
            raise FloatingPointError(
                f"{description}: loss became {objective.item()} at step {step}; lower the learning rate"
            )
        if scaler is not None:
            scaler.scale(objective).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            objective.backward()
            optimizer.step()
        total += loss.item() * len(images)
        samples += len(images)
        batches.set_postfix(loss=f"{total / samples:.4f}")
    return EpochResult(loss=total / max(samples, 1), samples=samples, seconds=time.perf_counter() - started)


@torch.no_grad()
def predict(
    model: nn.Module, loader: DataLoader, device: torch.device, amp: bool = False, progress: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(probabilities, labels, mask), each (N, n_classes)."""
    model.eval()
    probabilities, labels, masks = [], [], []
    for batch in tqdm(loader, desc="predict", unit="batch", disable=not progress, leave=False):
        with _autocast(device, amp):
            logits = model(batch["image"].to(device, non_blocking=True))
        probabilities.append(torch.sigmoid(logits.float()).cpu().numpy())
        labels.append(batch["label"].numpy())
        masks.append(batch["mask"].numpy())
    if not probabilities:
        raise ValueError("cannot evaluate on an empty dataset")
    return np.concatenate(probabilities), np.concatenate(labels), np.concatenate(masks)


@dataclass
class Evaluation:
    loss: float
    per_class_auroc: dict[str, float]
    mean_auroc: float
    samples: int


def evaluate(
    model: nn.Module,
    loader: DataLoader,
    device: torch.device,
    class_names: Sequence[str],
    amp: bool = False,
    progress: bool = False,
) -> Evaluation:
    """Validation BCE loss and per-class / mean AUROC (undefined classes are NaN, left out of the mean)."""
    probabilities, labels, mask = predict(model, loader, device, amp, progress)
    aurocs = per_class_auroc(labels, probabilities, class_names, mask)
    return Evaluation(
        loss=bce_loss(labels, probabilities, mask),
        per_class_auroc=aurocs,
        mean_auroc=mean_defined(aurocs),
        samples=len(labels),
    )
