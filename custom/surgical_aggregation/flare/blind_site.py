"""A site's side of blind surgical aggregation (``core.blind``, the server's in :mod:`.blind`): what it tells a blind
server, how it turns the ciphertexts it is sent into the model it trains, and its result into ciphertexts.

The site holds the consortium's secret (``blind_secret`` in its config: the slots' key, the class list and the
wrapping key, in its workspace's ``local/`` folder, never in a job). At the handshake it makes a fresh CKKS key pair
for the job and sends it wrapped (``core.blind.JobKey``); the server relays one site's to every site with each task,
and each site opens it with the wrapping key, bound to the job: no two jobs share a key. It keeps the model it last
received in clear in its job folder (``blind_received.pt``): a class slot that no site filled in a round leaves
that row as it was, as the plain aggregation keeps a row nobody sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.blind import (
    PUBLIC_CONTEXT,
    BlindLayout,
    BlindSecret,
    JobKey,
    blind_weight,
    params_as_parts,
    parts_as_params,
    split_job_key,
)
from ..core.checks.metrics import METRIC_KEYS
from ..core.errors import SiteConfigError
from ..core.head import NAMED_HEAD, extend_head, numpy_state
from ..core.strategies import strategy
from .protocol import TASK_DESCRIBE, TASK_PUBLISH, TASK_TRAIN, TASK_VALIDATE

RECEIVED_FILE = "blind_received.pt"  # the model this site last received, in clear, in its job folder
BLIND_TASKS = (TASK_DESCRIBE, TASK_TRAIN, TASK_VALIDATE, TASK_PUBLISH)  # what a blind site answers


class BlindSite:
    """One site's secret, its layout and the model it last received."""

    def __init__(self, secret: BlindSecret, site: str, app_dir: Path, log: logging.Logger, job: str = "") -> None:
        self.secret, self.site, self.log, self.job = secret, site, log, job
        self.received_file = app_dir / RECEIVED_FILE
        self._layout: BlindLayout | None = None
        self._template: dict[str, Any] | None = None  # the model last received (also in received_file)
        self.job_key: JobKey | None = None  # the job's CKKS key, as the server's tasks carry it

    @classmethod
    def from_file(cls, path: str | Path, site: str, app_dir: Path, log: logging.Logger, job: str = "") -> BlindSite:
        path = Path(path).expanduser()
        if not path.is_file():
            raise SiteConfigError(f"{site}: blind_secret {path} is not a file (the consortium's blind secret)")
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:  # as ssh refuses a private key others can read
            raise SiteConfigError(
                f"{site}: blind_secret {path} can be read by others (mode {mode:o}): it holds the consortium's keys; "
                f"make it its owner's only (chmod 600 {path}) and ask whoever could read it whether they copied it"
            )
        return cls(BlindSecret.from_json(path.read_text(), str(path)), site, app_dir, log, job)

    def layout(self, model_state: Callable[[], Mapping[str, Any]], backbone_strategy: str) -> BlindLayout:
        """The layout of this consortium for a model of the entries ``model_state()`` gives (called once, at the
        first task)."""
        if self._layout is None:
            state = model_state()
            averaged = strategy(backbone_strategy).shared_keys(list(state), NAMED_HEAD.keys)
            self._layout = self.secret.layout_for(state, averaged)
        return self._layout

    def describe(self, layout: BlindLayout, classes: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The handshake's answer (meta, params): the ciphertext count, the parts to send back and the consortium's
        fingerprint; a fresh key pair for the job, its public context as bytes and its secret context wrapped."""
        offer = self.secret.new_job_key(self.job)
        meta = {"parts": layout.parts, "wanted": layout.parts_for(classes), "consortium": self.secret.fingerprint}
        return meta, {PUBLIC_CONTEXT: np.frombuffer(offer.public, dtype=np.uint8), **offer.as_params()}

    def opened(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A task's params without the job key it carries, which is opened (once) as this job's key."""
        entries, rest = split_job_key(params)
        if entries is None:
            raise SiteConfigError(f"{self.site}: the server's task carries no job key: this site cannot read it")
        if self.job_key is None or entries["job_key/context"] != self.job_key.wrapped:
            self.job_key = self.secret.open_job_key(entries, self.job, "the server's task")
            self.log.info("%s: this job's key: public context %s", self.site, self.job_key.fingerprint[:16])
        return rest

    def received(self, params: Mapping[str, Any], settings: Mapping[str, Any], classes: Sequence[str]) -> dict:
        """The model this site is sent, in clear: the initial model with its own rows (seeded by name, as the plain
        job makes them), or the decrypted sums of its parts over the model it last received. Kept as the template of
        the next one."""
        params = self.opened(params)
        if settings.get("initial"):
            state = numpy_state(params)
            state, _ = extend_head(state, [], list(classes), NAMED_HEAD, int(settings.get("head_seed", 0)))
        else:
            state = self._decrypted(params, classes)
        self._template = numpy_state(state)
        torch.save(self._template, self.received_file)  # a restarted process reads it back
        return state

    def decrypted(self, params: Mapping[str, Any], classes: Sequence[str]) -> dict:
        """The decrypted sums of the parts in ``params`` (with the job key they carry) over the model this site last
        received."""
        return self._decrypted(self.opened(params), classes)

    def _decrypted(self, params: Mapping[str, Any], classes: Sequence[str]) -> dict:
        if self._template is None:
            if not self.received_file.is_file():
                raise SiteConfigError(
                    f"{self.site}: sent ciphertexts before the initial model (no {self.received_file}): this site "
                    "cannot read them"
                )
            self._template = torch.load(self.received_file, weights_only=False)
        sums = self.job_key.cipher.decrypt(params_as_parts(params, "the server's model"))
        return self._layout.unpack(sums, list(classes), self._template)

    def encrypted(self, state: Mapping[str, Any], classes: Sequence[str], samples: int, weighting: str) -> dict:
        """This site's trained model as the ciphertexts it sends."""
        vector = self._layout.pack(state, list(classes), blind_weight(samples, weighting))
        return parts_as_params(dict(enumerate(self.job_key.cipher.encrypt(vector))))


def classless_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """The metrics a blind site sends: the documented ones without a class (a per-class AUROC would tell the
    server)."""
    return {name: value for name, value in metrics.items() if name in METRIC_KEYS}
