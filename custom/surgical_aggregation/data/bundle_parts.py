"""What a modality contributes to an exported MONAI Bundle (the modality seam's return type, like ``table``'s)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class BundleParts:
    """What a modality puts into an exported MONAI Bundle; ``deployment.bundle`` writes the rest (models, metadata,
    README) the same way for every modality.

    ``config`` holds the modality's entries of ``configs/inference.json`` (how inputs are read and preprocessed,
    the network and its output activation): ``rows`` (the inputs' identifiers), ``batches`` (the preprocessed
    inputs, each a mapping with ``input_key``), ``postprocessing`` (applied to the network's outputs, or null) and
    ``statuses`` (why an input was not scored, or null: all were). The exporter's ``run`` scores them and writes the
    CSV with the bundle's ``scripts/predictions.py``, the same for every modality. ``scripts`` are standalone
    modules of this package (they import nothing of it) that the bundle carries under ``scripts/``.
    """

    input_key: str  # the network input's name in ``network_data_format`` (and the ONNX graph's input)
    input_format: dict[str, Any]  # its tensor format specifier (MONAI's bundle specification)
    input_produced_by: str  # what the input is made from, in words
    task: str
    data_type: str
    config: dict[str, Any]
    scripts: tuple[Path, ...]
    packages: tuple[str, ...]  # distributions the bundle's inference needs beyond MONAI, torch and numpy
    usage: str  # the inference command's inputs, for the bundle's README (``--dataset_dir images/``)
