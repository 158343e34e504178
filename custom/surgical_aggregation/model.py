"""MONAI DenseNet121 with a named classification head.

The head (``class_layers.out``, Linear 1024 -> n) has one row per class; ``class_names``
says which. Checkpoints written by :func:`save_checkpoint` carry the names next to the
weights, so a model file is never read by position.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from monai.networks.nets import DenseNet121
from torch import nn

from .aggregation import DENSENET_HEAD, HeadSpec
from .labels import canonical_names

FEATURE_DIM = 1024


class NamedDenseNet121(DenseNet121):
    """2-D DenseNet121 whose output rows are the named classes ``class_names``.

    Keeps its constructor arguments as attributes (FLARE's Job API rebuilds a model from
    them). ``batchnorm_frozen`` keeps every BatchNorm layer in eval mode with frozen
    parameters, even after ``model.train()`` (FedBN+).
    """

    head: HeadSpec = DENSENET_HEAD

    def __init__(
        self,
        class_names: Sequence[str],
        in_channels: int = 1,
        dropout_prob: float = 0.0,
        validate_names: bool = True,
    ) -> None:
        names = canonical_names(class_names, "model class_names") if validate_names else list(class_names)
        if not names:
            raise ValueError("a model needs at least one class name")
        if in_channels not in (1, 3):
            raise ValueError(f"in_channels must be 1 (grayscale) or 3 (RGB-replicated), got {in_channels}")
        super().__init__(spatial_dims=2, in_channels=in_channels, out_channels=len(names), dropout_prob=dropout_prob)
        self.class_names = names
        self.in_channels = in_channels
        self.dropout_prob = dropout_prob
        self.validate_names = validate_names
        self.batchnorm_frozen = False

    def train(self, mode: bool = True) -> NamedDenseNet121:
        super().train(mode)
        if self.batchnorm_frozen:
            for module in batchnorm_modules(self):
                module.eval()
        return self


def batchnorm_modules(model: nn.Module) -> Iterator[nn.modules.batchnorm._BatchNorm]:
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            yield module


def freeze_batchnorm(model: NamedDenseNet121, frozen: bool = True) -> None:
    """FedBN+: keep BatchNorm statistics and affine parameters at their current values."""
    model.batchnorm_frozen = frozen
    for module in batchnorm_modules(model):
        for parameter in module.parameters():
            parameter.requires_grad_(not frozen)
    model.train(model.training)


def set_backbone_trainable(model: NamedDenseNet121, trainable: bool) -> None:
    """Head warm-up freezes the backbone; BatchNorm stays frozen when FedBN+ froze it."""
    head_parameters = {id(parameter) for parameter in model.class_layers.parameters()}
    frozen_bn = (
        {id(parameter) for module in batchnorm_modules(model) for parameter in module.parameters()}
        if model.batchnorm_frozen
        else set()
    )
    for parameter in model.parameters():
        if id(parameter) in head_parameters:
            parameter.requires_grad_(True)
        elif id(parameter) not in frozen_bn:
            parameter.requires_grad_(trainable)


def split_backbone_head(
    state: Mapping[str, torch.Tensor], head: HeadSpec = DENSENET_HEAD
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(backbone entries, head entries) of a state dict."""
    backbone = {key: value for key, value in state.items() if key not in head.keys}
    return backbone, {key: state[key] for key in head.keys}


ARCHITECTURES = ("densenet121", "report_mlp")


def build_model(
    architecture: str, class_names: Sequence[str], in_channels: int = 1, in_features: int = 384
) -> nn.Module:
    """A model of the bundle with a named head: the chest X-ray DenseNet121 or the report MLP."""
    if architecture == "densenet121":
        return NamedDenseNet121(class_names, in_channels=in_channels)
    if architecture == "report_mlp":
        from .reports.model import ReportMLP

        return ReportMLP(class_names, in_features=in_features)
    raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {architecture!r}")


def initial_global_state(
    in_channels: int = 1,
    seed: int = 0,
    pretrained_weights: str | Path | None = None,
    architecture: str = "densenet121",
    in_features: int = 384,
) -> dict[str, torch.Tensor]:
    """A fresh global model before any site is known: a seeded (or ImageNet) backbone, a head of 0 rows.

    The union head grows as sites report their classes (see ``aggregation.extend_head``).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # one placeholder row, dropped below
        model = build_model(architecture, ["No Finding"], in_channels=in_channels, in_features=in_features)
    if pretrained_weights is not None:
        if architecture != "densenet121":
            raise ValueError(f"pretrained_weights are ImageNet DenseNet121 weights; the architecture is {architecture}")
        load_pretrained_backbone(model, pretrained_weights)
    state = model.state_dict()
    for key in model.head.keys:
        state[key] = state[key][:0].clone()
    return state


# --- checkpoints ---------------------------------------------------------------------------


@dataclass
class Checkpoint:
    """A state dict with its head's class names and free-form metadata (round, metrics, ...)."""

    state: dict[str, torch.Tensor]
    class_names: list[str]
    in_channels: int = 1
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def architecture(self) -> str:
        """As stored; checkpoints without it are told apart by their keys (the MLP has ``features.0``)."""
        if "architecture" in self.meta:
            return str(self.meta["architecture"])
        return "report_mlp" if "features.0.weight" in self.state else "densenet121"

    def build_model(self) -> nn.Module:
        in_features = self.state["features.0.weight"].shape[1] if self.architecture == "report_mlp" else 0
        model = build_model(self.architecture, self.class_names, self.in_channels, in_features)
        model.load_state_dict(self.state)
        return model


def save_checkpoint(
    path: str | Path,
    state: Mapping[str, torch.Tensor],
    class_names: Sequence[str],
    in_channels: int = 1,
    **meta: Any,
) -> Path:
    """Write atomically (temp file + rename) so a crash never leaves a half-written model."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "model": {key: torch.as_tensor(value).detach().cpu() for key, value in state.items()},
        "class_names": list(class_names),
        "in_channels": in_channels,
        "meta": meta,
    }
    temporary = path.with_name(path.name + ".tmp")
    torch.save(payload, temporary)
    temporary.replace(path)
    return path


def load_checkpoint(path: str | Path) -> Checkpoint:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or "model" not in payload or "class_names" not in payload:
        raise ValueError(f"{path} is not a surgical-aggregation checkpoint (needs 'model' and 'class_names')")
    weight = payload["model"].get(DENSENET_HEAD.weight_key)
    if weight is not None and weight.shape[0] != len(payload["class_names"]):
        raise ValueError(
            f"{path}: head has {weight.shape[0]} rows but {len(payload['class_names'])} class names are stored"
        )
    return Checkpoint(
        state=payload["model"],
        class_names=list(payload["class_names"]),
        in_channels=int(payload.get("in_channels", 1)),
        meta=dict(payload.get("meta", {})),
    )


# --- optional local ImageNet weights ----------------------------------------------------------

# torchvision's densenet121 checkpoint names dense-layer modules "norm.1"/"conv.2" (old) or
# "norm1"/"conv2"; MONAI nests them under "layers.".
_TORCHVISION_LAYER = re.compile(
    r"^(?P<prefix>.*denselayer\d+)\.(?P<module>norm|relu|conv)\.?(?P<index>[12])\.(?P<tensor>weight|bias|running_mean|running_var|num_batches_tracked)$"
)


def imagenet_to_monai_keys(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a torchvision DenseNet121 state dict onto MONAI's keys (the classifier is dropped)."""
    renamed: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.startswith("classifier."):
            continue
        match = _TORCHVISION_LAYER.match(key)
        if match:
            key = f"{match['prefix']}.layers.{match['module']}{match['index']}.{match['tensor']}"
        renamed[key] = value
    return renamed


def load_pretrained_backbone(model: NamedDenseNet121, weights_path: str | Path) -> list[str]:
    """Load a local ImageNet DenseNet121 checkpoint (e.g. torchvision's densenet121-a639ec97.pth).

    For one input channel the first convolution is summed over RGB, which keeps the response to
    a gray image equal to the RGB network's. The head stays as initialised. Returns the keys
    that were loaded. Nothing is downloaded.
    """
    weights_path = Path(weights_path)
    if not weights_path.is_file():
        raise FileNotFoundError(f"pretrained weights file not found: {weights_path}")
    raw = torch.load(weights_path, map_location="cpu", weights_only=True)
    if isinstance(raw, dict) and "state_dict" in raw:
        raw = raw["state_dict"]
    state = imagenet_to_monai_keys(raw)
    conv0 = state.get("features.conv0.weight")
    if conv0 is None:
        raise ValueError(f"{weights_path}: no 'features.conv0.weight'; is this a DenseNet121 checkpoint?")
    if model.in_channels == 1 and conv0.shape[1] == 3:
        state["features.conv0.weight"] = conv0.sum(dim=1, keepdim=True)
    target = model.state_dict()
    backbone_keys = [key for key in target if key not in model.head.keys]
    # Older torchvision checkpoints predate BatchNorm's num_batches_tracked counter.
    missing = [key for key in backbone_keys if key not in state and not key.endswith("num_batches_tracked")]
    if missing:
        raise ValueError(f"{weights_path}: {len(missing)} backbone keys missing, e.g. {missing[:3]}")
    loaded = [key for key in backbone_keys if key in state]
    wrong = [key for key in loaded if tuple(state[key].shape) != tuple(target[key].shape)]
    if wrong:
        key = wrong[0]
        raise ValueError(
            f"{weights_path}: {len(wrong)} shape mismatches, e.g. {key!r} {tuple(state[key].shape)} "
            f"vs model {tuple(target[key].shape)}"
        )
    target.update({key: state[key] for key in loaded})
    model.load_state_dict(target)
    return loaded
