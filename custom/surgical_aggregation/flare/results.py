"""What a federation leaves in the server's app folder besides its models: the round history, its curves, the union
table, the PFL models' folder; their names, and how they are written (atomically, like the models)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nvflare.app_common.app_constant import DefaultCheckpointFileName

from ..data.storage import write_atomically
from ..evaluation.plots import plot_training_curves, validated_models
from ..evaluation.run_summary import HISTORY_FILE, UNION_FILE, union_table, union_table_lines, write_union_table

# where FLARE's ValidationJsonGenerator writes the sites' evaluation of the server's models
CROSS_SITE_FOLDER, CROSS_SITE_FILE = "cross_site_val", "cross_val_results.json"
CURVES_FILE = "training_curves.png"
# The curves are redrawn after a round at most this often, and always when the job ends: drawing takes ~0.3 s of
# CPU, nothing beside rounds of minutes, most of a test federation's rounds of a fraction of a second.
CURVES_REDRAW_SECONDS = 10.0
UNION_LOG_ROWS = 25  # the head of the union table in the server's log; the CSV has every class
BUNDLE_DIR = "monai_bundle"  # export_bundle: the best global model as a MONAI Bundle
PERSONAL_MODELS_DIR = "personal_models"  # PFL: <site>.pt (latest) and best_<site>.pt


def result_files(server_app: Path) -> dict[str, Path]:
    """What a finished run leaves in the server's app folder (and its run folder), by what it is."""
    return {
        "best model": server_app / DefaultCheckpointFileName.BEST_GLOBAL_MODEL,
        "final model": server_app / DefaultCheckpointFileName.GLOBAL_MODEL,
        "round history": server_app / HISTORY_FILE,
        "training curves": server_app / CURVES_FILE,
        "per-site evaluation": server_app.parent / CROSS_SITE_FOLDER / CROSS_SITE_FILE,
        "union table": server_app / UNION_FILE,
    }


def write_history(history: list[dict[str, Any]], app_dir: Path, draw_curves: bool = True) -> str | None:
    """The round history (JSON) and, when ``draw_curves``, the training curves (PNG) next to the models; a warning
    when the curves could not be drawn (the history is written regardless)."""
    text = json.dumps(history, indent=2, default=float).encode()
    write_atomically(app_dir / HISTORY_FILE, lambda handle: handle.write(text), "round history")
    if draw_curves and validated_models(history):  # a round whose sites' losses were all refused has no point
        try:
            plot_training_curves(history, app_dir / CURVES_FILE)
        except OSError as error:
            return f"could not draw {CURVES_FILE}: {error}"
    return None


def write_union(site_classes: dict[str, list[str]], app_dir: Path) -> tuple[Path, list[str]]:
    """Which sites label which class (the handshake's), saved as CSV; returns its path and the head of the table for
    the log. It stays on the server."""
    rows = union_table(site_classes)
    return write_union_table(rows, app_dir / UNION_FILE), union_table_lines(rows, limit=UNION_LOG_ROWS)
