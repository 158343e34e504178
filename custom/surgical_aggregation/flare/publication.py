"""The server's models and the sites: what a site may see of a model, the sites' validation of it, and the models
leaving the loop: saved with what they predict, made FLARE's global model, evaluated by every site on its own slice
(FLARE's cross-site results), and published at the end.

:class:`ServerModels` is a layer of the controller (:class:`~.controller.SurgicalAggregatorShareable` is one): it reads
the controller's federation state, admitted sites and settings, and sends tasks through :class:`~.loop.FederationLoop`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nvflare.apis.dxo import DXO, DataKind
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.abstract.model import make_model_learnable
from nvflare.app_common.app_constant import AppConstants, DefaultCheckpointFileName
from nvflare.app_common.app_event_type import AppEventType

from ..core.errors import UserError
from ..core.head import HeadSpec, classes_labelled_by_at_least, slice_for_client
from ..core.labels import Vocabulary
from ..evaluation.run_summary import model_label, union_table
from ..training.checkpoint import save_checkpoint
from .handshake import SiteInfo
from .loop import FederationLoop
from .protocol import META_CLASS_NAMES, META_PREPROCESSING, META_ROUND, TASK_PUBLISH
from .results import BUNDLE_DIR, PERSONAL_MODELS_DIR, result_files
from .state import FederationState, SavedVersion, history_entry, site_view

SERVER_MODEL_PREFIX = "SRV_"  # how FLARE's cross-site evaluation names the server's models in its results


class ServerModels(FederationLoop):
    """Saving, evaluating and publishing the federation's global models."""

    method: str
    head: HeadSpec
    validate_timeout: int
    min_sites_per_published_class: int
    _sites: dict[str, SiteInfo]
    vocabulary: Vocabulary
    _federation: FederationState
    _federation_preprocessing: dict[str, Any]

    def _model_meta(self, version: SavedVersion) -> dict[str, Any]:
        """Stored with the saved model: what it predicts, when it was made, how to feed it its inputs."""
        return {
            META_CLASS_NAMES: version.class_names,
            "round": version.round,
            "trained": version.trained,  # False: no aggregation has happened yet (the initial weights)
            "method": self.method,
            META_PREPROCESSING: self._federation_preprocessing,
        }  # no per-site class lists: the file is published to the sites, which must not learn each other's

    def _as_flmodel(self, version: SavedVersion) -> FLModel:
        return FLModel(params=version.state, current_round=version.round, meta=self._model_meta(version))

    def _make_global(self, version: SavedVersion, event: str) -> None:
        """Make ``version`` the context's global model and fire ``event`` (the persistor saves the best)."""
        learnable = make_model_learnable(version.state, self._model_meta(version))
        self.fl_ctx.set_prop(AppConstants.GLOBAL_MODEL, learnable, private=True, sticky=True)
        self.event(event)

    def _save_personal(self, version: SavedVersion, best: bool = False) -> None:
        """PFL: ``personal_models/<site>.pt`` (latest) or ``best_<site>.pt``, each with the site's classes."""
        if not version.personal:
            return
        folder = Path(self.get_app_dir()) / PERSONAL_MODELS_DIR
        meta = {key: value for key, value in self._model_meta(version).items() if key != META_CLASS_NAMES}
        for site, state in version.personal.items():
            name = f"best_{site}.pt" if best else f"{site}.pt"
            save_checkpoint(folder / name, state, self._sites[site].classes, site=site, **meta)

    def _slice(self, version: SavedVersion, site: str, **meta: Any) -> FLModel:
        """What ``site`` may see of ``version`` (:func:`~.state.site_view`), with ``meta``."""
        info = self._sites[site]
        params, names = site_view(version, site, info.classes, info.reported, self.method, self.head)
        return FLModel(params=params, meta={META_CLASS_NAMES: names, **meta})

    def _evaluate_server_models(self, latest: SavedVersion) -> None:
        """The server's saved models (latest, best), each validated by every site on its own slice: FLARE's
        ``cross_val_results.json`` of the server's models, without sending any site another site's rows."""
        best = self._federation.best
        models = {DefaultCheckpointFileName.GLOBAL_MODEL: latest}
        if best is not None:
            models[DefaultCheckpointFileName.BEST_GLOBAL_MODEL] = best
        results: dict[int, dict[str, dict]] = {}
        for name, version in models.items():
            if version.round not in results:  # each was validated in its round, by every site
                recorded = history_entry(self._federation.history, version.round).get("validation", {})
                results[version.round] = recorded.get("sites") or self._validate(version, list(self._sites))
            for site, metrics in results[version.round].items():
                # not sticky: FLARE's cross-site evaluation of the sites' models sets the same properties afterwards
                self.fl_ctx.set_prop(AppConstants.MODEL_OWNER, SERVER_MODEL_PREFIX + name, private=True, sticky=False)
                self.fl_ctx.set_prop(AppConstants.DATA_CLIENT, site, private=True, sticky=False)
                result = DXO(data_kind=DataKind.METRICS, data=metrics).to_shareable()
                self.fl_ctx.set_prop(AppConstants.VALIDATION_RESULT, result, private=True, sticky=False)
                self.event(AppEventType.VALIDATION_RESULT_RECEIVED)

    def _sites_labelling(self) -> dict[str, int]:
        """Class -> how many admitted sites label it."""
        rows = union_table({site: info.classes for site, info in self._sites.items()})
        return {row["class"]: row["labelled_by"] for row in rows}

    def _export_monai_bundle(self) -> None:
        """The best global model as a MONAI Bundle in the app folder (the round history and the union table are
        next to it). A model that cannot be exported is said in the log; the federation's results stay as they are."""
        from ..deployment.bundle import export_bundle  # torch's ONNX exporter: imported only when asked for

        files = result_files(Path(self.get_app_dir()))
        model = files["best model"] if files["best model"].is_file() else files["final model"]
        try:
            exported = export_bundle(
                model,
                Path(self.get_app_dir()) / BUNDLE_DIR,
                sites_labelling=self._sites_labelling(),
                vocabulary=self.vocabulary,
                min_sites=self.min_sites_per_published_class,
                overwrite=True,
            )
        except UserError as error:
            self.error(f"the MONAI Bundle was not exported: {error}")
            return
        for line in exported.summary():
            self.info(line)

    def _publish_best(self) -> None:
        """Send every site the best global model (union head, class names, preprocessing): from here on the
        sites know the union's class names."""
        federation = self._federation
        version = federation.best or federation.latest
        state, names = version.state, version.class_names
        if self.min_sites_per_published_class > 1:
            names, left_out = classes_labelled_by_at_least(
                version.class_names, self._sites_labelling(), self.min_sites_per_published_class
            )
            self.info(
                f"left out of the publication: {len(left_out)} class(es) labelled by fewer than "
                f"{self.min_sites_per_published_class} sites (min_sites_per_published_class): {left_out}"
            )
            if not names:
                self.warning("no class is labelled by enough sites: nothing is published")
                return
            state = slice_for_client(version.state, version.class_names, names, self.head)
        meta = {**self._model_meta(version), META_ROUND: version.round, META_CLASS_NAMES: names}
        received: list[str] = []
        self.info(
            f"publishing the best global model ({model_label(version.round)}, {len(names)} classes) "
            "to every site: the sites learn the union's class names now"
        )
        self.to_each_site(
            TASK_PUBLISH,
            list(self._sites),
            lambda site: FLModel(params=state, meta=meta),
            self.validate_timeout,
            lambda result: received.append(result.meta.get("client_name", "?")),
        )
        self.info(f"the global model was published to {sorted(received)}")
