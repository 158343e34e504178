"""What one of this bundle's job folders says, read from its files (no FLARE): its sites, the controller's settings,
each site's default config and the consortium's label aliases.

The POC tool, the provisioning builder (a kit's site config template is written from the job it is provisioned for)
and ``check-site`` read a job through these functions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.errors import DataNotFoundError, SiteConfigError
from ..training.config import SITE_CONFIGS_DIR
from .protocol import JOB_ALIASES_FILE, SERVER_SITE

CONTROLLER_CLASS = "SurgicalAggregatorShareable"


def _json(path: Path) -> Any:
    if not path.is_file():
        raise DataNotFoundError(f"{path.resolve()}: not found; is this one of the bundle's job folders?")
    try:
        return json.loads(path.read_text())
    except ValueError as error:
        raise SiteConfigError(f"{path.resolve()}: not valid JSON ({error})") from None


def job_sites(job_folder: str | Path) -> list[str]:
    """The client sites of a job folder's deploy map, in order."""
    meta_path = Path(job_folder) / "meta.json"
    if not meta_path.is_file():
        raise DataNotFoundError(f"{meta_path.resolve()}: not found; is {job_folder} a FLARE job folder?")
    deploy_map = json.loads(meta_path.read_text()).get("deploy_map", {})
    sites = [site for targets in deploy_map.values() for site in targets if site != SERVER_SITE]
    if not sites:
        raise SiteConfigError(f"{meta_path.resolve()}: deploy_map names no client site")
    return list(dict.fromkeys(sites))


def controller_settings(job_folder: str | Path) -> dict[str, Any]:
    """The arguments of the job's ``SurgicalAggregatorShareable`` (its preprocessing, aliases, limits, ...)."""
    path = Path(job_folder) / "app_server" / "config" / "config_fed_server.json"
    for workflow in _json(path).get("workflows", []):
        if str(workflow.get("path", "")).endswith(CONTROLLER_CLASS):
            return dict(workflow.get("args", {}))
    raise SiteConfigError(f"{path.resolve()}: no {CONTROLLER_CLASS} workflow; is this one of this bundle's jobs?")


def site_default_config(job_folder: str | Path, site: str | None = None) -> dict[str, Any]:
    """The job's default site config for ``site``, or its first site's when it has none for that name."""
    sites = job_sites(job_folder)
    chosen = site if site in sites else sites[0]
    return _json(Path(job_folder) / f"app_{chosen}" / "config" / SITE_CONFIGS_DIR / f"{chosen}.json")


def job_label_aliases(job_folder: str | Path) -> dict[str, str]:
    """The consortium's label aliases the job's sites read (the same file in every site app), or none."""
    for site in job_sites(job_folder):
        path = Path(job_folder) / f"app_{site}" / "config" / JOB_ALIASES_FILE
        if path.is_file():
            return dict(_json(path))
    return {}
