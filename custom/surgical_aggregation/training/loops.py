"""Local training and validation loops (no FLARE), for any model of the bundle: the site trainer and the
baselines share them. BatchNorm freezing (FedBN+) and the head warm-up's frozen backbone live here too."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from ..core.head import NAMED_HEAD
from ..core.methods import label_prior_weights
from ..core.progress import PROGRESS_SECONDS
from ..evaluation.metrics import (
    bce_loss,
    bce_loss_standard_error,
    image_losses,
    mean_defined,
    paired_auroc_difference,
    paired_loss_difference,
    per_class_auroc,
    recalibrated_probabilities,
)
from .parallel import RowShard

logger = logging.getLogger(__name__)
PREFETCH_BATCHES = 4  # per loader worker, on a GPU machine
CHECK_EVERY_STEPS = 50  # a non-finite loss is looked for (one host sync) this often, and at the end


def batchnorm_modules(model: nn.Module) -> Iterator[nn.modules.batchnorm._BatchNorm]:
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            yield module


class BatchNormReadings:
    """What a model's BatchNorm layers read of the images passed through it (eval mode), against what they assume.

    While open, each BatchNorm layer's inputs are summed per channel; :meth:`divergences` then gives, per layer, the
    mean over its channels of KL(N(m, v) || N(mu, sigma^2)): the Gaussian of the channel's inputs over these images
    (mean m, variance v, pooled over images and positions) against the layer's running statistics (mu, sigma^2),
    each variance plus the layer's eps. 0 where the statistics fit the images; a variance inflated k times reads
    (ln k + 1/k - 1) / 2, a mean moved d standard deviations d^2 / 2 more."""

    def __init__(self, model: nn.Module) -> None:
        self.layers = list(batchnorm_modules(model))
        # per layer: images x positions read, and the running mean and sum of squared deviations per channel, kept on
        # the model's device (no host sync per batch) in float64, merged batch by batch (Chan et al.'s pairwise
        # update); each batch's own moments in float32
        self._moments: list[tuple[float, torch.Tensor | None, torch.Tensor | None]] = [(0.0, None, None)] * len(
            self.layers
        )
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> BatchNormReadings:
        for index, layer in enumerate(self.layers):
            self._hooks.append(layer.register_forward_hook(self._reader(index)))
        return self

    def __exit__(self, *exc: object) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    def _reader(self, index: int) -> Callable[..., None]:
        def read(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            values = inputs[0].detach()
            dims = [0, *range(2, values.dim())]
            variance, mean = torch.var_mean(values.float(), dim=dims, correction=0)
            precise = torch.float32 if values.device.type == "mps" else torch.float64  # MPS has no float64
            count = values.numel() / values.shape[1]
            mean, squares = mean.to(precise), variance.to(precise) * count
            seen, old_mean, old_squares = self._moments[index]
            if old_mean is not None:
                total = seen + count
                delta = mean - old_mean
                mean = old_mean + delta * (count / total)
                squares = old_squares + squares + delta.square() * (seen * count / total)
                count = total
            self._moments[index] = (count, mean, squares)

        return read

    def divergences(self) -> np.ndarray | None:
        """(layers,) the mean KL of each layer's channels (NaN for a layer no image reached); None before any image
        (or for a model without BatchNorm)."""
        if not any(count for count, _, _ in self._moments):
            return None
        out = []
        for layer, (count, mean, squares) in zip(self.layers, self._moments, strict=True):
            if not count:
                out.append(math.nan)
                continue
            variance = squares.cpu().double() / count + layer.eps
            assumed = layer.running_var.detach().cpu().double() + layer.eps
            shift = mean.cpu().double() - layer.running_mean.detach().cpu().double()
            divergence = 0.5 * (torch.log(assumed / variance) + (variance + shift.square()) / assumed - 1)
            out.append(float(divergence.mean()))
        return np.asarray(out)


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
    """Batches of the dataset's items as stored (cached uint8 images, embeddings): the float work is the
    dataset's ``batch_transform``, on the training device. Pinned and prefetched when there is a GPU."""
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
        prefetch_factor=PREFETCH_BATCHES if workers > 0 else None,
    )


def model_inputs(loader: DataLoader, batch: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    """A batch's inputs on ``device``, through the dataset's batch step; channels-last for conv nets on a GPU."""
    inputs = loader.dataset.batch_transform(batch["image"].to(device, non_blocking=True))
    if device.type == "cuda" and inputs.dim() == 4:
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    return inputs


def place_model(model: nn.Module, device: torch.device) -> nn.Module:
    """The model on ``device``; channels-last on a GPU (what cuDNN's fastest convolutions read)."""
    model = model.to(device)
    return model.to(memory_format=torch.channels_last) if device.type == "cuda" else model


def masked_bce_terms(
    logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the labelled entries' BCE, number of labelled entries): the masked mean's two parts, which
    ranks training on parts of one batch add up before dividing."""
    losses = nn.functional.binary_cross_entropy_with_logits(logits.float(), target, reduction="none")
    if weights is not None:
        losses = losses * weights
    return (losses * mask).sum(), mask.sum()


def per_item_masked_bce_terms(
    logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over items of each item's BCE averaged over its own labelled entries, number of items): a loss whose
    gradient for one item does not depend on the others in its batch, as per-item clipping (DP-SGD) needs."""
    losses = nn.functional.binary_cross_entropy_with_logits(logits.float(), target, reduction="none") * mask
    per_item = losses.sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)
    return per_item.sum(), torch.tensor(float(len(per_item)), device=per_item.device)


def masked_bce_with_logits(
    logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """BCE averaged over the labelled entries only (mask 1); unlabelled entries add nothing.

    ``weights`` (same shape) re-weights the entries, e.g. FedSLD's label-prior weights.
    """
    summed, labelled = masked_bce_terms(logits, target, mask, weights)
    return summed / labelled.clamp_min(1.0)


def _autocast(device: torch.device, dtype: torch.dtype | None):
    return torch.autocast(device_type=device.type, dtype=dtype) if dtype is not None else nullcontext()


@dataclass
class EpochResult:
    loss: float
    samples: int
    seconds: float


class GraphedStep:
    """A training step (zero the gradients, forward, masked BCE, backward, the optimizer's step) captured once as a
    CUDA graph and replayed for every full batch of a phase, round after round.

    At small images and batches a GPU step of DenseNet121 is bound by launching its ~1,000 kernels one by one, not by
    the kernels; a replay launches them all at once. It is the eager step exactly: the capture's warm-up steps are
    undone (the model's state is put back), and :meth:`reset` starts the optimizer afresh in place before each
    phase, as a new optimizer would (the graph keeps its tensors). Adam and AdamW only (fused, capturable).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer_type: type[torch.optim.Optimizer],
        learning_rate: float,
        weight_decay: float,
        inputs: torch.Tensor,
        target: torch.Tensor,
        autocast: torch.dtype | None,
    ) -> None:
        self.model = model
        trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
        self.optimizer = optimizer_type(
            trainable, lr=learning_rate, weight_decay=weight_decay, fused=True, capturable=True
        )
        self.inputs = torch.zeros_like(inputs)
        self.target = torch.zeros_like(target)
        self.mask = torch.zeros_like(target)
        self.autocast = autocast
        saved = {key: value.detach().clone() for key, value in model.state_dict().items()}
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):  # allocations, cuDNN's choices and the optimizer's state, before the capture
                    self._step()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.loss = self._step()
        finally:
            model.load_state_dict(saved)  # the warm-up steps trained: undo them (a failed capture too)

    def _step(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=False)
        with _autocast(self.inputs.device, self.autocast):
            summed, labelled = masked_bce_terms(self.model(self.inputs), self.target, self.mask)
        loss = summed / labelled.clamp_min(1.0)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def fits(self, inputs: torch.Tensor) -> bool:
        """Whether a batch has the captured shape (a smaller last batch runs eagerly)."""
        return inputs.shape == self.inputs.shape

    def reset(self) -> None:
        """The optimizer as a new one would start (moments and step counts zero), in place."""
        for state in self.optimizer.state.values():
            for value in state.values():
                if torch.is_tensor(value):
                    value.zero_()

    def __call__(self, inputs: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One step on this batch; returns the batch's loss (on the device, overwritten by the next step)."""
        self.inputs.copy_(inputs)
        self.target.copy_(target)
        self.mask.copy_(mask)
        self.graph.replay()
        return self.loss


def train_epoch(
    model: nn.Module,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    autocast: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
    max_steps: int | None = None,
    progress: bool = False,
    description: str = "train",
    class_prior: torch.Tensor | None = None,
    penalty: Callable[[], torch.Tensor] | None = None,
    frozen_batchnorm: bool = False,
    log: logging.Logger = logger,
    shard: RowShard | None = None,
    graphed: GraphedStep | None = None,
    per_item_loss: bool = False,
) -> EpochResult:
    """One pass over ``loader`` (or ``max_steps`` batches); returns the sample-weighted mean loss.

    ``autocast``: the mixed-precision dtype (None: full precision); ``scaler`` for fp16. ``class_prior``
    (C,) turns on FedSLD's re-weighting; ``penalty()`` is added to every batch's loss (e.g. FedProx's
    proximal term) but not to the reported loss. ``frozen_batchnorm`` keeps BatchNorm statistics fixed
    (FedBN+). The losses stay on the device (no host sync per step): a non-finite one is found within
    ``CHECK_EVERY_STEPS`` steps and stops training with its step. ``shard``: this process is one of several
    training on the same batches (``model`` wrapped in DDP); it computes its rows of each batch, and the
    loss is scaled so that DDP's gradient average is the gradient of the whole batch's loss. ``graphed``: the phase's
    captured step (plain BCE, no shard, no scaler), replayed for every batch of its shape. ``per_item_loss``: each
    item's loss over its own labelled entries, averaged over the batch (DP-SGD: no item's gradient depends on another).
    """
    prior = None if class_prior is None else class_prior.to(device)
    train_mode(model, frozen_batchnorm)
    started = last_report = time.perf_counter()
    total = torch.zeros((), dtype=torch.float64, device=device)
    first_bad_step = torch.full((), -1, dtype=torch.long, device=device)
    samples, steps = 0, min(len(loader), max_steps) if max_steps is not None else len(loader)
    batches = tqdm(loader, desc=description, unit="batch", disable=not progress, leave=False, total=steps)
    for step, batch in enumerate(batches):
        if step >= steps:
            break
        inputs = model_inputs(loader, batch, device)
        target = batch["label"].to(device, non_blocking=True)
        mask = batch["mask"].to(device, non_blocking=True)
        count = len(inputs)  # the whole batch's samples
        if graphed is not None and graphed.fits(inputs):
            loss = graphed(inputs, target, mask)
            first_bad_step = torch.where(~torch.isfinite(loss) & (first_bad_step < 0), step, first_bad_step)
        else:
            loss, first_bad_step = _eager_step(
                model,
                optimizer,
                inputs,
                target,
                mask,
                autocast,
                scaler,
                prior,
                penalty,
                shard,
                step,
                first_bad_step,
                per_item_loss,
            )
        total += loss.detach().double() * count
        samples += count
        if (step + 1) % CHECK_EVERY_STEPS == 0:
            _stop_if_not_finite(first_bad_step, description, shard)
        if progress and (step + 1) % 10 == 0:
            batches.set_postfix(loss=f"{total.item() / samples:.4f}")
        elif not progress and time.perf_counter() - last_report > PROGRESS_SECONDS:
            last_report = time.perf_counter()
            log.info("%s: step %d/%d, loss %.4f so far", description, step + 1, steps, total.item() / samples)
    _stop_if_not_finite(first_bad_step, description, shard)
    if shard is not None:
        total = shard.total(total)  # each rank summed its share of every batch's loss
    return EpochResult(loss=total.item() / max(samples, 1), samples=samples, seconds=time.perf_counter() - started)


def _eager_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    inputs: torch.Tensor,
    target: torch.Tensor,
    mask: torch.Tensor,
    autocast: torch.dtype | None,
    scaler: torch.amp.GradScaler | None,
    prior: torch.Tensor | None,
    penalty: Callable[[], torch.Tensor] | None,
    shard: RowShard | None,
    step: int,
    first_bad_step: torch.Tensor,
    per_item_loss: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step launched kernel by kernel; returns (the batch's loss, the first non-finite step so far)."""
    if shard is not None:
        rows = shard.rows(len(inputs))
        inputs, target, mask = inputs[rows], target[rows], mask[rows]
    optimizer.zero_grad(set_to_none=True)
    with _autocast(inputs.device, autocast):
        if per_item_loss:
            summed, labelled = per_item_masked_bce_terms(model(inputs), target, mask)
        else:
            weights = None if prior is None else label_prior_weights(target, mask, prior)
            summed, labelled = masked_bce_terms(model(inputs), target, mask, weights)
    if shard is not None:
        labelled = shard.total(labelled)  # the whole batch's labelled entries
    loss = summed / labelled.clamp_min(1.0)  # with a shard: this process's share of the batch's loss
    objective = loss if shard is None else loss * shard.world  # DDP averages the ranks' gradients
    if penalty is not None:
        objective = objective + penalty()
    bad = ~torch.isfinite(objective.detach())
    first_bad_step = torch.where(bad & (first_bad_step < 0), step, first_bad_step)
    if scaler is not None:
        scaler.scale(objective).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        objective.backward()
        optimizer.step()
    return loss, first_bad_step


def _stop_if_not_finite(first_bad_step: torch.Tensor, description: str, shard: RowShard | None = None) -> None:
    if shard is not None:  # every rank stops together, at the first bad step any of them met
        first_bad_step = shard.largest(first_bad_step)
    step = int(first_bad_step.item())
    if step >= 0:
        raise FloatingPointError(
            f"{description}: the loss became NaN or infinite at step {step}; lower the learning rate"
        )


@torch.no_grad()
def predict(
    model: nn.Module,
    loader: DataLoader,
    device: torch.device,
    autocast: torch.dtype | None = None,
    progress: bool = False,
    description: str = "predict",
    log: logging.Logger = logger,
    logits: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(probabilities, labels, mask), each (N, n_classes); the probabilities stay on the device until the end.
    ``logits``: the model's logits (float32) instead of their probabilities, which saturate where logits are large."""
    model.eval()
    probabilities, labels, masks = [], [], []
    started = last_report = time.perf_counter()
    for step, batch in enumerate(tqdm(loader, desc=description, unit="batch", disable=not progress, leave=False)):
        with _autocast(device, autocast):
            scores = model(model_inputs(loader, batch, device)).float()
        probabilities.append(scores if logits else torch.sigmoid(scores))
        labels.append(batch["label"])
        masks.append(batch["mask"])
        if not progress and time.perf_counter() - last_report > PROGRESS_SECONDS:
            last_report = time.perf_counter()
            log.info("%s: batch %d/%d (%.0f s)", description, step + 1, len(loader), last_report - started)
    if not probabilities:
        raise ValueError("cannot evaluate on an empty dataset")
    return torch.cat(probabilities).cpu().numpy(), torch.cat(labels).numpy(), torch.cat(masks).numpy()


@torch.no_grad()
def head_inputs(
    model: nn.Module, loader: DataLoader, device: torch.device, autocast: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(features, labels, mask) on the CPU: what the model's named head reads for each item (DenseNet121: its
    1,024 pooled features), in float32, with the items' labels and label mask."""
    model.eval()
    head = model.get_submodule(NAMED_HEAD.weight_key.rsplit(".", 1)[0])
    captured: list[torch.Tensor] = []
    hook = head.register_forward_pre_hook(lambda module, inputs: captured.append(inputs[0].float()))
    labels, masks = [], []
    try:
        for batch in loader:
            with _autocast(device, autocast):
                model(model_inputs(loader, batch, device))
            labels.append(batch["label"])
            masks.append(batch["mask"])
    finally:
        hook.remove()
    if not captured:
        raise ValueError("cannot compute features of an empty dataset")
    return torch.cat(captured).cpu(), torch.cat(labels).float(), torch.cat(masks).float()


@dataclass
class Evaluation:
    loss: float
    per_class_auroc: dict[str, float]
    mean_auroc: float
    samples: int
    loss_se: float = math.nan  # the loss's standard error across images: the noise of this validation
    # each image's mean loss over its labelled classes (NaN: none), in the split's order: two models' figures on the
    # same images compare pairwise (evaluation.metrics.paired_loss_difference); never sent anywhere
    image_losses: np.ndarray | None = field(default=None, repr=False, compare=False)
    # the model's probabilities, and the images' labels and label mask, of the classes evaluated: two models' figures
    # on the same images compare pairwise (evaluation.metrics.paired_auroc_difference); never sent anywhere
    scores: np.ndarray | None = field(default=None, repr=False, compare=False)
    labels: np.ndarray | None = field(default=None, repr=False, compare=False)
    mask: np.ndarray | None = field(default=None, repr=False, compare=False)
    # per BatchNorm layer, how far its running statistics stand from what these images give
    # (:class:`BatchNormReadings`); None for a model without BatchNorm
    batchnorm_divergences: np.ndarray | None = field(default=None, repr=False, compare=False)

    def compared_with(self, other: Evaluation, recalibrated: bool = False) -> dict[str, float]:
        """Paired over the same images: this model's loss minus ``other``'s (``loss``, ``loss_se``), with
        ``recalibrated`` the same once each model is recalibrated in the large to these images (``recalibrated_loss``,
        ``recalibrated_loss_se``), and its
        mean AUROC minus ``other``'s (``auroc``, ``auroc_se``), where both carry their per-image figures, and the most
        any one BatchNorm layer's divergence exceeds ``other``'s (``batchnorm``); NaN for what cannot be compared."""
        figures = {
            "loss": math.nan,
            "loss_se": math.nan,
            "recalibrated_loss": math.nan,
            "recalibrated_loss_se": math.nan,
            "auroc": math.nan,
            "auroc_se": math.nan,
            "batchnorm": math.nan,
        }
        layers = (self.batchnorm_divergences, other.batchnorm_divergences)
        if all(value is not None for value in layers) and layers[0].shape == layers[1].shape:
            figures["batchnorm"] = float(np.max(layers[0] - layers[1]))
        losses = (self.image_losses, other.image_losses)
        if all(value is not None for value in losses) and losses[0].shape == losses[1].shape:
            figures["loss"], figures["loss_se"] = paired_loss_difference(*losses)
        both = (self.recalibrated_losses(), other.recalibrated_losses()) if recalibrated else (None, None)
        if all(value is not None for value in both) and both[0].shape == both[1].shape:
            figures["recalibrated_loss"], figures["recalibrated_loss_se"] = paired_loss_difference(*both)
        if self.scores is not None and other.scores is not None and self.scores.shape == other.scores.shape:
            figures["auroc"], figures["auroc_se"] = paired_auroc_difference(
                self.labels, self.scores, other.scores, self.mask
            )
        return figures

    def recalibrated_losses(self) -> np.ndarray | None:
        """Each image's loss once each class's logits are shifted to these images' prevalence
        (:func:`evaluation.metrics.recalibrated_probabilities`): what a model's ranking and spread cost, its base rate
        aside; None without the scores and labels. From the kept scores, so a restored evaluation has it too."""
        if self.scores is None or self.labels is None:
            return None
        return image_losses(self.labels, recalibrated_probabilities(self.labels, self.scores, self.mask), self.mask)

    def recalibrated_loss(self) -> float:
        """The mean of :meth:`recalibrated_losses` over the images with a label (NaN without)."""
        losses = self.recalibrated_losses()
        if losses is None or not np.isfinite(losses).any():
            return math.nan
        return float(np.nanmean(losses))

    @classmethod
    def of(
        cls, labels: np.ndarray, probabilities: np.ndarray, class_names: Sequence[str], mask: np.ndarray | None
    ) -> Evaluation:
        """BCE loss (and its standard error) and per-class / mean AUROC of ``probabilities`` against ``labels``."""
        aurocs = per_class_auroc(labels, probabilities, list(class_names), mask)
        return cls(
            loss=bce_loss(labels, probabilities, mask),
            per_class_auroc=aurocs,
            mean_auroc=mean_defined(aurocs),
            samples=len(labels),
            loss_se=bce_loss_standard_error(labels, probabilities, mask),
            image_losses=image_losses(labels, probabilities, mask),
            scores=np.asarray(probabilities, dtype=np.float32),
            labels=np.asarray(labels),
            mask=None if mask is None else np.asarray(mask),
        )


def evaluate(
    model: nn.Module,
    loader: DataLoader,
    device: torch.device,
    class_names: Sequence[str],
    autocast: torch.dtype | None = None,
    progress: bool = False,
) -> Evaluation:
    """Validation BCE loss and per-class / mean AUROC (undefined classes are NaN, left out of the mean)."""
    probabilities, labels, mask = predict(model, loader, device, autocast, progress)
    return Evaluation.of(labels, probabilities, class_names, mask)
