"""MONAI's DenseNet121 (or the smoke-test DenseNet, ``names.NETWORKS``) with a named classification head, and
optional local ImageNet weights.

The head (``class_layers.out``, Linear 1024 -> n on DenseNet121) has one row per class; ``class_names`` says
which. Nothing is downloaded: ImageNet weights come from a local file placed by site IT.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from ..core.errors import ModelFileError
from ..core.head import NAMED_HEAD, distinct_class_names
from ..data.storage import read_tensor_file
from .names import DENSENET121, NETWORK_ARGUMENTS

FEATURE_DIM = 1024
# Packages MONAI's import pulls in for networks and handlers this bundle does not use: ``import monai``
# imports every submodule, and TransChex loads transformers (2 s), the MLflow handler mlflow (0.5 s).
MONAI_UNUSED_IMPORTS = ("transformers", "mlflow")


@contextmanager
def _imports_left_out(names: Sequence[str]):
    """While importing MONAI: ``names`` (not yet imported) fail to import, which MONAI's optional imports
    take as "not installed". Afterwards they import normally (the report modality uses transformers)."""
    blocked = [name for name in names if name not in sys.modules]
    sys.modules.update(dict.fromkeys(blocked))
    try:
        yield
    finally:
        for name in blocked:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]


with _imports_left_out(MONAI_UNUSED_IMPORTS):
    from monai.networks.nets.densenet import DenseNet


class NamedDenseNet(DenseNet):
    """2-D DenseNet (``network``: DenseNet121 unless named otherwise) whose output rows are the named classes
    ``class_names``.

    Keeps its constructor arguments as attributes (FLARE's Job API rebuilds a model from them).
    """

    def __init__(
        self,
        class_names: Sequence[str],
        in_channels: int = 1,
        dropout_prob: float = 0.0,
        network: str = DENSENET121,
    ) -> None:
        names = distinct_class_names(class_names)
        if in_channels not in (1, 3):
            raise ValueError(f"in_channels must be 1 (grayscale) or 3 (RGB-replicated), got {in_channels}")
        if network not in NETWORK_ARGUMENTS:
            raise ValueError(f"network must be one of {list(NETWORK_ARGUMENTS)}, got {network!r}")
        super().__init__(
            spatial_dims=2,
            in_channels=in_channels,
            out_channels=len(names),
            dropout_prob=dropout_prob,
            **NETWORK_ARGUMENTS[network],
        )
        self.class_names = names
        self.in_channels = in_channels
        self.dropout_prob = dropout_prob
        self.network = network


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


def load_pretrained_backbone(model: NamedDenseNet, weights_path: str | Path) -> list[str]:
    """Load a local ImageNet DenseNet121 checkpoint (e.g. torchvision's densenet121-a639ec97.pth).

    For one input channel the first convolution is summed over RGB, which keeps the response to
    a gray image equal to the RGB network's. The head stays as initialised. Returns the keys
    that were loaded. Nothing is downloaded.
    """
    weights_path = Path(weights_path)
    if model.network != DENSENET121:
        raise ModelFileError(f"{weights_path}: ImageNet weights fit DenseNet121, not the {model.network} network")
    raw = read_tensor_file(weights_path, "pretrained weights file")
    if isinstance(raw, dict) and "state_dict" in raw:
        raw = raw["state_dict"]
    state = imagenet_to_monai_keys(raw)
    conv0 = state.get("features.conv0.weight")
    if conv0 is None:
        raise ModelFileError(f"{weights_path}: no 'features.conv0.weight'; is this a DenseNet121 checkpoint?")
    if model.in_channels == 1 and conv0.shape[1] == 3:
        state["features.conv0.weight"] = conv0.sum(dim=1, keepdim=True)
    target = model.state_dict()
    backbone_keys = [key for key in target if key not in NAMED_HEAD.keys]
    # Older torchvision checkpoints predate BatchNorm's num_batches_tracked counter.
    missing = [key for key in backbone_keys if key not in state and not key.endswith("num_batches_tracked")]
    if missing:
        raise ModelFileError(f"{weights_path}: {len(missing)} backbone keys missing, e.g. {missing[:3]}")
    loaded = [key for key in backbone_keys if key in state]
    wrong = [key for key in loaded if tuple(state[key].shape) != tuple(target[key].shape)]
    if wrong:
        key = wrong[0]
        raise ModelFileError(
            f"{weights_path}: {len(wrong)} shape mismatches, e.g. {key!r} {tuple(state[key].shape)} "
            f"vs model {tuple(target[key].shape)}"
        )
    target.update({key: state[key] for key in loaded})
    model.load_state_dict(target)
    return loaded
