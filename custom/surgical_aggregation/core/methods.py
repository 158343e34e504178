"""The federated methods this bundle compares, as settings of one server workflow and one site trainer.

Every method runs through the same ``SurgicalAggregatorShareable`` controller and the same
site trainer; what differs is small and explicit:

============== ================== ============================== ===============================
method         head a site trains labels a site does not have    what stays at the site
============== ================== ============================== ===============================
surgical       its own classes    (not in its head)              nothing
vanilla        the union          negatives                      nothing
partial_loss   the union          left out of the loss (masked)  nothing
personal (PFL) its own classes    (not in its head)              its head (+ BatchNorm for fedbn)
============== ================== ============================== ===============================

The server always averages head rows by class name. When every site trains the union head
(vanilla, partial loss) that is exactly FedAvg over the whole model, so at psi = 0 the three
federated methods aggregate the same updates into the same model.

Orthogonal options: ``label_prior`` (FedSLD's loss re-weighting by the federation's label prior,
adapted to multi-label: per class, within each site's own classes), ``proximal_mu`` (FedProx),
the backbone strategy (``fedavg`` | ``fedbn`` | ``fedbn_plus``) and the weighting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import UserError
from .strategies import BackboneStrategy, strategy

if TYPE_CHECKING:  # torch is imported where it computes: the command line reads this module's names without it
    import torch

METHODS: tuple[str, ...] = ("surgical", "vanilla", "partial_loss", "personal")
UNION_HEAD_METHODS = ("vanilla", "partial_loss")
PERSONAL_METHODS = ("personal",)  # each site keeps its head (and what its backbone strategy keeps)


@dataclass(frozen=True)
class SiteMethod:
    """What a site does differently under a method (sent by the server with every training task)."""

    method: str = "surgical"
    backbone_strategy: str = "fedavg"
    proximal_mu: float = 0.0
    label_prior: Mapping[str, float] | None = None  # class -> federation's positive rate (FedSLD)
    identity_batchnorm: bool = False  # FedBN+ on a model whose BatchNorm holds its default statistics, on purpose

    def __post_init__(self) -> None:
        check_method(self.method, self.backbone_strategy)
        if self.proximal_mu < 0:
            raise ValueError(f"proximal_mu must not be negative, got {self.proximal_mu}")

    @property
    def trains_union_head(self) -> bool:
        return self.method in UNION_HEAD_METHODS

    @property
    def missing_labels(self) -> str:
        """How union classes the site does not label enter its loss (LabelTable.label_matrix policy)."""
        return "negative" if self.method == "vanilla" else "unlabelled"

    @property
    def keeps_head(self) -> bool:
        return self.method in PERSONAL_METHODS

    @property
    def strategy(self) -> BackboneStrategy:
        """The backbone strategy's object: what the site freezes and keeps."""
        return strategy(self.backbone_strategy)

    @property
    def freezes_batchnorm(self) -> bool:
        return self.strategy.freezes_batchnorm


class IdentityBatchNormError(UserError, ValueError):
    """FedBN+ asked of a model whose BatchNorm layers hold their default statistics (see :func:`check_batchnorm`)."""


def _on_host(value: Any) -> np.ndarray:
    """A state entry as a NumPy array, a tensor on a GPU too (this module stays importable without torch)."""
    return np.asarray(value.detach().cpu() if hasattr(value, "detach") else value)


def batchnorm_at_defaults(state: Mapping[str, Any]) -> bool:
    """Whether every BatchNorm layer of ``state`` holds its default statistics (running mean 0, variance 1): a model
    built from scratch, never trained or loaded with pretrained weights. False without BatchNorm layers."""
    means = [key for key in state if key.endswith(".running_mean")]
    if not means:
        return False
    for key in means:
        variance = _on_host(state[key[: -len("running_mean")] + "running_var"])
        if _on_host(state[key]).any() or not (variance == 1).all():
            return False
    return True


def check_batchnorm(site_method: SiteMethod, state: Mapping[str, Any], where: str) -> None:
    """FedBN+ freezes BatchNorm at the model's statistics; refuse when those are the defaults (every BatchNorm the
    identity, the network unnormalised) unless the method asks for exactly that (``identity_batchnorm``)."""
    if site_method.freezes_batchnorm and not site_method.identity_batchnorm and batchnorm_at_defaults(state):
        raise IdentityBatchNormError(
            f"{where}: FedBN+ (backbone_strategy fedbn_plus) freezes BatchNorm at the initial model's statistics, but "
            "its BatchNorm layers hold their defaults (running mean 0, variance 1): frozen, every BatchNorm is the "
            "identity and the network is unnormalised. Start from weights whose statistics were learned "
            "(pretrained_weights: local ImageNet DenseNet121 weights, or the embedded stand-in of "
            "'surgical-aggregation pretrain'), or use backbone_strategy fedavg; to train the unnormalised network on "
            "purpose, set identity_batchnorm"
        )


def check_method(method: str, backbone_strategy: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    strategy(backbone_strategy).check_method(method, PERSONAL_METHODS)


def head_classes_for_site(method: str, site_classes: Sequence[str], union: Sequence[str]) -> list[str]:
    """The head rows the server sends a site: its own classes, or the whole union."""
    return list(union) if method in UNION_HEAD_METHODS else list(site_classes)


# --- FedSLD -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LabelCounts:
    """One site's training-set counts for one class: positives among the labelled images."""

    positives: int
    labelled: int


def federation_label_prior(counts: Mapping[str, Mapping[str, LabelCounts]]) -> dict[str, float]:
    """FedSLD's prior, per class: P(c) = sum_k positives_kc / sum_k labelled_kc over the sites that label c.

    ``counts`` is site -> class -> counts. This is the multi-label reading of FedSLD's
    P(y=c) = sum_k n_kc / sum_k n_k: a site that does not label c contributes neither
    positives nor images to c's prior.
    """
    positives: dict[str, int] = {}
    labelled: dict[str, int] = {}
    for site, per_class in counts.items():
        for name, count in per_class.items():
            if count.labelled < 0 or not 0 <= count.positives <= count.labelled:
                raise ValueError(f"site {site!r}, class {name!r}: impossible counts {count}")
            positives[name] = positives.get(name, 0) + count.positives
            labelled[name] = labelled.get(name, 0) + count.labelled
    return {name: positives[name] / labelled[name] for name in positives if labelled[name] > 0}


def label_prior_weights(target: torch.Tensor, mask: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
    """FedSLD's per-entry loss weights for a batch, per class c over the batch's labelled entries:

    positives weigh p_batch(c) / P(c), negatives (1 - p_batch(c)) / (1 - P(c)), where p_batch(c)
    is the batch's positive rate and P(c) the federation's. A class whose batch share matches the
    federation's gets weight 1. ``prior`` is (C,), NaN for classes without a prior (weight 1).
    """
    import torch

    labelled = mask.sum(dim=0)
    batch_rate = (target * mask).sum(dim=0) / labelled.clamp_min(1.0)
    known = torch.isfinite(prior)
    federation = torch.where(known, prior, batch_rate).clamp(1e-6, 1 - 1e-6)
    positive_weight = torch.where(known, batch_rate / federation, torch.ones_like(batch_rate))
    negative_weight = torch.where(known, (1 - batch_rate) / (1 - federation), torch.ones_like(batch_rate))
    return torch.where(target > 0.5, positive_weight, negative_weight)


def prior_vector(prior: Mapping[str, float] | None, class_names: Sequence[str]) -> torch.Tensor | None:
    """The prior in head-row order (NaN where a class has none), or None without a prior."""
    if not prior:
        return None
    import torch

    return torch.tensor([float(prior.get(name, np.nan)) for name in class_names], dtype=torch.float32)


def method_meta(site_method: SiteMethod) -> dict[str, Any]:
    """The method as plain JSON-able values (FLModel meta)."""
    return {
        "method": site_method.method,
        "backbone_strategy": site_method.backbone_strategy,
        "proximal_mu": site_method.proximal_mu,
        "label_prior": dict(site_method.label_prior) if site_method.label_prior else None,
        "identity_batchnorm": site_method.identity_batchnorm,
    }


def method_from_meta(meta: Mapping[str, Any]) -> SiteMethod:
    return SiteMethod(
        method=str(meta.get("method", "surgical")),
        backbone_strategy=str(meta.get("backbone_strategy", "fedavg")),
        proximal_mu=float(meta.get("proximal_mu", 0.0)),
        label_prior=meta.get("label_prior") or None,
        identity_batchnorm=bool(meta.get("identity_batchnorm", False)),
    )


# --- the comparators of the papers, by name -----------------------------------------------------

# Controller arguments of each federated comparator; the grid's backbone strategy and weighting
# apply where a comparator does not fix its own.
FEDERATED_COMPARATORS: dict[str, dict[str, Any]] = {
    "surgical": {"method": "surgical"},
    "surgical_fedbn_plus": {"method": "surgical", "backbone_strategy": "fedbn_plus"},
    "vanilla": {"method": "vanilla"},
    "partial_loss": {"method": "partial_loss"},
    "pfl": {"method": "personal"},
    "pfl_fedbn": {"method": "personal", "backbone_strategy": "fedbn"},
    "pfl_fedbn_plus": {"method": "personal", "backbone_strategy": "fedbn_plus"},
    # FedSLD alone: FedAvg over the union head with the partial loss, re-weighted, sample-weighted.
    "fedsld": {"method": "partial_loss", "label_prior": True, "weighting": "samples"},
    "surgical_fedsld": {"method": "surgical", "label_prior": True, "weighting": "samples"},
    # FedProx on top of plain FedAvg (vanilla FL), as in FedSLD's comparison.
    "fedprox": {"method": "vanilla", "proximal_mu": 0.01},
}
# trained without FLARE; centralized_full: the sites' data pooled with every class of the union known
# (the report-labelling paper's upper baseline: the whole dataset, fully labelled), where centralized counts a class a
# site does not label as negative
POOLED_COMPARATORS = ("centralized", "centralized_full", "individual")
COMPARATORS = (*FEDERATED_COMPARATORS, *POOLED_COMPARATORS)
COMPARATOR_LABELS = {
    "surgical": "FL + surgical aggregation",
    "surgical_fedbn_plus": "FL + surgical aggregation (FedBN+)",
    "vanilla": "vanilla FL",
    "partial_loss": "FL + partial loss",
    "pfl": "PFL (FedAvg)",
    "pfl_fedbn": "PFL (FedBN)",
    "pfl_fedbn_plus": "PFL (FedBN+)",
    "fedsld": "FedSLD",
    "surgical_fedsld": "surgical aggregation + FedSLD",
    "fedprox": "FedProx",
    "centralized": "centralized",
    "centralized_full": "centralized (all labels)",
    "individual": "individual",
}


def controller_arguments(comparator: str, backbone_strategy: str = "fedavg", weighting: str = "uniform") -> dict:
    """The ``SurgicalAggregatorShareable`` arguments of a federated comparator."""
    if comparator not in FEDERATED_COMPARATORS:
        raise ValueError(f"{comparator!r} is not a federated comparator; choose one of {list(FEDERATED_COMPARATORS)}")
    arguments = {
        "backbone_strategy": backbone_strategy,
        "weighting": weighting,
        "clip_updates": False,  # the papers' plain means and selection: a grid compares methods, not defences
        "reject_opposed_updates": False,
        "robust_aggregation": "mean",
        "validation_guard": False,
        **FEDERATED_COMPARATORS[comparator],
    }
    check_method(arguments["method"], arguments["backbone_strategy"])
    return arguments
