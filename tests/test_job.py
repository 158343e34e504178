"""The committed job folder is exactly what the job writer produces; specs are checked before writing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import surgical_aggregation
from surgical_aggregation.cli import main
from surgical_aggregation.config import SiteConfigError, load_site_config
from surgical_aggregation.flare.job import CLIENT_COMMAND, nih_chexpert_spec, write_job

REPOSITORY = Path(__file__).resolve().parents[1]
COMMITTED = REPOSITORY / "jobs" / "nih_chexpert"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_committed_job_is_the_writers_output(tmp_path):
    assert main(["write-job", "--name", "nih_chexpert", "--out", str(tmp_path / "job")]) == 0
    assert _files(COMMITTED) == _files(tmp_path / "job"), "run: surgical-aggregation write-job --out jobs/nih_chexpert"


def test_main_job_layout():
    meta = json.loads((COMMITTED / "meta.json").read_text())
    assert meta["deploy_map"] == {"app": ["server", "site-nih", "site-chexpert"]}
    assert meta["min_clients"] == 2
    server = json.loads((COMMITTED / "app/config/config_fed_server.json").read_text())
    assert [w["path"] for w in server["workflows"]] == [
        "surgical_aggregation.flare.controller.SurgicalAggregatorShareable",
        "nvflare.app_common.workflows.cross_site_model_eval.CrossSiteModelEval",
    ]
    for site, kind in (("site-nih", "nih"), ("site-chexpert", "chexpert")):
        config = load_site_config(COMMITTED / f"app/config/site_configs/{site}.json")
        assert config.data.kind == kind and config.data.location is None  # embedded data out of the box
    # the job holds configuration only, plus a two-line entry point: no copy of the package's source
    python_files = sorted(p.name for p in COMMITTED.rglob("*.py"))
    assert python_files == ["client.py"]
    assert len((COMMITTED / "app/custom/client.py").read_text().splitlines()) == 5


def test_external_process_variant_has_no_entry_point(tmp_path):
    spec = nih_chexpert_spec()
    spec.client_execution = "external_process"
    write_job(spec, tmp_path / "job")
    client = json.loads((tmp_path / "job/app/config/config_fed_client.json").read_text())
    assert client["executors"][0]["executor"]["args"]["command"] == CLIENT_COMMAND
    assert not (tmp_path / "job/app/custom/client.py").exists()


def test_bad_specs_are_refused_before_anything_is_written(tmp_path):
    spec = nih_chexpert_spec()
    spec.controller["backbone_strategy"] = "fedprox"
    with pytest.raises(ValueError, match="backbone_strategy must be one of"):
        write_job(spec, tmp_path / "a")
    spec = nih_chexpert_spec()
    spec.sites["site-nih"]["batch_size"] = -1
    with pytest.raises(SiteConfigError, match=r"job 'nih_chexpert' site 'site-nih'\.batch_size must be positive"):
        write_job(spec, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_preinstalled_job_has_no_custom_folder_and_runs_the_installed_trainer(tmp_path):
    assert main(["write-job", "--code", "preinstalled", "--out", str(tmp_path / "job")]) == 0
    job = tmp_path / "job"
    assert not (job / "app" / "custom").exists()  # not bring-your-own-code: the allow-list applies
    arguments = json.loads((job / "app/config/config_fed_client.json").read_text())["executors"][0]["executor"]["args"]
    assert arguments["execution_mode"] == "external_process" and arguments["command"] == CLIENT_COMMAND
    assert _files(job / "app/config/site_configs") == _files(COMMITTED / "app/config/site_configs")
    assert json.loads((job / "meta.json").read_text()) == json.loads((COMMITTED / "meta.json").read_text())


def test_shipped_library_is_the_package_without_caches(tmp_path):
    assert main(["write-job", "--ship-library", "--out", str(tmp_path / "job")]) == 0
    shipped = tmp_path / "job/app/custom/surgical_aggregation"
    package = Path(surgical_aggregation.__file__).parent
    expected = {str(p.relative_to(package)) for p in package.rglob("*.py")}
    assert {str(p.relative_to(shipped)) for p in shipped.rglob("*.py")} == expected
    assert "flare/controller.py" in expected and not list(shipped.rglob("__pycache__"))
    assert (tmp_path / "job/app/custom/client.py").is_file()


def test_code_delivery_combinations_that_cannot_work_are_refused(tmp_path):
    spec = nih_chexpert_spec()
    spec.code = "preinstalled"  # still in_process
    with pytest.raises(ValueError, match="needs client_execution='external_process'"):
        write_job(spec, tmp_path / "a")
    spec = nih_chexpert_spec()
    spec.code, spec.client_execution, spec.ship_library = "preinstalled", "external_process", True
    with pytest.raises(ValueError, match="ship_library puts the package in app/custom/"):
        write_job(spec, tmp_path / "b")
    spec = nih_chexpert_spec()
    spec.code = "shipped"
    with pytest.raises(ValueError, match=r"code must be one of \('byoc', 'preinstalled'\)"):
        write_job(spec, tmp_path / "c")
