"""``SurgicalAggregationRecipe``: a job of this bundle as an NVIDIA FLARE 2.9 Recipe.

The recipe builds the server side (``SurgicalAggregatorShareable``, the persistor of named-head
models, TensorBoard streaming, optionally FLARE's cross-site evaluation of the sites' models) and one app
per site (the Client API trainer, and that site's default config under
``app_<site>/config/site_configs/<site>.json``, so no site's job folder carries another site's
config). Run it with FLARE's environments::

    recipe = nih_chexpert_recipe()
    recipe.run(SimEnv(workspace_root="/tmp/ws"))       # or PocEnv(...), ProdEnv(startup_kit_location=...)
    recipe.export("jobs")                                # the job folder nvflare simulator / job submit take

Two ways for the bundle's code to reach the participants (``code``):

* ``"byoc"`` (the default, and ``jobs/*``): each site app has ``custom/client.py``, a two-line entry
  point that runs the package's Client API script inside the FLARE client process; FLARE treats
  the job as bring-your-own-code (the component allow-list does not apply, only submitters with
  the ``byoc`` right may submit). The package is installed at every participant, or travels in
  ``custom/`` too with ``ship_library``.
* ``"preinstalled"``: no ``custom/`` at all. The package is installed at every participant, each
  participant's ``local/resources.json`` allow-lists the job's components (``flare.deploy``) and
  the trainer runs as ``python3 -u -m surgical_aggregation.flare.client``.

Site configs live under ``config/``, not ``custom/``: ``nvflare job submit`` re-serialises every
JSON file under ``custom/`` and, in FLARE 2.9, truncates a file whose first key holds an object.
The committed ``jobs/<name>`` folders are exactly :func:`write_job` of the recipes below (a test
keeps them identical).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nvflare.app_common.executors.client_api_executor import ClientAPIExecutor
from nvflare.app_common.widgets.convert_to_fed_event import ConvertToFedEvent
from nvflare.app_common.widgets.validation_json_generator import ValidationJsonGenerator
from nvflare.app_common.workflows.cross_site_model_eval import CrossSiteModelEval
from nvflare.app_opt.tracking.tb.tb_receiver import TBAnalyticsReceiver
from nvflare.job_config.api import FedJob
from nvflare.job_config.defs import FilterType
from nvflare.recipe.spec import Recipe

from ..core.checks.handshake import preprocessing_problem
from ..core.checks.update import OPPOSED_FIRST_ROUND
from ..core.errors import SiteConfigError
from ..core.labels import job_vocabulary
from ..core.labels import label_aliases as load_label_aliases
from ..experiments.pretraining import SHIPPED_STAND_INS, check_stand_in
from ..training.config import SITE_CONFIGS_DIR, SiteConfig, site_config_from_dict
from ..training.profiles import (
    CONSORTIUM_ROUNDS,
    DEMO,
    JOB_STARTS,
    PAPERS_FINE_TUNING,
    REPORT,
    REPORT_JOB_ROUNDS,
    SCRATCH,
    STAND_IN,
    STAND_IN_JOB_PATIENTS,
)
from .blind import BLIND_REFUSED, BlindSurgicalAggregator
from .controller import SurgicalAggregatorShareable
from .persistor import SurgicalModelPersistor
from .protocol import (
    BUNDLE_JOBS,
    CODE_DELIVERIES,
    CXR_CONSORTIUM,
    JOB_ALIASES_FILE,
    NIH_CHEXPERT,
    REPORT_LABELING,
    TASK_SUBMIT_MODEL,
    TASK_TRAIN,
)
from .tracking import TRACKERS
from .update_privacy import KeepReceivedModel, UpdatePrivacy

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the installed surgical_aggregation package
CLIENT_COMMAND = "python3 -u -m surgical_aggregation.flare.client"
CLIENT_ENTRY_POINT = "client.py"
CLIENT_ENTRY_POINT_SOURCE = (
    '"""FLARE Client API script of this job: the site trainer of the installed surgical_aggregation."""\n\n'
    "from surgical_aggregation.flare.client import main\n\n"
    "main()\n"
)
CLIENT_EXECUTIONS = ("in_process", "external_process")
# FLARE decides per app whether it brings code (its own custom/ folder): without one, the server would hold
# its components to the allow-list even in a byoc job. This file is the server app's custom/ folder.
SERVER_CUSTOM_MARKER = "BYOC.txt"
SERVER_CUSTOM_MARKER_TEXT = (
    "This app runs the surgical_aggregation package installed on the server (see provisioning/README.md).\n"
    "The folder marks the app as bring-your-own-code for FLARE, as the sites' apps are: its components are\n"
    "authorised by the submitter's byoc right instead of the server's class allow-list.\n"
)
# The privacy scope the jobs name in meta.json: a site whose local/privacy.json defines scopes runs
# them only if it defines this one (flare.deploy writes it); a site without privacy.json runs them.
PRIVACY_SCOPE = "surgical_aggregation"
CONTROLLER_ID = "surgical_aggregation"
PERSISTOR_ID = "persistor"
# seconds a site waits after a task before it asks the server for the next one (FLARE's default: 2). A round is a
# train task and one or more validate tasks; at 2 s each hand-over left a site idle while the server had its next
# task ready. At 0.5 s seven sites ask 14 times a second while they wait, a few small messages.
TASK_REQUEST_INTERVAL = 0.5
ANALYTICS_EVENT = "analytix_log_stats"  # what the sites' SummaryWriter emits; streamed to the server


class SurgicalAggregationRecipe(Recipe):
    """Surgical aggregation (or one of the papers' comparators) over named sites, each with its own config.

    Args:
        name: the job's name (its folder name when exported).
        sites: site name -> site config (the fields of ``surgical_aggregation.training.config.SiteConfig``);
            written, with every default explicit, as that site's default config.
        controller: ``SurgicalAggregatorShareable`` arguments (``num_rounds``, ``method``, ...);
            ``min_clients`` defaults to every site.
        persistor: ``SurgicalModelPersistor`` arguments (``seed``, ``pretrained_weights``); the architecture
            and the model's input follow the sites' data.
        label_aliases: the consortium's synonyms for class names, a mapping ``{"alias": "class name"}`` or a
            JSON/YAML alias file; they win over the built-in ones, and the server and every site apply them.
        accepted_classes: a closed vocabulary: the only classes a site may bring (by name, through the
            aliases); a site bringing another is refused at the handshake. None (default): any class joins.
        initial_model: a checkpoint of this bundle to continue from (e.g. the last job's best model, or a
            published one): its classes keep their learned rows, a hospital's new classes get new rows.
            Relative paths are relative to the server's app folder.
        publish_global_model: at the end, send the best global model (union head and class names) to
            every site; this is when the sites learn the union's class names. Off: it stays on the server.
        site_to_site_evaluation: add FLARE's cross-site evaluation of the sites' local models: each site's
            model (its class names and weights trained on its data alone) is sent to every other site.
            Off by default: it reveals each site's class set to the others. (The server's models are
            always evaluated, each site on its own slice.)
        client_execution: ``in_process`` (FLARE's default) or ``external_process``.
        code: ``byoc`` or ``preinstalled`` (see the module docstring).
        ship_library: byoc only: copy the surgical_aggregation package into each site's ``custom/``.
        update_privacy: one of FLARE's privacy filters on every site's training results, as the site's update
            (``flare.update_privacy``): ``{"path": "exclude_vars" | "percentile" | "svt" | a class path, "args":
            {...}}``, the args of FLARE's ``ExcludeVars``, ``PercentilePrivacy`` or ``SVTPrivacy``. A site can add
            its own in its ``local/privacy.json`` instead (see provisioning/README.md).
        left_out: sites of ``sites`` this job runs without (e.g. one the last job's screening named): not in the job
            at all (its deploy map, its apps, ``min_clients``).
        tracking: where the sites' per-round curves go: ``tensorboard`` (``tb_events/`` on the server) or
            ``mlflow`` (FLARE's MLflow receiver: an SQLite store ``mlflow.db`` in the job's run folder on the
            server, or the tracking server ``tracking_uri`` names). FLARE's ``add_experiment_tracking(recipe,
            ...)`` works on this recipe too.
    """

    def __init__(
        self,
        name: str,
        sites: Mapping[str, Mapping[str, Any]],
        controller: Mapping[str, Any] | None = None,
        persistor: Mapping[str, Any] | None = None,
        label_aliases: Mapping[str, str] | str | Path | None = None,
        accepted_classes: Sequence[str] | None = None,
        initial_model: str | None = None,
        publish_global_model: bool = True,
        site_to_site_evaluation: bool = False,
        client_execution: str = "in_process",
        code: str = "byoc",
        ship_library: bool = False,
        tracking: str = "tensorboard",
        tracking_uri: str | None = None,
        update_privacy: Mapping[str, Any] | None = None,
        blind: bool = False,
        left_out: Sequence[str] = (),
    ) -> None:
        _check_delivery(client_execution, code, ship_library)
        unknown = sorted(set(left_out) - set(sites))
        if unknown:
            raise SiteConfigError(f"job {name!r} has no site(s) {unknown} to leave out; its sites are {sorted(sites)}")
        sites = {site: config for site, config in sites.items() if site not in left_out}
        if blind:
            _check_blind(
                initial_model,
                site_to_site_evaluation,
                update_privacy,
                accepted_classes,
                label_aliases,
                controller or {},
            )
        if tracking not in TRACKERS:
            raise ValueError(f"tracking must be one of {TRACKERS}, got {tracking!r}")
        if not sites:
            raise ValueError(f"job {name!r} has no sites")
        self.label_aliases = load_label_aliases(label_aliases)
        vocabulary = job_vocabulary(self.label_aliases, accepted_classes)
        configs = {  # the sites' label lists read as the job's sites read them: with the job's aliases
            site: site_config_from_dict(values, where=f"job {name!r} site {site!r}", job_aliases=self.label_aliases)
            for site, values in sites.items()
        }
        modalities = {config.modality.name for config in configs.values()}
        if len(modalities) > 1:
            raise ValueError(f"job {name!r} mixes data modalities {sorted(modalities)}; one model reads one kind")
        first = next(iter(configs.values()))
        preprocessing = _one_preprocessing(name, configs)
        self.site_configs = {site: config.to_dict() for site, config in configs.items()}  # every field explicit
        self.controller_args = {
            "min_clients": len(configs),
            **(controller or {}),
            "publish_global_model": publish_global_model,
            "preprocessing": preprocessing,  # the server refuses a site that feeds the model otherwise
        }
        minimum = self.controller_args["min_clients"]
        if isinstance(minimum, int) and not isinstance(minimum, bool) and minimum > len(configs):
            raise SiteConfigError(
                f"job {name!r}: min_clients {minimum} is more than its {len(configs)} site(s) "
                f"{sorted(configs)}: no round could ever aggregate; set min_clients to at most {len(configs)}"
            )
        if self.label_aliases:
            self.controller_args["label_aliases"] = self.label_aliases
        if accepted_classes is not None:
            self.controller_args["accepted_classes"] = list(vocabulary.accepted)
        self.blind = blind
        self.persistor_args = {"architecture": first.modality.architecture, "preprocessing": preprocessing}
        self.persistor_args.update(persistor or {})
        if initial_model is not None:  # continuing a federation: its model is the start, not pretrained weights
            self.persistor_args.pop("pretrained_weights", None)
            self.persistor_args["initial_model"] = str(initial_model)
        if self.persistor_args.get("pretrained_weights") == STAND_IN:
            check_stand_in(preprocessing, f"job {name!r}")
        self.site_to_site_evaluation = site_to_site_evaluation
        self.client_execution = client_execution
        self.code = code
        self.ship_library = ship_library
        # checked and built once here: bad args are refused before anything is written
        self.update_privacy = None if update_privacy is None else UpdatePrivacy(update_privacy).privacy_filter
        # raises on bad arguments before anything is built
        workflow = BlindSurgicalAggregator if blind else SurgicalAggregatorShareable
        aggregator = workflow(**self.controller_args)
        model_persistor = SurgicalModelPersistor(**self.persistor_args)

        self._server_custom_added = False
        self._staging = Path(tempfile.mkdtemp(prefix="surgical-aggregation-recipe-"))
        weakref.finalize(self, shutil.rmtree, self._staging, True)
        job = FedJob(name=name, min_clients=self.controller_args["min_clients"], meta_props={"scope": PRIVACY_SCOPE})
        job.set_app_packages([PACKAGE_DIR.name])  # the package is installed (or shipped explicitly), never copied
        job.to_server(aggregator, id=CONTROLLER_ID)
        job.to_server(model_persistor, id=PERSISTOR_ID)
        job.to_server({"server": {"task_request_interval": TASK_REQUEST_INTERVAL}})  # FLARE's server config key
        job.to_server(ValidationJsonGenerator(), id="json_generator")
        if tracking == "mlflow":
            from nvflare.app_opt.tracking.mlflow.mlflow_receiver import MLflowReceiver  # imports MLflow: when asked

            receiver = MLflowReceiver(tracking_uri=tracking_uri, kw_args={"experiment_name": name})
            job.to_server(receiver, id="mlflow_receiver")
        else:
            job.to_server(TBAnalyticsReceiver(), id="tb_receiver")
        if site_to_site_evaluation:  # without a model locator FLARE evaluates only the sites' models
            evaluation = CrossSiteModelEval(submit_model_timeout=600, validation_timeout=1800)
            job.to_server(evaluation, id="site_to_site_evaluation")
        super().__init__(job)

    @property
    def sites(self) -> list[str]:
        return list(self.site_configs)

    def finalize(self) -> None:
        """The server app's custom/ folder in byoc mode (the library, when it is shipped; else the marker)."""
        if self.code != "byoc" or self._server_custom_added:
            return
        if self.ship_library:
            self._job.add_file_to_server(str(self._shipped_library(with_stand_in=True)), dest_dir=PACKAGE_DIR.name)
        else:
            self._job.add_file_to_server(str(self._stage(SERVER_CUSTOM_MARKER, SERVER_CUSTOM_MARKER_TEXT)))
        self._server_custom_added = True

    def _prepare_client_apps(self) -> None:
        """One app per site: the trainer, its event streaming, its default config (and entry point / library)."""
        for site, config in self.site_configs.items():
            self._job.to(self._executor(), site, tasks=["*"])
            self._job.to(ConvertToFedEvent(events_to_convert=[ANALYTICS_EVENT]), site, id="event_to_fed")
            config_file = self._stage(f"{site}/{site}.json", _json(config))
            self._job.add_file_to(str(config_file), site, dest_dir=SITE_CONFIGS_DIR, app_folder_type="config")
            if self.update_privacy is not None:  # the model the task brought, then the filter on the update
                # submit_model too: a site-to-site evaluation's local model has no update to filter, so it stays
                tasks = [TASK_TRAIN, TASK_SUBMIT_MODEL]
                data_filter, result_filter = KeepReceivedModel(), UpdatePrivacy(self.update_privacy)
                self._job.to(data_filter, site, tasks=tasks, filter_type=FilterType.TASK_DATA)
                self._job.to(result_filter, site, tasks=tasks, filter_type=FilterType.TASK_RESULT)
            if self.label_aliases:
                aliases = self._stage(f"{site}/{JOB_ALIASES_FILE}", _json(self.label_aliases))
                self._job.add_file_to(str(aliases), site, app_folder_type="config")
            if self.code == "byoc" and self.client_execution == "in_process":
                self._job.add_file_to(str(self._stage(CLIENT_ENTRY_POINT, CLIENT_ENTRY_POINT_SOURCE)), site)
            if self.ship_library:
                self._job.add_file_to(str(self._shipped_library(with_stand_in=False)), site, dest_dir=PACKAGE_DIR.name)

    def _executor(self) -> ClientAPIExecutor:
        # numpy both ways: FLARE's pytorch<->numpy converter reshapes received arrays to the shapes the
        # site last sent, which breaks when a site validates a model with more head rows than it trains
        exchange = {"params_exchange_format": "numpy", "server_expected_format": "numpy"}
        if self.client_execution == "in_process":
            return ClientAPIExecutor(execution_mode="in_process", task_script_path=CLIENT_ENTRY_POINT, **exchange)
        return ClientAPIExecutor(
            execution_mode="external_process", command=CLIENT_COMMAND, launch_once=True, **exchange
        )

    def _stage(self, relative: str, text: str) -> Path:
        path = self._staging / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def _shipped_library(self, with_stand_in: bool) -> Path:
        """The package as an app carries it: the server's with the stand-in its persistor starts from, the sites'
        without it (they never read it: 28 MB a site)."""
        ignored = ["__pycache__"] if with_stand_in else ["__pycache__", SHIPPED_STAND_INS.name]
        target = self._staging / ("library" if with_stand_in else "library-for-sites") / PACKAGE_DIR.name
        if not target.is_dir():
            shutil.copytree(PACKAGE_DIR, target, ignore=shutil.ignore_patterns(*ignored))
        return target


def _one_preprocessing(job: str, configs: Mapping[str, SiteConfig]) -> dict[str, Any]:
    """The preprocessing every site of the job uses (the first site's); a site that differs is named, with the rule
    the server applies at the handshake (``core.checks.handshake.preprocessing_problem``)."""
    described = {site: config.modality.preprocessing(config) for site, config in configs.items()}
    first_site, first = next(iter(described.items()))
    for site, preprocessing in described.items():
        if problem := preprocessing_problem(preprocessing, first, f"{first_site}'s"):
            raise SiteConfigError(f"job {job!r}: site {site!r}: {problem}")
    return dict(first)


def _check_blind(
    initial_model: str | None,
    site_to_site_evaluation: bool,
    update_privacy: Mapping[str, Any] | None,
    accepted_classes: Sequence[str] | None,
    label_aliases: Any,
    controller: Mapping[str, Any],
) -> None:
    """What a blind job cannot do, refused before anything is written, each with the reason."""
    asked = {
        "label_aliases": bool(label_aliases),
        "initial_model": initial_model is not None,
        "site_to_site_evaluation": site_to_site_evaluation,
        "update_privacy": update_privacy is not None,
        "accepted_classes": accepted_classes is not None,
        **{name: True for name in controller if name in BLIND_REFUSED},
    }
    refused = [name for name, wanted in asked.items() if wanted]
    if refused:
        reasons = "; ".join(f"{name}: {BLIND_REFUSED[name]}" for name in refused)
        raise SiteConfigError(f"blind mode cannot run {refused}: {reasons}")


def _json(content: Mapping[str, Any]) -> str:
    return json.dumps(content, indent=2) + "\n"


def _check_delivery(client_execution: str, code: str, ship_library: bool) -> None:
    if client_execution not in CLIENT_EXECUTIONS:
        raise ValueError(f"client_execution must be one of {CLIENT_EXECUTIONS}, got {client_execution!r}")
    if code not in CODE_DELIVERIES:
        raise ValueError(f"code must be one of {CODE_DELIVERIES}, got {code!r}")
    if code == "preinstalled" and client_execution == "in_process":
        raise ValueError(
            "code='preinstalled' needs client_execution='external_process': FLARE runs an in-process "
            "script only from the job's custom/ folder"
        )
    if ship_library and code != "byoc":
        raise ValueError("ship_library puts the package in custom/, which makes the job byoc")


# Written into every job folder: each file write_job wrote and its digest. A folder is replaced only when it holds
# exactly those files, unchanged (or is empty), so that nothing a user wrote or edited there is lost.
JOB_MANIFEST = "job_manifest.json"


def _digests(folder: Path) -> dict[str, str]:
    return {
        path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != JOB_MANIFEST
    }


def _not_replaceable(folder: Path) -> str | None:
    """Why ``folder`` may not be replaced by a job folder (None: it is absent, empty, or a job folder write_job wrote
    and nobody changed)."""
    if not folder.exists():
        return None
    if not folder.is_dir():
        return "is a file"
    if not any(folder.iterdir()):
        return None
    manifest = folder / JOB_MANIFEST
    if not manifest.is_file():
        entries = sorted(path.name for path in folder.iterdir())
        return f"holds files write-job did not write ({', '.join(entries[:5])}{', ...' if len(entries) > 5 else ''})"
    try:
        written = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"has a {JOB_MANIFEST} write-job cannot read"
    present = _digests(folder)
    changed = sorted(name for name in present if written.get(name) != present[name])
    if changed:
        return f"holds files added or changed since write-job wrote it ({', '.join(changed[:5])})"
    return None


def write_job(recipe: SurgicalAggregationRecipe, folder: str | Path, force: bool = False) -> Path:
    """Export ``recipe`` to exactly ``folder``: an absent or empty folder, or one that write_job wrote and nobody
    changed since (its ``job_manifest.json`` says); anything else is refused unless ``force``. Returns the folder."""
    folder = Path(folder)
    problem = _not_replaceable(folder)
    if problem and not force:
        raise SiteConfigError(
            f"{folder.resolve()} {problem}: write-job replaces only an empty folder or a job folder it wrote; choose "
            "another --out, or pass --force to replace it and everything in it"
        )
    with tempfile.TemporaryDirectory(prefix="surgical-aggregation-export-") as root:
        recipe.export(root)
        exported = Path(root) / recipe.name
        manifest = {"written_by": "surgical-aggregation write-job", "job": recipe.name, "files": _digests(exported)}
        (exported / JOB_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if folder.is_dir():
            shutil.rmtree(folder)
        elif folder.exists():
            folder.unlink()
        folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(exported), folder)
    return folder


# --- the bundle's jobs ---------------------------------------------------------------------------------


def _with_sites(defaults: dict[str, dict[str, Any]], sites: Mapping[str, Mapping[str, Any]] | None) -> dict:
    """The job's default site configs, with ``sites``' configs in place of those sites' defaults."""
    unknown = sorted(set(sites or {}) - set(defaults))
    if unknown:
        raise SiteConfigError(f"the job has no site(s) {unknown}; its sites are {list(defaults)}")
    return {**defaults, **{site: dict(config) for site, config in (sites or {}).items()}}


# The bundle jobs' seconds per task, sized for the embedded data on a CPU (a handshake ~10 s, a round's
# training ~1 min) with room for a loaded machine; real data needs more (write-job --train-timeout ...).
JOB_TIMEOUTS = {"handshake_timeout": 300, "train_timeout": 900, "validate_timeout": 300}
DEFAULT_START = STAND_IN  # where both image jobs start unless told (write-job and simulate --start)
CHECKPOINT_SUFFIXES = (".pth", ".pt")  # a start given as a path: torchvision's and this bundle's weight files


def start_settings(start: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Where a job's backbone starts, as its sites' rates, the persistor's arguments and the controller's settings: from
    the stand-in or a local ImageNet checkpoint, the papers' fine-tuning rates, FedBN+ and the direction check in each
    site's first round, then its running opposition (fine-tuned from pretrained weights, honest sites of other
    vocabularies come to point against the consensus in later rounds, by a little: docs/server-checks.md, clean
    federations from the stand-in); from scratch,
    the demo profile's rates, FedAvg's backbone (FedBN+ needs learned BatchNorm statistics) and the direction check
    every round."""
    if start not in JOB_STARTS and not str(start).endswith(CHECKPOINT_SUFFIXES):
        raise SiteConfigError(
            f"start must be {STAND_IN!r}, {SCRATCH!r} or the path of a DenseNet121 checkpoint ending in "
            f"{' or '.join(CHECKPOINT_SUFFIXES)}, got {start!r}"
        )
    if start == SCRATCH:
        return {}, {}, {"backbone_strategy": "fedavg"}
    pretrained = {"backbone_strategy": "fedbn_plus", "reject_opposed_updates": OPPOSED_FIRST_ROUND}
    return dict(PAPERS_FINE_TUNING), {"pretrained_weights": start}, pretrained


def _start_controller(started: Mapping[str, Any], blind: bool) -> dict[str, Any]:
    """The start's controller settings (:func:`start_settings`) the job's workflow takes: a blind one reads no update,
    so it judges no direction, and an operator's own blind refusals stay the operator's."""
    return {name: value for name, value in started.items() if not (blind and name in BLIND_REFUSED)}


def nih_chexpert_recipe(
    sites: Mapping[str, Mapping[str, Any]] | None = None, start: str = DEFAULT_START, **options: Any
) -> SurgicalAggregationRecipe:
    """``jobs/nih_chexpert``: a NIH ChestX-ray14 site (14 labels) and a CheXpert site (13), 20-class union,
    on the embedded data. ``sites`` replaces some sites' configs (e.g. real data); ``options`` go to
    :class:`SurgicalAggregationRecipe` (their ``persistor`` and ``controller`` entries win over the start's).

    ``start`` says where the backbone starts. ``stand-in`` (default): the offline stand-in for ImageNet weights
    (``experiments.pretraining``; the server trains it first when its cache lacks it), FedBN+ and the papers'
    fine-tuning rates, on ``STAND_IN_JOB_PATIENTS`` embedded patients a site. A path: that local ImageNet
    DenseNet121 checkpoint (as the server sees it), the same otherwise. ``scratch``: a randomly initialised
    DenseNet121 with FedAvg's backbone (FedBN+ needs learned BatchNorm statistics), the demo profile on its 400
    patients a site: minutes on a CPU, for smoke runs and tests; its best model learns one generic score."""
    rates, persistor, started = start_settings(start)
    embedded = {"patients": DEMO.embedded_patients if start == SCRATCH else STAND_IN_JOB_PATIENTS}
    defaults = {
        "site-nih": DEMO.site_config({"kind": "nih"}, embedded=embedded, **rates),
        "site-chexpert": DEMO.site_config({"kind": "chexpert"}, embedded=embedded, **rates),
    }
    controller = {
        "num_rounds": DEMO.rounds,
        "patience": DEMO.patience,
        **_start_controller(started, options.get("blind", False)),
        **JOB_TIMEOUTS,
        **options.pop("controller", {}),
    }
    persistor = {**persistor, **options.pop("persistor", {})}
    return SurgicalAggregationRecipe(
        NIH_CHEXPERT, _with_sites(defaults, sites), controller=controller, persistor=persistor, **options
    )


# The report labelling job: the IU reports dealt IID to two sites, each labelling 9 of the 14 most
# frequent findings, 4 of them shared (IU_JOB_LABELS[:4]); the other 10 alternate between sites.
IU_JOB_LABELS = (
    "Lung Opacity",
    "Cardiomegaly",
    "Support Devices",
    "Atelectasis",
    "Tortuous Aorta",
    "Pleural Effusion",
    "Emphysema",
    "Nodule",
    "Edema",
    "Calcification of the Aorta",
    "Fracture",
    "Infiltration",
    "Hernia",
    "Pleural Thickening",
)


def report_labeling_recipe(
    sites: Mapping[str, Mapping[str, Any]] | None = None, **options: Any
) -> SurgicalAggregationRecipe:
    """``jobs/report_labeling``: two sites with different label subsets of the real IU reports
    (the report-labelling paper's setting), the report profile, sample-weighted aggregation. ``sites``
    replaces some sites' configs (e.g. a hospital's report CSV)."""
    from ..reports.data import IU_REPORTS

    shared, others = list(IU_JOB_LABELS[:4]), list(IU_JOB_LABELS[4:])
    defaults = {
        site: REPORT.site_config(
            {"kind": IU_REPORTS, "labels": shared + others[index::2], "partition_count": 2, "partition_index": index}
        )
        for index, site in enumerate(("site-a", "site-b"))
    }
    controller = {
        "num_rounds": REPORT_JOB_ROUNDS,
        "weighting": "samples",
        "patience": REPORT.patience,
        **JOB_TIMEOUTS,
        **options.pop("controller", {}),
    }
    return SurgicalAggregationRecipe(REPORT_LABELING, _with_sites(defaults, sites), controller=controller, **options)


# The consortium job: one site per public dataset the bundle reads, each with its own label scheme, embedded
# data by default. PadChest's 189 findings need about 190 patients to all have a positive image.
CONSORTIUM_SITES = {
    "site-nih": "nih",
    "site-chexpert": "chexpert",
    "site-padchest": "padchest",
    "site-vindr": "vindr",
    "site-google": "google-nih",
    "site-rsna": "rsna",
    "site-siim": "siim",
}
CONSORTIUM_PATIENTS = {"padchest": 200}  # the others: 100 each


def cxr_consortium_recipe(
    sites: Mapping[str, Mapping[str, Any]] | None = None, start: str = DEFAULT_START, **options: Any
) -> SurgicalAggregationRecipe:
    """``jobs/cxr_consortium``: seven sites, one per dataset (NIH, CheXpert, PadChest, VinDr-CXR, Google's NIH
    labels, RSNA, SIIM), each with its own label scheme; the union head covers every finding any site labels
    (199 classes, tests/test_flare_e2e.py). 3 rounds, embedded data unless a site config names real data; ``start``
    as for :func:`nih_chexpert_recipe`, on the sites' own embedded sizes. From the stand-in by default: from scratch
    its best model ranked the sites' images below chance (docs/cxr-consortium.md)."""
    rates, persistor, started = start_settings(start)
    defaults = {
        site: DEMO.site_config({"kind": kind}, embedded={"patients": CONSORTIUM_PATIENTS.get(kind, 100)}, **rates)
        for site, kind in CONSORTIUM_SITES.items()
    }
    controller = {
        "num_rounds": CONSORTIUM_ROUNDS,
        "patience": DEMO.patience,
        **_start_controller(started, options.get("blind", False)),
        **JOB_TIMEOUTS,
        **options.pop("controller", {}),
    }
    persistor = {**persistor, **options.pop("persistor", {})}
    return SurgicalAggregationRecipe(
        CXR_CONSORTIUM, _with_sites(defaults, sites), controller=controller, persistor=persistor, **options
    )


BUNDLE_RECIPES = {
    NIH_CHEXPERT: nih_chexpert_recipe,
    REPORT_LABELING: report_labeling_recipe,
    CXR_CONSORTIUM: cxr_consortium_recipe,
}
if tuple(BUNDLE_RECIPES) != BUNDLE_JOBS:
    raise AssertionError("every job named in protocol.BUNDLE_JOBS has its recipe here, in that order")
