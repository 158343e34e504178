"""Writes FLARE job folders (``meta.json``, app configs, per-site configs).

Two ways for the bundle's code to reach the participants (``JobSpec.code``):

* ``"byoc"`` (the default, and ``jobs/nih_chexpert``): the job has an ``app/custom/`` folder, so
  FLARE treats it as bring-your-own-code: the component allow-list does not apply and only a
  submitter with the ``byoc`` right may submit it. ``custom/`` holds ``client.py``, a two-line
  entry point that runs the package's Client API script inside the FLARE client process; the
  package itself is installed at every participant, or travels in ``custom/`` too when
  ``ship_library`` is set (then the sites need only the third-party requirements).
* ``"preinstalled"``: no ``custom/`` at all. The package is installed at every participant and
  each participant's ``local/resources.json`` allow-lists the job's components
  (``flare.deploy``); the trainer runs as ``python3 -u -m surgical_aggregation.flare.client``.

Either way each site's default config is ``app/config/site_configs/<site>.json``, not under
``custom/``: ``nvflare job submit`` re-serialises every JSON file under ``custom/`` and, in FLARE
2.9, truncates a file whose first key holds an object to that object.

``jobs/nih_chexpert`` in the repository is exactly ``write_job(nih_chexpert_spec(), ...)`` (a
test keeps them identical).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import DEMO_TRAINING, site_config_from_dict
from .controller import SurgicalAggregatorShareable
from .persistor import SurgicalModelLocator, SurgicalModelPersistor

CLIENT_COMMAND = "python3 -u -m surgical_aggregation.flare.client"
CLIENT_ENTRY_POINT = "client.py"
CLIENT_ENTRY_POINT_SOURCE = (
    '"""FLARE Client API script of this job: the site trainer of the installed surgical_aggregation."""\n\n'
    "from surgical_aggregation.flare.client import main\n\n"
    "main()\n"
)
CLIENT_EXECUTIONS = ("in_process", "external_process")
CODE_DELIVERIES = ("byoc", "preinstalled")
SERVER_SITE = "server"
# The privacy scope the jobs name in meta.json: a site whose local/privacy.json defines scopes runs
# them only if it defines this one (flare.deploy writes it); a site without privacy.json runs them.
PRIVACY_SCOPE = "surgical_aggregation"
SITE_CONFIGS_DIR = Path("app") / "config" / "site_configs"
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the installed surgical_aggregation package


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass
class JobSpec:
    """Everything that makes a job: its sites' configs and the server components' arguments."""

    name: str
    sites: dict[str, dict[str, Any]]  # site name -> site config (as in site_configs/<site>.json)
    controller: dict[str, Any] = field(default_factory=dict)  # SurgicalAggregatorShareable arguments
    persistor: dict[str, Any] = field(default_factory=dict)  # SurgicalModelPersistor arguments
    cross_site_evaluation: bool = True
    client_execution: str = "in_process"  # in_process (FLARE's default) | external_process
    code: str = "byoc"  # byoc (app/custom/ in the job) | preinstalled (no custom/, allow-listed components)
    ship_library: bool = False  # byoc only: copy the surgical_aggregation package into app/custom/

    def validate(self) -> None:
        if self.client_execution not in CLIENT_EXECUTIONS:
            raise ValueError(f"client_execution must be one of {CLIENT_EXECUTIONS}, got {self.client_execution!r}")
        if self.code not in CODE_DELIVERIES:
            raise ValueError(f"code must be one of {CODE_DELIVERIES}, got {self.code!r}")
        if self.code == "preinstalled" and self.client_execution == "in_process":
            raise ValueError(
                "code='preinstalled' needs client_execution='external_process': FLARE runs an in-process "
                "script only from the job's custom/ folder"
            )
        if self.ship_library and self.code != "byoc":
            raise ValueError("ship_library puts the package in app/custom/, which makes the job byoc")
        if not self.sites:
            raise ValueError(f"job {self.name!r} has no sites")
        for site, values in self.sites.items():
            site_config_from_dict(values, where=f"job {self.name!r} site {site!r}")
        SurgicalAggregatorShareable(**self.controller)  # raises on bad arguments, before anything is written
        SurgicalModelPersistor(**self.persistor)

    @property
    def min_clients(self) -> int:
        return int(self.controller.get("min_clients", len(self.sites)))


def server_config(spec: JobSpec) -> dict[str, Any]:
    workflows = [{"id": "surgical_aggregation", "path": _path(SurgicalAggregatorShareable), "args": spec.controller}]
    if spec.cross_site_evaluation:
        workflows.append(
            {
                "id": "cross_site_evaluation",
                "path": "nvflare.app_common.workflows.cross_site_model_eval.CrossSiteModelEval",
                "args": {"model_locator_id": "model_locator", "submit_model_timeout": 600, "validation_timeout": 1800},
            }
        )
    return {
        "format_version": 2,
        "workflows": workflows,
        "components": [
            {"id": "persistor", "path": _path(SurgicalModelPersistor), "args": spec.persistor},
            {"id": "model_locator", "path": _path(SurgicalModelLocator), "args": {"persistor_id": "persistor"}},
            {
                "id": "json_generator",
                "path": "nvflare.app_common.widgets.validation_json_generator.ValidationJsonGenerator",
                "args": {},
            },
            {"id": "tb_receiver", "path": "nvflare.app_opt.tracking.tb.tb_receiver.TBAnalyticsReceiver", "args": {}},
        ],
        "task_data_filters": [],
        "task_result_filters": [],
    }


def client_config(spec: JobSpec) -> dict[str, Any]:
    # numpy both ways: FLARE's pytorch<->numpy converter reshapes received arrays to the shapes the
    # site last sent, which breaks when a site validates a model with more head rows than it trains.
    exchange = {"params_exchange_format": "numpy", "server_expected_format": "numpy"}
    if spec.client_execution == "in_process":
        arguments = {"execution_mode": "in_process", "task_script_path": CLIENT_ENTRY_POINT, **exchange}
    else:
        arguments = {"execution_mode": "external_process", "command": CLIENT_COMMAND, "launch_once": True, **exchange}
    return {
        "format_version": 2,
        "executors": [
            {
                "tasks": ["*"],
                "executor": {
                    "path": "nvflare.app_common.executors.client_api_executor.ClientAPIExecutor",
                    "args": arguments,
                },
            }
        ],
        "components": [
            {
                "id": "event_to_fed",
                "path": "nvflare.app_common.widgets.convert_to_fed_event.ConvertToFedEvent",
                "args": {"events_to_convert": ["analytix_log_stats"]},
            }
        ],
        "task_data_filters": [],
        "task_result_filters": [],
    }


def _write_json(path: Path, content: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content, indent=2) + "\n")


def write_job(spec: JobSpec, folder: str | Path) -> Path:
    """Write the job folder (replacing an existing one). Returns the folder."""
    spec.validate()
    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    _write_json(
        folder / "meta.json",
        {
            "name": spec.name,
            "resource_spec": {},
            "scope": PRIVACY_SCOPE,
            "min_clients": spec.min_clients,
            "deploy_map": {"app": [SERVER_SITE, *spec.sites]},
        },
    )
    _write_json(folder / "app" / "config" / "config_fed_server.json", server_config(spec))
    _write_json(folder / "app" / "config" / "config_fed_client.json", client_config(spec))
    custom = folder / "app" / "custom"
    if spec.code == "byoc":
        custom.mkdir(parents=True, exist_ok=True)
        if spec.client_execution == "in_process":
            (custom / CLIENT_ENTRY_POINT).write_text(CLIENT_ENTRY_POINT_SOURCE)
        if spec.ship_library:
            shutil.copytree(PACKAGE_DIR, custom / PACKAGE_DIR.name, ignore=shutil.ignore_patterns("__pycache__"))
    for site, values in spec.sites.items():
        full = site_config_from_dict(values, where=f"site {site!r}").to_dict()  # every field, defaults explicit
        _write_json(folder / SITE_CONFIGS_DIR / f"{site}.json", full)
    return folder


# --- the bundle's main job ---------------------------------------------------------------------------


def nih_chexpert_spec() -> JobSpec:
    """``jobs/nih_chexpert``: a NIH ChestX-ray14 site (14 labels) and a CheXpert site (13), 20-class union."""
    embedded = {"patients": 200, "image_size": 64, "seed": 0}
    # 60/20/20 rather than the papers' 70/10/20: 10% of 200 patients leaves findings without a
    # single validation positive, and validation picks the best model.
    split = {"split_fractions": [0.6, 0.2, 0.2]}
    return JobSpec(
        name="nih_chexpert",
        sites={
            "site-nih": {"data": {"kind": "nih", **split}, "embedded": embedded, **DEMO_TRAINING},
            "site-chexpert": {"data": {"kind": "chexpert", **split}, "embedded": embedded, **DEMO_TRAINING},
        },
        controller={
            "num_rounds": 5,
            "min_clients": 2,
            "backbone_strategy": "fedavg",
            "weighting": "uniform",
            "patience": 25,
            "min_delta": 1e-4,
            "handshake_timeout": 600,
            "train_timeout": 3600,
            "validate_timeout": 1800,
        },
        persistor={"in_channels": 1, "seed": 0},
    )


# The report labelling job: the IU reports dealt IID to two sites, each labelling 9 of the 14 most
# frequent findings, 4 of them shared (IU_JOB_LABELS[:4]); the other 10 alternate between sites.
IU_JOB_LABELS = (
    "Lung Opacity", "Cardiomegaly", "Support Devices", "Atelectasis", "Tortuous Aorta", "Pleural Effusion",
    "Emphysema", "Nodule", "Edema", "Calcification of the Aorta", "Fracture", "Infiltration", "Hernia",
    "Pleural Thickening",
)  # fmt: skip
REPORT_TRAINING = {
    "batch_size": 64,
    "optimizer": "adam",
    "learning_rate": 1e-3,
    "warmup_epochs": 0,
    "local_epochs": 1,
    "device": "auto",
}


def report_labeling_spec() -> JobSpec:
    """``jobs/report_labeling``: two sites with different label subsets of the real IU reports (seed 004)."""
    shared, others = list(IU_JOB_LABELS[:4]), list(IU_JOB_LABELS[4:])
    sites = {}
    for index, site in enumerate(("site-a", "site-b")):
        data = {
            "kind": "iu_reports",
            "labels": shared + others[index::2],
            "split_fractions": [0.7, 0.1, 0.2],
            "partition_count": 2,
            "partition_index": index,
        }
        sites[site] = {"data": data, **REPORT_TRAINING}
    return JobSpec(
        name="report_labeling",
        sites=sites,
        controller={
            # 10 aggregations keep `nvflare simulator jobs/report_labeling` to minutes on a CPU (the
            # single-process simulator restarts each site for every task); the experiments use 20 (seed 004)
            "num_rounds": 10,
            "min_clients": 2,
            "backbone_strategy": "fedavg",
            "weighting": "samples",
            "patience": 25,
            "min_delta": 1e-4,
            "handshake_timeout": 600,
            "train_timeout": 3600,
            "validate_timeout": 1800,
        },
        persistor={"architecture": "report_mlp", "in_features": 384, "seed": 0},
    )


JOB_SPECS = {"nih_chexpert": nih_chexpert_spec, "report_labeling": report_labeling_spec}
