"""FLARE's privacy filters (ExcludeVars, PercentilePrivacy, SVTPrivacy) on a site's training results, by name.

FLARE's filters work on a model *update* (``WEIGHT_DIFF``); a site of this bundle sends its trained slice (backbone
and its own head rows) whole, and a filter run on whole weights would zero or noise the model itself. So the two
filters here come as a pair, at the site, in one job process:

* :class:`KeepReceivedModel` (a task data filter) keeps a copy of the model the ``train`` task brought, in the
  task's FLContext (it never leaves the process);
* :class:`UpdatePrivacy` (a task result filter) takes the result apart into named entries
  (:mod:`surgical_aggregation.core.update_entries`: ``sent - received`` for each backbone key and each head row by
  class name, ``class_layers.out/<class>``), runs the FLARE filter it wraps on them as a ``WEIGHT_DIFF``, and sends
  ``received + filtered update``. An entry the filter drops (ExcludeVars) or zeroes arrives as the site received it.

Either the job sets them (the recipe's ``update_privacy``, for every site) or a site does, in the scope of its
``local/privacy.json`` (:func:`update_privacy_filters`; FLARE runs a site's scope filters before the job's). Without
:class:`KeepReceivedModel` before it, :class:`UpdatePrivacy` refuses to let the result leave: it fails closed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from nvflare.apis.dxo import DXO, DataKind, from_shareable
from nvflare.apis.dxo_filter import DXOFilter
from nvflare.apis.filter import Filter
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.app_common.app_constant import AppConstants
from nvflare.fuel.utils.class_utils import instantiate_class

from ..core.errors import UserError
from ..core.update_entries import apply_entries, update_entries
from .audit import SiteAudit
from .protocol import META_CLASS_NAMES, TASK_TRAIN

RECEIVED_MODEL_PROP = "surgical_aggregation.received_model"  # the train task's model, in the task's FLContext
FILTERED = "filtered"  # the site audit's record of what a privacy filter did to a result, after its "sent" record
FLARE_PRIVACY_FILTERS = {  # short name -> FLARE's filter class
    "exclude_vars": "nvflare.app_common.filters.exclude_vars.ExcludeVars",
    "percentile": "nvflare.app_common.filters.percentile_privacy.PercentilePrivacy",
    "svt": "nvflare.app_common.filters.svt_privacy.SVTPrivacy",
}
SVT_ACCOUNTANT_META = "svt_privacy_accountant"  # SVTPrivacy's cumulative epsilon, in the DXO it filtered


class UpdatePrivacyError(UserError):
    """A privacy filter of a site's results is configured so that it cannot filter them."""


class KeepReceivedModel(Filter):
    """Task data filter: a copy of the model a ``train`` task brings, with its head's class names, for
    :class:`UpdatePrivacy` (kept in the task's FLContext, private and not sticky: gone with the task)."""

    def process(self, shareable: Shareable, fl_ctx: FLContext) -> Shareable:
        try:
            dxo = from_shareable(shareable)
        except ValueError:  # not a model (e.g. a handshake or a publication without weights)
            return shareable
        if dxo.data_kind != DataKind.WEIGHTS or not dxo.data:
            return shareable
        kept = {
            "params": {key: np.array(value, copy=True) for key, value in dxo.data.items()},
            "class_names": list(dxo.get_meta_prop(META_CLASS_NAMES) or []),
            "round": shareable.get_header(AppConstants.CURRENT_ROUND),
        }
        fl_ctx.set_prop(RECEIVED_MODEL_PROP, kept, private=True, sticky=False)
        return shareable


class UpdatePrivacy(DXOFilter):
    """Task result filter: FLARE's ``privacy_filter`` (ExcludeVars, PercentilePrivacy, SVTPrivacy, or another
    ``DXOFilter`` of ``WEIGHT_DIFF``) run on the site's update by named entries (see the module docstring)."""

    def __init__(self, privacy_filter: DXOFilter | Mapping[str, Any]) -> None:
        """``privacy_filter``: the filter, or its component config (``{"path": ..., "args": {...}}``, as a job's JSON
        holds it; kept, checked and with its short name resolved, so that a job written by FLARE's FedJob carries it
        whole)."""
        super().__init__(supported_data_kinds=[DataKind.WEIGHTS], data_kinds_to_filter=[DataKind.WEIGHTS])
        if isinstance(privacy_filter, Mapping):
            privacy_filter = privacy_filter_config(privacy_filter)
            wrapped = build_privacy_filter(privacy_filter)
        else:
            wrapped = privacy_filter
        self.privacy_filter = privacy_filter
        if not isinstance(wrapped, DXOFilter) or DataKind.WEIGHT_DIFF not in (wrapped.data_kinds or []):
            raise UpdatePrivacyError(
                f"UpdatePrivacy's privacy_filter must be one of FLARE's filters of model updates (WEIGHT_DIFF), e.g. "
                f"{sorted(FLARE_PRIVACY_FILTERS.values())}; got {type(wrapped).__name__}"
            )
        self.wrapped = wrapped

    def process_dxo(self, dxo: DXO, shareable: Shareable, fl_ctx: FLContext) -> DXO | None:
        if not dxo.data:  # no weights (a DP-SGD site whose budget is spent, a handshake, a publication)
            return None
        received = fl_ctx.get_prop(RECEIVED_MODEL_PROP)
        what = type(self.wrapped).__name__
        if not received:
            raise UpdatePrivacyError(
                f"{what} cannot filter this result as an update: no model came with its task (site-to-site "
                "evaluation sends the local model whole), or KeepReceivedModel is not among the task data filters "
                "before it; the result does not leave the site"
            )
        sent_classes = list(dxo.get_meta_prop(META_CLASS_NAMES) or [])
        try:
            changes = update_entries(dxo.data, sent_classes, received["params"], received["class_names"])
        except ValueError as error:
            raise UpdatePrivacyError(f"{what}: {error}; the result does not leave the site") from None
        trained = {name: change.copy() for name, change in changes.items()}
        update = DXO(DataKind.WEIGHT_DIFF, data=changes, meta=dict(dxo.meta))
        filtered = self.wrapped.process_dxo(update, shareable, fl_ctx) or update
        dxo.data = apply_entries(dxo.data, sent_classes, received["params"], received["class_names"], filtered.data)
        for key, value in filtered.meta.items():  # what the filter adds (SVTPrivacy: the epsilon it spent)
            if key not in dxo.meta:
                dxo.set_meta_prop(key, value)
        summary = filter_summary(trained, filtered.data)
        note = f"{what}: {summary}"
        accountant = filtered.meta.get(SVT_ACCOUNTANT_META)
        if isinstance(accountant, Mapping):
            spent = accountant.get("epsilon_total", float("nan"))
            note += f"; SVT epsilon spent by this filter so far {spent:.4g} per update (pure DP)"
        self.log_info(fl_ctx, f"round {received['round']}: {note}")
        _audit(fl_ctx, received["round"], sent_classes, note)
        return dxo


KEEP_RECEIVED_PATH, UPDATE_PRIVACY_PATH = (f"{kind.__module__}.{kind.__qualname__}" for kind in
                                          (KeepReceivedModel, UpdatePrivacy))  # fmt: skip


def filter_summary(trained: Mapping[str, np.ndarray], filtered: Mapping[str, np.ndarray]) -> str:
    """How a filter changed an update, counted over its values: sent as trained, sent as received (dropped or
    zeroed), altered otherwise."""
    total = sum(change.size for change in trained.values())
    as_trained = as_received = 0
    for name, change in trained.items():
        value = filtered.get(name)
        if value is None:
            as_received += change.size
            continue
        value = np.reshape(np.asarray(value, dtype=np.float64), change.shape)
        as_trained += int(np.sum(value == change))
        as_received += int(np.sum((value == 0) & (change != 0)))
    altered = total - as_trained - as_received
    return (
        f"of {total} values of the update, {as_trained} sent as trained, {as_received} as received, {altered} altered"
    )


def _audit(fl_ctx: FLContext, round_number: Any, class_names: list[str], note: str) -> None:
    """The site audit's ``filtered`` record, after the client script's ``sent`` one (in a FLARE job only)."""
    engine = fl_ctx.get_engine()
    workspace = engine.get_workspace() if engine is not None else None
    if workspace is None:
        return
    app_dir = workspace.get_app_dir(fl_ctx.get_job_id())
    SiteAudit(app_dir, "off").record(TASK_TRAIN, round_number, FILTERED, class_names, note=note)


def update_privacy_filters(privacy_filter: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (task data filter, task result filter) component configs that run ``privacy_filter`` (a FLARE filter's
    ``{"path": ..., "args": {...}}``; ``path`` may be a short name of :data:`FLARE_PRIVACY_FILTERS`) on a site's
    training results: what a job's client app or a site's ``local/privacy.json`` scope lists. The filter is built
    once here, so that bad args are refused before they are written."""
    config = UpdatePrivacy(privacy_filter).privacy_filter
    return {"path": KEEP_RECEIVED_PATH, "args": {}}, {"path": UPDATE_PRIVACY_PATH, "args": {"privacy_filter": config}}


def privacy_filter_config(privacy_filter: Mapping[str, Any]) -> dict[str, Any]:
    """``privacy_filter`` with its short name resolved, checked: a mapping with a ``path`` and ``args``."""
    if not isinstance(privacy_filter, Mapping) or not isinstance(privacy_filter.get("path"), str):
        raise UpdatePrivacyError(
            f"a privacy filter is {{'path': <one of {sorted(FLARE_PRIVACY_FILTERS)} or a class path>, 'args': "
            f"{{...}}}}; got {privacy_filter!r}"
        )
    args = privacy_filter.get("args", {})
    if not isinstance(args, Mapping):
        raise UpdatePrivacyError(f"the privacy filter's args must be a mapping, got {args!r}")
    unknown = set(privacy_filter) - {"path", "args"}
    if unknown:
        raise UpdatePrivacyError(f"the privacy filter has fields {sorted(unknown)}; it takes only 'path' and 'args'")
    path = FLARE_PRIVACY_FILTERS.get(privacy_filter["path"], privacy_filter["path"])
    if not re.fullmatch(r"[A-Za-z_][\w.]*", path):
        raise UpdatePrivacyError(f"the privacy filter's path {path!r} is not a class path")
    return {"path": path, "args": dict(args)}


def build_privacy_filter(privacy_filter: Mapping[str, Any]) -> Any:
    """The filter a component config names (checked by :func:`privacy_filter_config`), built with its args."""
    config = privacy_filter_config(privacy_filter)
    try:
        return instantiate_class(config["path"], config["args"])
    except (ImportError, AttributeError, TypeError, ValueError) as error:
        raise UpdatePrivacyError(f"privacy filter {config['path']} with args {config['args']}: {error}") from None


def read_privacy_filter(path: str | Path) -> dict[str, Any]:
    """A privacy filter's JSON file (``{"path": "percentile", "args": {"percentile": 10, "gamma": 0.01}}``), checked;
    errors name the file."""
    path = Path(path)
    try:
        return privacy_filter_config(json.loads(path.read_text(encoding="utf-8")))
    except OSError as error:
        raise UpdatePrivacyError(f"privacy filter file {path}: {error.strerror or error}") from None
    except json.JSONDecodeError as error:
        raise UpdatePrivacyError(f"privacy filter file {path}: not JSON: {error}") from None
    except UpdatePrivacyError as error:
        raise UpdatePrivacyError(f"privacy filter file {path}: {error}") from None
