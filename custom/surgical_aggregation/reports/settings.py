"""What a report site's config says about its reports: the field this modality owns, and its check.

It sits flat in the site config's JSON next to the general fields (``"embedding_model": ...``); the config keeps it
as ``config.settings``, a :class:`ReportSettings`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import SiteConfigError
from .embeddings import EMBEDDING_MODELS, MINILM


@dataclass
class ReportSettings:
    embedding_model: str = MINILM  # the sentence encoder whose embeddings the MLP reads

    def check(self, where: str) -> None:
        """Refuse an encoder this bundle does not have; the error names ``where`` (the file) and the field."""
        if self.embedding_model not in EMBEDDING_MODELS:
            raise SiteConfigError(
                f"{where}: embedding_model must be one of {list(EMBEDDING_MODELS)}, got {self.embedding_model!r}"
            )
