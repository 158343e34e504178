"""Named head rows: the one place that reads, slices, places and extends a classification head by class name.

Every model of the bundle is a backbone plus a head (``class_layers.out``: one weight row and one
bias per class) whose rows belong to named classes. The server slices a site's rows out of the
union head and the site places received rows into its own head with the same functions, so a
row can never be matched by position. The state-dict helpers here work on torch tensors and
NumPy arrays alike (FLARE exchanges NumPy).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .strategies.base import batchnorm_keys  # noqa: F401  (re-exported: named head and BatchNorm keys together)

StateDict = Mapping[str, Any]  # values: torch.Tensor or numpy.ndarray
NameNormalizer = Callable[[str], str]


@dataclass(frozen=True)
class HeadSpec:
    """Where the classification head lives in a state dict: one row per class."""

    weight_key: str
    bias_key: str

    @property
    def keys(self) -> tuple[str, str]:
        return (self.weight_key, self.bias_key)


# The head of every model of the bundle (the DenseNet121 and the report MLP): ``class_layers.out``.
NAMED_HEAD = HeadSpec("class_layers.out.weight", "class_layers.out.bias")


def same_name(name: str) -> str:
    """The name as given: the normaliser of names that are already canonical."""
    return name


def distinct_class_names(class_names: Sequence[str], where: str = "model class_names") -> list[str]:
    """A head's class names as a list, refused unless they are non-empty, distinct strings (the caller has read
    them through its vocabulary: a model does not rename its rows)."""
    names = list(class_names)
    if not names:
        raise ValueError(f"{where}: a model needs at least one class name")
    blank = [name for name in names if not isinstance(name, str) or not name.strip()]
    if blank:
        raise ValueError(f"{where}: class names must be non-empty strings, got {blank[:3]}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{where}: class names must be distinct, {repeated} appear more than once")
    return names


def to_numpy(value: Any) -> np.ndarray:
    """A state-dict value as a NumPy array (no copy when it already is one)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def numpy_state(state: StateDict) -> dict[str, np.ndarray]:
    """Every entry as a NumPy array (what FLARE exchanges with numpy params)."""
    return {key: to_numpy(value) for key, value in state.items()}


def cast_like(template: Any, array: np.ndarray) -> Any:
    """``array`` cast back to ``template``'s dtype and container (integers are rounded)."""
    template_np = to_numpy(template)
    if np.issubdtype(template_np.dtype, np.integer) or template_np.dtype == np.bool_:
        array = np.rint(array)
    array = array.astype(template_np.dtype, copy=False)
    if isinstance(template, torch.Tensor):
        return torch.from_numpy(np.array(array, order="C")).to(template.device)  # keeps 0-d shapes
    return array


def backbone_digest(state: StateDict, head: HeadSpec = NAMED_HEAD) -> str:
    """A SHA-256 of the backbone's entries (names, dtypes, shapes, values; the head left out): whether two models
    start from the same backbone, whatever their head."""
    digest = hashlib.sha256()
    for key in sorted(state):
        if key in head.keys:
            continue
        array = np.ascontiguousarray(to_numpy(state[key]))
        digest.update(f"{key}:{array.dtype}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def split_backbone_head(state: StateDict, head: HeadSpec = NAMED_HEAD) -> tuple[dict[str, Any], dict[str, Any]]:
    """(backbone entries, head entries) of a state dict."""
    backbone = {key: value for key, value in state.items() if key not in head.keys}
    return backbone, {key: state[key] for key in head.keys}


def slice_for_client(
    global_state: StateDict,
    global_classes: Sequence[str],
    client_classes: Sequence[str],
    head: HeadSpec = NAMED_HEAD,
    normalize_name: NameNormalizer | None = None,
) -> dict[str, Any]:
    """The backbone plus exactly ``client_classes``' head rows, in the client's order.

    Raises ``KeyError`` naming the classes the global model does not have yet.
    """
    normalize = normalize_name or same_name
    index = {normalize(name): position for position, name in enumerate(global_classes)}
    wanted = [normalize(name) for name in client_classes]
    missing = [name for name in wanted if name not in index]
    if missing:
        raise KeyError(f"the global model has no head rows for {missing}; it has {list(global_classes)}")
    rows = [index[name] for name in wanted]
    state = {key: value for key, value in global_state.items() if key not in head.keys}
    for key in head.keys:
        value = global_state[key]
        if isinstance(value, torch.Tensor):
            state[key] = value[torch.as_tensor(rows, dtype=torch.long, device=value.device)].clone()
        else:
            state[key] = np.asarray(value)[rows].copy()
    return state


def place_rows(
    template: Mapping[str, torch.Tensor],
    template_classes: Sequence[str],
    received: StateDict,
    received_classes: Sequence[str],
    keep: Collection[str] = (),
    head: HeadSpec = NAMED_HEAD,
    normalize_name: NameNormalizer | None = None,
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A state for a model whose head rows are ``template_classes``, filled from ``received`` by name.

    ``template`` is that model's own state (it gives shapes and dtypes): every other entry comes from
    ``received``, except the entries in ``keep``, which stay the template's (a site's personal head,
    FedBN's BatchNorm). Head rows are picked by class name; rows of classes ``received`` lacks are
    zero. Returns the state and the template classes that ``received`` had rows for, in template order.
    """
    normalize = normalize_name or same_name
    index = {normalize(name): row for row, name in enumerate(received_classes)}
    placed: dict[str, torch.Tensor] = {}
    for key, value in template.items():
        if key in keep:
            placed[key] = value.detach().clone()
        elif key not in head.keys:
            if key not in received:
                raise KeyError(f"received model has no {key!r}")
            placed[key] = torch.as_tensor(to_numpy(received[key])).to(value.dtype).reshape(value.shape)
    if head.weight_key in keep:
        return placed, list(template_classes)
    received_weight = torch.as_tensor(to_numpy(received[head.weight_key]))
    received_bias = torch.as_tensor(to_numpy(received[head.bias_key]))
    if received_weight.shape[0] != len(received_classes):
        raise ValueError(f"received head has {received_weight.shape[0]} rows for {len(received_classes)} class names")
    weight = torch.zeros_like(template[head.weight_key])
    bias = torch.zeros_like(template[head.bias_key])
    present = []
    for row, name in enumerate(template_classes):
        if name in index:
            weight[row] = received_weight[index[name]]
            bias[row] = received_bias[index[name]]
            present.append(name)
    placed[head.weight_key] = weight
    placed[head.bias_key] = bias
    return placed, present


def initial_head_rows(class_names: Sequence[str], feature_dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Fresh head rows, distributed like ``torch.nn.Linear``'s default initialisation.

    Each class's row comes from its own generator seeded by (seed, class name), so a class
    starts from the same row at every site and whatever other classes exist.
    """
    bound = 1.0 / np.sqrt(feature_dim)
    weight = np.empty((len(class_names), feature_dim), dtype=np.float32)
    bias = np.empty(len(class_names), dtype=np.float32)
    for row, name in enumerate(class_names):
        rng = np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])
        weight[row] = rng.uniform(-bound, bound, feature_dim)
        bias[row] = rng.uniform(-bound, bound)
    return weight, bias


def extend_head(
    state: StateDict,
    class_names: Sequence[str],
    new_classes: Sequence[str],
    head: HeadSpec = NAMED_HEAD,
    seed: int = 0,
) -> tuple[dict[str, Any], list[str]]:
    """Append freshly initialised rows for the ``new_classes`` not in ``class_names`` yet."""
    added = [name for name in dict.fromkeys(new_classes) if name not in class_names]
    weight = to_numpy(state[head.weight_key])
    bias = to_numpy(state[head.bias_key])
    if weight.shape[0] != len(class_names):
        raise ValueError(f"head has {weight.shape[0]} rows for {len(class_names)} class names")
    new_weight, new_bias = initial_head_rows(added, weight.shape[1], seed)
    extended = dict(state)
    extended[head.weight_key] = cast_like(state[head.weight_key], np.concatenate([weight, new_weight]))
    extended[head.bias_key] = cast_like(state[head.bias_key], np.concatenate([bias, new_bias]))
    return extended, [*class_names, *added]


def classes_labelled_by_at_least(
    class_names: Sequence[str], labelling: Mapping[str, int], minimum: int
) -> tuple[list[str], list[str]]:
    """``class_names`` split into those ``labelling`` (class -> how many sites label it) counts at least ``minimum``
    times, and the rest; both in ``class_names``' order. A class only one site labels is that site's head row, as
    averaged as it ever will be: publishing it publishes that site's training."""
    kept = [name for name in class_names if labelling.get(name, 0) >= minimum]
    return kept, [name for name in class_names if labelling.get(name, 0) < minimum]
