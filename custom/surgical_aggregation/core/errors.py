"""The project's own user errors: mistakes in what a user gave (a config, a data folder, a label, a file).

The command line shortens exactly these to one ``error: ...`` line; anything else is a bug and
shows its traceback. Each keeps the built-in type callers already catch (``ValueError``,
``FileNotFoundError``, ...).
"""

from __future__ import annotations

from pathlib import Path


class UserError(Exception):
    """Something the user can fix; the message names the file, site or field."""


class SiteConfigError(UserError, ValueError):
    """A site configuration that cannot be used; the message names the file and the field."""


class DatasetFormatError(UserError, ValueError):
    """A label file that does not have the layout it claims to have."""


class UnknownLabelError(UserError, ValueError):
    """A label that is not a name, or a class a closed vocabulary (a job's accepted classes) does not accept."""


class AliasFileError(UserError, ValueError):
    """An alias mapping (a consortium's or a site's) that cannot be used; the message names the file and entry."""


class DuplicateLabelError(UserError, ValueError):
    """Two names of one list that mean the same finding (e.g. "Effusion" and "Pleural Effusion")."""


class DataNotFoundError(UserError, FileNotFoundError):
    """A data folder, label file, model file or image list that is not where the user said."""


class ModelFileError(UserError, ValueError):
    """A model or weights file that is not what it should be (not a checkpoint, wrong layout)."""


class ImageLoadError(UserError, RuntimeError):
    """An image file that is missing or cannot be decoded; ``path`` names it."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


class StorageError(UserError, OSError):
    """A file that could not be written (a full disk, no permission); the message names it and what is kept."""


class StateFileError(UserError, ValueError):
    """A federation's saved state that cannot be read; the message names the file and what to do."""


class ExportError(UserError, ValueError):
    """A model that cannot be exported as asked (the output folder exists, a class name MONAI's configs would
    read as code, an exported file that does not compute what the model does); the message says which."""


class PrivacyLedgerError(UserError, ValueError):
    """A site's privacy ledger that cannot be trusted (unreadable, or behind the steps the site is known to have
    taken): refused rather than reset, since a reset ledger would let the site spend its budget again."""
