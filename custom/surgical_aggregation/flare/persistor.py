"""FLARE persistor for a global model whose head rows carry class names.

FLARE's ``PTFileModelPersistor`` rebuilds a fixed ``nn.Module`` and cannot follow a head that
grows as sites join, nor keep the rows' class names. These components store the package's
own checkpoint format (``{"model", "class_names", "meta"}``), readable with
``surgical_aggregation.training.checkpoint.load_checkpoint`` and by anything that reads ``ckpt["model"]``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.model import ModelLearnable, ModelLearnableKey, make_model_learnable
from nvflare.app_common.abstract.model_persistor import ModelPersistor
from nvflare.app_common.app_constant import AppConstants, DefaultCheckpointFileName
from nvflare.app_common.app_event_type import AppEventType

from ..core.head import numpy_state
from ..experiments.pretraining import stand_in_backbone
from ..modalities import ARCHITECTURES, DEFAULT_ARCHITECTURE
from ..training.checkpoint import (
    ARCHITECTURE_KEY,
    PREPROCESSING_KEY,
    initial_global_state,
    load_checkpoint,
    save_checkpoint,
)
from ..training.profiles import STAND_IN
from .protocol import META_CLASS_NAMES, META_INITIAL_MODEL


class SurgicalModelPersistor(ModelPersistor):
    """Loads the initial global model and saves the latest and the best global model with class names."""

    def __init__(
        self,
        architecture: str = DEFAULT_ARCHITECTURE,
        preprocessing: dict | None = None,
        seed: int = 0,
        pretrained_weights: str | None = None,
        initial_model: str | None = None,
        global_model_file_name: str = DefaultCheckpointFileName.GLOBAL_MODEL,
        best_global_model_file_name: str = DefaultCheckpointFileName.BEST_GLOBAL_MODEL,
    ) -> None:
        """
        Args:
            architecture: the model, as its modality names it (``modalities.ARCHITECTURES``).
            preprocessing: what the sites feed the model (their modality's description, e.g.
                ``{"in_channels": 1, ...}`` or ``{"embedding_model": ...}``); it sizes the model's input.
            seed: seed of the initial backbone (every site starts from the same one).
            pretrained_weights: optional local ImageNet DenseNet121 checkpoint (server side; sites
                receive the weights with the model). Relative paths are relative to the server app.
                ``"stand-in"``: the embedded stand-in for ImageNet weights at the sites' image size: the
                bundle's copy (64 px), else the server's cache (trained there first when missing: 40 minutes on 2
                CPU cores at 64 px).
            initial_model: optional checkpoint of this package to start from (e.g. an earlier run).
        """
        if architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {architecture!r}")
        super().__init__()
        self.architecture = architecture
        self.preprocessing = preprocessing
        self.seed = seed
        self.pretrained_weights = pretrained_weights
        self.initial_model = initial_model
        self.global_model_file_name = global_model_file_name
        self.best_global_model_file_name = best_global_model_file_name

    def _app_dir(self, fl_ctx: FLContext) -> Path:
        return Path(fl_ctx.get_engine().get_workspace().get_app_dir(fl_ctx.get_job_id()))

    def _resolve(self, path: str, fl_ctx: FLContext) -> Path:
        return Path(path) if os.path.isabs(path) else self._app_dir(fl_ctx) / path

    def load_model(self, fl_ctx: FLContext) -> ModelLearnable:
        if self.initial_model:
            checkpoint = load_checkpoint(self._resolve(self.initial_model, fl_ctx))
            self.log_info(
                fl_ctx, f"initial global model from {self.initial_model}: {len(checkpoint.class_names)} classes"
            )
            meta = {
                META_CLASS_NAMES: checkpoint.class_names,
                ARCHITECTURE_KEY: checkpoint.architecture,
                META_INITIAL_MODEL: f"the global model in {self.initial_model}",
            }
            return make_model_learnable(numpy_state(checkpoint.state), meta)
        if self.pretrained_weights == STAND_IN:
            weights = stand_in_backbone(self.preprocessing or {}, log=self.logger)
        else:
            weights = self.pretrained_weights and self._resolve(self.pretrained_weights, fl_ctx)
        state = initial_global_state(self.architecture, self.preprocessing, self.seed, weights or None)
        origin = f"pretrained weights from {weights}" if weights else f"random initialisation (seed {self.seed})"
        self.log_info(
            fl_ctx, f"initial global {self.architecture}: {origin}; the head grows as sites report their classes"
        )
        meta = {META_CLASS_NAMES: [], ARCHITECTURE_KEY: self.architecture, META_INITIAL_MODEL: origin}
        return make_model_learnable(numpy_state(state), meta)

    def _write(self, learnable: ModelLearnable, path: Path) -> None:
        meta = dict(learnable.get(ModelLearnableKey.META) or {})
        class_names = meta.pop(META_CLASS_NAMES, [])
        weights = {key: torch.as_tensor(np.asarray(v)) for key, v in learnable[ModelLearnableKey.WEIGHTS].items()}
        meta = {ARCHITECTURE_KEY: self.architecture, PREPROCESSING_KEY: dict(self.preprocessing or {}), **meta}
        save_checkpoint(path, weights, class_names, **meta)

    def save_model(self, learnable: ModelLearnable, fl_ctx: FLContext) -> None:
        self._write(learnable, self._app_dir(fl_ctx) / self.global_model_file_name)

    def handle_event(self, event: str, fl_ctx: FLContext) -> None:
        if event == AppEventType.GLOBAL_BEST_MODEL_AVAILABLE:
            learnable = fl_ctx.get_prop(AppConstants.GLOBAL_MODEL)
            if learnable:
                self._write(learnable, self._app_dir(fl_ctx) / self.best_global_model_file_name)
        elif event == EventType.START_RUN:
            self._app_dir(fl_ctx).mkdir(parents=True, exist_ok=True)
