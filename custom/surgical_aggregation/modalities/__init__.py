"""The modalities of the bundle: chest X-ray images and radiology reports, one package each.

:data:`MODALITY_PACKAGES` is the one list of them. Each package has a ``names`` module that imports nothing (its
``KINDS``: the ``data.kind`` values it reads; its ``ARCHITECTURE``: the model a model file records) and a
``modality`` module whose ``MODALITY`` implements :class:`.registry.Modality`. This package's top level reads only the
names, so the command line lists the data kinds without loading torch; :mod:`.registry` loads the modalities.
Adding a modality: its package and its line here.
"""

from __future__ import annotations

import importlib

MODALITY_PACKAGES: tuple[str, ...] = ("images", "reports")  # subpackages of surgical_aggregation

_BUNDLE = __package__.rpartition(".")[0]
_NAMES = [importlib.import_module(f"{_BUNDLE}.{package}.names") for package in MODALITY_PACKAGES]
DATA_KINDS: tuple[str, ...] = tuple(kind for names in _NAMES for kind in names.KINDS)
ARCHITECTURES: tuple[str, ...] = tuple(names.ARCHITECTURE for names in _NAMES)
DEFAULT_ARCHITECTURE = ARCHITECTURES[0]  # of model files that record none: the bundle's first models were images'
