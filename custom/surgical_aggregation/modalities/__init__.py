"""The modalities of the bundle: chest X-ray images and radiology reports.

This package's top level holds only their names (the data kinds a site config may name, the architectures a model
file may record), read from modules that import nothing, so that the command line lists them without loading
torch; the modalities themselves are in :mod:`.registry`. Adding a modality: its package (with a ``names`` module)
and one line here and in the registry.
"""

from ..images import names as images
from ..reports import names as reports

DATA_KINDS: tuple[str, ...] = (*images.LAYOUT_KINDS, *reports.REPORT_KINDS)
ARCHITECTURES: tuple[str, ...] = (images.ARCHITECTURE, reports.ARCHITECTURE)
DEFAULT_ARCHITECTURE = images.ARCHITECTURE  # of model files that do not record one (the bundle's first models)
