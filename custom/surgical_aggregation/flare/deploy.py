"""A participant's ``local/`` folder for this bundle: component allow-list, authorization, privacy
scope, and the site config hospital IT fills in.

Written into provisioned startup kits by :class:`SurgicalAggregationBuilder` (a builder of
``provisioning/project.yml``) and into POC workspaces by ``flare.poc``. What each code-delivery
mode (``flare.recipe.CODE_DELIVERIES``) needs:

* ``byoc`` (default): jobs carry ``app/custom/``; FLARE skips the allow-list for them and lets only
  submitters with the ``byoc`` right submit. ``authorization.json`` is FLARE's default (project
  admin and site leads have ``byoc``; org admins and members cannot submit at all).
* ``preinstalled``: the package is installed at every participant and jobs may not carry code.
  ``resources.json`` adds the exact classes of the bundle's jobs to FLARE's default allow-list,
  and ``authorization.json`` takes ``byoc`` from every role, so a job with ``custom/`` is refused.

A site's ``resources.json`` launches job processes with :class:`.launcher.SiteJobLauncher`, under which a
killed job process costs the job one site instead of failing it.

``privacy.json`` defines the scope the bundle's jobs run in (``meta.json`` ``scope``); by default it
filters nothing; with a site's ``update_privacy`` it runs one of FLARE's privacy filters on the site's training
results (``flare.update_privacy``; see ``provisioning/README.md`` for what leaves a site).
"""

from __future__ import annotations

import copy
import json
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST
from nvflare.lighter.spec import Builder, Project, ProvisionContext

from ..core.errors import DataNotFoundError
from ..modalities import DATA_KINDS
from ..training.config import DATA_LOCATION_PLACEHOLDER, SITE_LOCAL_CONFIG, site_config_from_dict
from ..training.profiles import PAPER
from .job_folder import site_default_config
from .launcher import with_site_launcher
from .protocol import CODE_DELIVERIES
from .recipe import BUNDLE_RECIPES, PRIVACY_SCOPE, write_job
from .update_privacy import KEEP_RECEIVED_PATH, UPDATE_PRIVACY_PATH, update_privacy_filters

SITE_CONFIG_TEMPLATE = f"{SITE_LOCAL_CONFIG}.template"
DATA_KIND_PROPERTY = "data_kind"  # a client's property in project.yml: nih | chexpert | mimic | csv
# Seconds without a heartbeat (a site sends one every 10 s) after which the server logs a site out; the
# running job then deems it disconnected after FLARE's grace period (60 s) and the controller stops waiting
# for it. FLARE's default is 600; a site that comes back is re-activated by its next heartbeat.
SERVER_HEARTBEAT_TIMEOUT = 120


def component_paths(config: Any) -> set[str]:
    """Every component class path (``"path"`` values) in a FLARE app config."""
    if isinstance(config, dict):
        found = {config["path"]} if isinstance(config.get("path"), str) else set()
        return found.union(*(component_paths(value) for value in config.values()))
    if isinstance(config, list):
        return set().union(*(component_paths(value) for value in config))
    return set()


def job_component_paths(job_folder: str | Path) -> set[str]:
    """The classes a job folder asks the server and the sites to build."""
    configs = sorted(Path(job_folder).glob("app*/config/config_fed_*.json"))
    if not configs:
        raise DataNotFoundError(f"{job_folder}: no app*/config/config_fed_*.json; is it a FLARE job folder?")
    return set().union(*(component_paths(json.loads(path.read_text())) for path in configs))


def bundle_component_paths() -> set[str]:
    """The classes of the bundle's jobs written for preinstalled code."""
    paths: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="surgical-aggregation-jobs-") as root:
        for name, make_recipe in BUNDLE_RECIPES.items():
            recipe = make_recipe(code="preinstalled", client_execution="external_process")
            paths |= job_component_paths(write_job(recipe, Path(root) / name))
    return paths


def class_allow_list(extra_paths: Iterable[str]) -> list[str]:
    """FLARE's default allow-list followed by the exact extra classes it lacks (no package wildcards)."""
    default = list(DEFAULT_CLASS_ALLOW_LIST)
    return default + sorted(set(extra_paths) - set(default))


def resources_for(code: str, provisioned: dict[str, Any]) -> dict[str, Any]:
    """``local/resources.json`` from the provisioned default: unchanged for byoc, allow-listed for preinstalled."""
    _check_code(code)
    resources = copy.deepcopy(provisioned)
    if code == "preinstalled":
        resources["class_list_enforcement_mode"] = "enforce"
        # the update privacy filters too: a job may set them (update_privacy), and FLARE allow-lists its own filters
        resources["class_allow_list"] = class_allow_list(
            bundle_component_paths() | {KEEP_RECEIVED_PATH, UPDATE_PRIVACY_PATH}
        )
    return resources


def authorization_for(code: str, provisioned: dict[str, Any]) -> dict[str, Any]:
    """``local/authorization.json`` from the provisioned default; preinstalled takes ``byoc`` from every role."""
    _check_code(code)
    policy = copy.deepcopy(provisioned)
    if code == "byoc":
        return policy
    permissions = policy["permissions"]
    rights = sorted({right for role in permissions.values() if isinstance(role, dict) for right in role})
    for role, granted in permissions.items():
        if granted == "any":  # e.g. project_admin: every right, spelled out so that byoc can be taken away
            permissions[role] = {right: "any" for right in rights}
        elif granted == "none":
            continue
        permissions[role]["byoc"] = "none"
    return policy


def privacy_policy(update_privacy: dict[str, Any] | None = None) -> dict[str, Any]:
    """``local/privacy.json``: the scope the bundle's jobs name, filtering nothing; with ``update_privacy`` (one of
    FLARE's privacy filters, ``{"path": ..., "args": {...}}``) it runs that filter on every training result the
    site sends, as the site's update (``flare.update_privacy``), whatever the job sets."""
    data_filters, result_filters = [], []
    if update_privacy is not None:
        keep_received, filter_update = update_privacy_filters(update_privacy)
        data_filters, result_filters = [keep_received], [filter_update]
    scope = {
        "name": PRIVACY_SCOPE,
        "properties": {},
        "task_data_filters": data_filters,
        "task_result_filters": result_filters,
    }
    return {"scopes": [scope], "default_scope": PRIVACY_SCOPE}


def site_config_template(
    kind: str | None = None, job: str | Path | None = None, site: str | None = None
) -> dict[str, Any]:
    """The site config hospital IT fills in: the recipe of the job the kit is provisioned for (its default config for
    ``site``, or its first site's), so that its preprocessing is the federation's; without a job, the papers' settings.
    The data is the site's to set: its kind (from ``project.yml``) and a location placeholder that is refused.

    A ``job`` that is no folder here but names one of the bundle's jobs (``jobs/nih_chexpert`` given outside the
    repository) is that job as its recipe writes it, the same files as the committed folder."""
    if job is None:
        values = PAPER.site_config({"kind": kind or "nih"}, device="auto")
    else:
        if not (Path(job) / "meta.json").is_file() and Path(job).name in BUNDLE_RECIPES:
            with tempfile.TemporaryDirectory(prefix="surgical-aggregation-job-") as root:
                values = site_default_config(write_job(BUNDLE_RECIPES[Path(job).name](), Path(root) / "job"), site)
        else:
            values = site_default_config(job, site)
        values.pop("embedded", None)  # a site's own data replaces the embedded default
        values.pop("cache_dir", None)
        kind = kind or values["data"]["kind"]
    data = {key: value for key, value in values["data"].items() if key not in ("location", "options", "labels")}
    values["data"] = {**data, "kind": kind or "nih", "location": DATA_LOCATION_PLACEHOLDER, "labels": None}
    return site_config_from_dict(values, where="site config template").to_dict()


def write_local_folder(
    local_dir: str | Path,
    role: str,
    code: str = "byoc",
    data_kind: str | None = None,
    job: str | Path | None = None,
    site: str | None = None,
) -> list[Path]:
    """Write this bundle's files into a provisioned participant's ``local/`` (role: server | client); a site's config
    template follows ``job``, the job folder the kit is provisioned for (``site``: the participant's name).

    Starts from the participant's ``resources.json`` / ``authorization.json`` when present (a POC
    server's ``resources.json`` carries its storage folders), else from FLARE's ``*.default``
    files; writing twice gives the same files. Returns the files written.
    """
    _check_code(code)
    if role not in ("server", "client"):
        raise ValueError(f"role must be server or client, got {role!r}")
    if data_kind is not None and data_kind not in DATA_KINDS:
        raise ValueError(f"{DATA_KIND_PROPERTY} must be one of {DATA_KINDS}, got {data_kind!r}")
    local = Path(local_dir)
    resources = _read_json(local, "resources.json")
    authorization = _read_json(local, "authorization.json")
    if role == "client":
        resources = with_site_launcher(resources)
    files = {
        "resources.json": resources_for(code, resources),
        "authorization.json": authorization_for(code, authorization),
        "privacy.json": privacy_policy(),
    }
    if role == "client":
        files[SITE_CONFIG_TEMPLATE] = site_config_template(data_kind, job, site)
    for name, content in files.items():
        (local / name).write_text(json.dumps(content, indent=2) + "\n")
    return [local / name for name in files]


def set_heartbeat_timeout(startup_dir: str | Path, seconds: int = SERVER_HEARTBEAT_TIMEOUT) -> Path:
    """Write ``heart_beat_timeout`` into the server's ``startup/fed_server.json`` (read when the server starts)."""
    if seconds <= 10:
        raise ValueError(f"the heartbeat timeout must exceed the sites' 10 s heartbeat interval, got {seconds}")
    path = Path(startup_dir) / "fed_server.json"
    if not path.is_file():
        raise DataNotFoundError(f"{path}: not found; is {startup_dir} a server's startup/ folder?")
    config = json.loads(path.read_text())
    for server in config["servers"]:
        server["heart_beat_timeout"] = seconds
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def setup_kit(
    kit: str | Path, code: str = "byoc", job: str | Path | None = None, data_kind: str | None = None
) -> list[Path]:
    """This bundle's ``local/`` files (and the server's heartbeat timeout) in a startup kit made without
    ``provisioning/project.yml``'s builder: one that FLARE's distributed provisioning (``nvflare package``) assembled
    at the participant. The kit's startup files say its role; a site's name is its kit folder's. An admin's kit needs
    nothing (returns no files)."""
    kit = Path(kit)
    startup = kit / "startup"
    if (startup / "fed_server.json").is_file():
        written = write_local_folder(kit / "local", "server", code)
        return [*written, set_heartbeat_timeout(startup, SERVER_HEARTBEAT_TIMEOUT)]
    if (startup / "fed_client.json").is_file():
        return write_local_folder(kit / "local", "client", code, data_kind, job, kit.name)
    if (startup / "fed_admin.json").is_file():
        return []
    raise DataNotFoundError(f"{kit}: not a startup kit (no startup/fed_server.json, fed_client.json or fed_admin.json)")


def _read_json(local: Path, name: str) -> dict[str, Any]:
    for path in (local / name, local / f"{name}.default"):
        if path.is_file():
            return json.loads(path.read_text())
    raise DataNotFoundError(f"{local / name}(.default): not found; is {local} a participant's local/ folder?")


def _check_code(code: str) -> None:
    if code not in CODE_DELIVERIES:
        raise ValueError(f"code must be one of {CODE_DELIVERIES}, got {code!r}")


class SurgicalAggregationBuilder(Builder):
    """Provisioning builder: this bundle's ``local/`` files in the server's and every site's kit, and the
    server's heartbeat timeout (how soon a site that went down is logged out, see ``SERVER_HEARTBEAT_TIMEOUT``).

    Put it after ``StaticFileBuilder`` (it reads the ``*.default`` files that builder writes). A
    client's ``data_kind`` property in ``project.yml`` fills in its site config template, whose recipe and
    preprocessing are those of ``job`` (a job folder, relative to where ``nvflare provision`` runs; a bundle job's
    path, such as ``jobs/nih_chexpert``, from anywhere: :func:`site_config_template`).
    """

    def __init__(self, code: str = "byoc", heartbeat_timeout: int = SERVER_HEARTBEAT_TIMEOUT, job: str | None = None):
        _check_code(code)
        self.code = code
        self.heartbeat_timeout = heartbeat_timeout
        self.job = job

    def build(self, project: Project, ctx: ProvisionContext) -> None:
        server = project.get_server()
        if server is not None:
            write_local_folder(ctx.get_local_dir(server), "server", self.code)
            set_heartbeat_timeout(ctx.get_kit_dir(server), self.heartbeat_timeout)
        for client in project.get_clients():
            kind = client.get_prop(DATA_KIND_PROPERTY)
            write_local_folder(ctx.get_local_dir(client), "client", self.code, kind, self.job, client.name)
