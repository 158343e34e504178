"""The benchmark's head-only variant: one frozen backbone, federations of linear heads on its features.

Every image goes through the frozen backbone once (:class:`FeatureBank`, cached by image path); each site then
trains only its classification head, a row per class, on those features (:class:`HeadLearner`), in the in-process
federation (:mod:`.federation`) under the same aggregation, methods and selection as the full network. A federation
takes seconds on a CPU, so whole grids of seeds, missing and absent, run where the full network cannot; what it cannot
show is what a method does to the backbone (vanilla FL's negatives also teach the shared features to ignore a
finding), which the full-network grid shows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from ..core.head import NAMED_HEAD, initial_head_rows
from ..core.methods import SiteMethod
from ..evaluation.inference import ensemble_probabilities
from ..evaluation.metrics import auroc
from ..images.glyph_features import glyph_features
from ..images.synthetic_pixels import finding_glyphs
from ..training.loops import Evaluation, masked_bce_with_logits
from ..training.trainer import FitReport

logger = logging.getLogger(__name__)
FEATURE_BATCH = 128


@dataclass
class Features:
    """Items' frozen features with their labels and label mask over ``class_names``."""

    values: torch.Tensor  # (N, D) float32
    labels: torch.Tensor  # (N, C)
    mask: torch.Tensor  # (N, C): 1 where the label is known
    class_names: list[str]

    def __len__(self) -> int:
        return len(self.values)

    def relabelled(self, classes: Sequence[str], missing: str) -> Features:
        """Label columns ``classes`` by name; a class these items do not label is ``missing``: "negative" (label 0,
        known: vanilla FL's and the centralized baseline's) or "unlabelled" (left out of the loss)."""
        if missing not in ("negative", "unlabelled"):
            raise ValueError(f"missing must be 'negative' or 'unlabelled', got {missing!r}")
        labels = torch.zeros(len(self), len(classes))
        mask = torch.full((len(self), len(classes)), 1.0 if missing == "negative" else 0.0)
        for column, name in enumerate(classes):
            if name in self.class_names:
                own = self.class_names.index(name)
                labels[:, column], mask[:, column] = self.labels[:, own], self.mask[:, own]
        return Features(self.values, labels, mask, list(classes))

    @staticmethod
    def pooled(parts: Sequence[Features]) -> Features:
        """Items of several sets stacked (they must share their class names)."""
        names = parts[0].class_names
        if any(part.class_names != names for part in parts):
            raise ValueError("pooled features must share their class names; relabel them to one list first")
        return Features(
            torch.cat([p.values for p in parts]),
            torch.cat([p.labels for p in parts]),
            torch.cat([p.mask for p in parts]),
            list(names),
        )


Extractor = Callable[[torch.Tensor, Dataset], torch.Tensor]  # (uint8 images (B, 1, H, W), their dataset) -> features


class FeatureBank:
    """A frozen extractor's features for any image dataset, computed once per image (by path) and kept in memory."""

    def __init__(self, extract: Extractor, feature_dim: int, description: str) -> None:
        self.extract = extract
        self.feature_dim = feature_dim
        self.description = description
        self._by_path: dict[str, torch.Tensor] = {}

    @classmethod
    def of_backbone(cls, model: torch.nn.Module, device: torch.device, description: str) -> FeatureBank:
        """A frozen model's head inputs (DenseNet121: its 1,024 pooled features), each batch through the dataset's
        own transform."""
        model = model.to(device).eval()
        head = model.get_submodule(NAMED_HEAD.weight_key.rsplit(".", 1)[0])

        @torch.no_grad()
        def extract(images: torch.Tensor, dataset: Dataset) -> torch.Tensor:
            captured: list[torch.Tensor] = []
            hook = head.register_forward_pre_hook(lambda module, inputs: captured.append(inputs[0].float().cpu()))
            try:
                model(dataset.batch_transform(images.to(device)))
            finally:
                hook.remove()
            return captured[0]

        return cls(extract, int(head.in_features), description)

    @classmethod
    def of_glyphs(cls) -> FeatureBank:
        """The embedded images' glyph detectors (:mod:`surgical_aggregation.images.glyph_features`)."""
        dim = 2 * len(finding_glyphs())
        return cls(lambda images, dataset: glyph_features(images), dim, "the findings' glyph detectors (frozen)")

    def of(self, dataset: Dataset) -> Features:
        """The features, labels and mask of an image dataset (a site's split; its augmentation is not used)."""
        paths = [str(path) for path in dataset.paths]
        unseen = [index for index, path in enumerate(paths) if path not in self._by_path]
        for start in range(0, len(unseen), FEATURE_BATCH):
            chunk = unseen[start : start + FEATURE_BATCH]
            batch = default_collate([dataset[index] for index in chunk])
            for index, values in zip(chunk, self.extract(batch["image"], dataset), strict=True):
                self._by_path[paths[index]] = values
        values = torch.stack([self._by_path[path] for path in paths])
        return Features(values, dataset.labels.float(), dataset.mask.float(), list(dataset.class_names))


@dataclass(frozen=True)
class HeadRecipe:
    """How a head-only site trains: Adam on its head rows, minibatches of its features."""

    learning_rate: float = 1e-3
    optimizer: str = "adam"  # or "sgd" (momentum 0.9)
    batch_size: int = 32
    local_epochs: int = 1
    warmup_epochs: int = 1  # the first round's extra epochs (the full network's head warm-up)


class HeadLearner:
    """A site that trains only its linear head on frozen features: the head-only variant's
    :class:`~surgical_aggregation.experiments.federation.Learner`."""

    def __init__(self, train: Features, val: Features, recipe: HeadRecipe, seed: int = 0, name: str = "site") -> None:
        self.train, self.val = train, val
        self.recipe = recipe
        self.seed = seed
        self.name = name
        self.site_method = SiteMethod()
        self.head_classes = list(train.class_names)
        feature_dim = train.values.shape[1]
        self.weight = torch.zeros(len(self.head_classes), feature_dim)
        self.bias = torch.zeros(len(self.head_classes))
        self.epochs_done = 0

    @property
    def class_names(self) -> list[str]:
        return list(self.train.class_names)

    def set_method(self, site_method: SiteMethod) -> None:
        self.site_method = site_method

    def load_global(self, state: Mapping[str, object], class_names: Sequence[str]) -> None:
        """The received rows, by name: its own classes, then (union-head methods) the others in the server's order."""
        names = list(class_names)
        if self.site_method.trains_union_head:
            own = [name for name in self.class_names if name in names]
            self.head_classes = [*own, *(name for name in names if name not in own)]
        else:
            self.head_classes = self.class_names
        missing = [name for name in self.head_classes if name not in names]
        if missing:
            raise ValueError(f"{self.name}: the received model has no head rows for {missing}")
        rows = [names.index(name) for name in self.head_classes]
        self.weight = torch.as_tensor(np.asarray(state[NAMED_HEAD.weight_key]))[rows].float().clone()
        self.bias = torch.as_tensor(np.asarray(state[NAMED_HEAD.bias_key]))[rows].float().clone()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {NAMED_HEAD.weight_key: self.weight.clone(), NAMED_HEAD.bias_key: self.bias.clone()}

    def _training_set(self) -> Features:
        if self.head_classes == self.class_names:
            return self.train
        return self.train.relabelled(self.head_classes, self.site_method.missing_labels)

    def fit(self, round_number: int, warmup: bool) -> FitReport:
        data = self._training_set()
        weight = self.weight.clone().requires_grad_(True)
        bias = self.bias.clone().requires_grad_(True)
        if self.recipe.optimizer == "sgd":
            optimizer = torch.optim.SGD([weight, bias], lr=self.recipe.learning_rate, momentum=0.9)
        else:
            optimizer = torch.optim.Adam([weight, bias], lr=self.recipe.learning_rate)
        epochs = self.recipe.local_epochs + (self.recipe.warmup_epochs if warmup else 0)
        report = FitReport(samples=len(data))
        for _ in range(epochs):  # shuffled by (seed, epochs so far), as the site trainer's loader is
            shuffle = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epochs_done)
            order = torch.randperm(len(data), generator=shuffle)
            total, steps = 0.0, 0
            for start in range(0, len(data), self.recipe.batch_size):
                rows = order[start : start + self.recipe.batch_size]
                logits = data.values[rows] @ weight.T + bias
                loss = masked_bce_with_logits(logits, data.labels[rows], data.mask[rows])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total, steps = total + float(loss.detach()), steps + 1
            self.epochs_done += 1
            report.train_losses.append(total / max(steps, 1))
        self.weight, self.bias = weight.detach(), bias.detach()
        return report

    def _evaluation(self, weight: torch.Tensor, bias: torch.Tensor, classes: Sequence[str]) -> Evaluation:
        """Rows ``weight``/``bias`` for ``classes`` (own ones) on the validation features."""
        columns = [self.class_names.index(name) for name in classes]
        probabilities = torch.sigmoid(self.val.values @ weight.T + bias).numpy()
        labels, mask = self.val.labels[:, columns].numpy(), self.val.mask[:, columns].numpy()
        return Evaluation.of(labels, probabilities, classes, mask)

    def validate(self) -> Evaluation:
        own = [self.head_classes.index(name) for name in self.class_names]
        return self._evaluation(self.weight[own], self.bias[own], self.class_names)

    def evaluate_state(self, state: Mapping[str, object], class_names: Sequence[str]) -> Evaluation:
        names = list(class_names)
        present = [name for name in self.class_names if name in names]
        if not present:
            raise ValueError(f"{self.name}: the model's classes {names} share none with this site's")
        rows = [names.index(name) for name in present]
        weight = torch.as_tensor(np.asarray(state[NAMED_HEAD.weight_key]))[rows].float()
        bias = torch.as_tensor(np.asarray(state[NAMED_HEAD.bias_key]))[rows].float()
        return self._evaluation(weight, bias, present)


def initial_heads(classes: Sequence[str], feature_dim: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Fresh head rows for ``classes``, each seeded by its name as the federation's are (``core.head``)."""
    weight, bias = initial_head_rows(list(classes), feature_dim, seed)
    return {NAMED_HEAD.weight_key: weight, NAMED_HEAD.bias_key: bias}


@dataclass
class HeadModel:
    """A trained head: its rows (the state's head keys) and their class names."""

    state: Mapping[str, object]
    class_names: list[str]

    def probabilities(self, features: torch.Tensor) -> np.ndarray:
        weight = torch.as_tensor(np.asarray(self.state[NAMED_HEAD.weight_key])).float()
        bias = torch.as_tensor(np.asarray(self.state[NAMED_HEAD.bias_key])).float()
        return torch.sigmoid(features @ weight.T + bias).numpy()


def aurocs_on(models: Sequence[HeadModel], test: Features) -> dict[str, float]:
    """Per-class AUROC on ``test`` of one head or a set of heads (a class: the mean probability of the heads that
    have it; NaN where none does or the class lacks positives or negatives), matched by name."""
    predicted = list(dict.fromkeys(name for model in models for name in model.class_names))
    scores = ensemble_probabilities(models, predicted, lambda model: model.probabilities(test.values))
    aurocs = {}
    for column, name in enumerate(test.class_names):
        if name not in predicted:
            aurocs[name] = math.nan
            continue
        labelled = test.mask[:, column].numpy() > 0
        aurocs[name] = auroc(test.labels[labelled, column].numpy(), scores[labelled, predicted.index(name)])
    return aurocs
