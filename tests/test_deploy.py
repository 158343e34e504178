"""Provisioning: provisioning/project.yml gives mTLS kits with the job's site names, the roles,
this bundle's local/ files (allow-list and authorization per code mode) and passing preflight checks."""

from __future__ import annotations

import csv
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID
from nvflare.apis.job_launcher_spec import JobReturnCode
from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST
from nvflare.app_common.job_launcher.process_launcher import ProcessHandle

from surgical_aggregation.flare.deploy import (
    DATA_LOCATION_PLACEHOLDER,
    SERVER_HEARTBEAT_TIMEOUT,
    SITE_CONFIG_TEMPLATE,
    authorization_for,
    bundle_component_paths,
    class_allow_list,
    job_component_paths,
    resources_for,
    set_heartbeat_timeout,
    site_config_template,
    write_local_folder,
)
from surgical_aggregation.flare.job_folder import controller_settings
from surgical_aggregation.flare.launcher import SITE_LAUNCHER, LostProcessHandle
from surgical_aggregation.flare.poc import free_port
from surgical_aggregation.flare.recipe import PRIVACY_SCOPE, nih_chexpert_recipe, write_job
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.site_data import resolve_table

REPOSITORY = Path(__file__).resolve().parents[1]
PROJECT = REPOSITORY / "provisioning" / "project.yml"
MAIN_JOB = REPOSITORY / "jobs" / "nih_chexpert"
NVFLARE = Path(sys.executable).parent / "nvflare"
SERVER = "fl-server.consortium.example"
SITES = {"site-nih": "nih", "site-chexpert": "chexpert"}
ADMINS = {
    "coordinator@consortium.example": "project_admin",
    "lead@nih.example": "lead",
    "it@nih.example": "org_admin",
    "lead@stanford.example": "lead",
    "it@stanford.example": "org_admin",
}
BUNDLE_CLASSES = {
    "surgical_aggregation.flare.controller.SurgicalAggregatorShareable",
    "surgical_aggregation.flare.persistor.SurgicalModelPersistor",
    "nvflare.app_common.executors.client_api_executor.ClientAPIExecutor",
}


def _provision(tmp_path: Path, code: str) -> Path:
    """Provision a copy of the project (free ports, the given code mode); returns prod_00."""
    project = yaml.safe_load(PROJECT.read_text())
    server = next(p for p in project["participants"] if p["type"] == "server")
    server["fed_learn_port"], server["admin_port"] = free_port(), free_port()
    builder = next(b for b in project["builders"] if b["path"].endswith("SurgicalAggregationBuilder"))
    builder["args"] = {**builder["args"], "code": code}  # its job as written: jobs/nih_chexpert
    copy = tmp_path / "project.yml"
    copy.write_text(yaml.safe_dump(project))
    result = subprocess.run(  # outside the repository, as an operator would
        [str(NVFLARE), "provision", "-p", str(copy), "-w", str(tmp_path / "ws")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp_path / "ws" / "surgical_aggregation" / "prod_00"


@pytest.fixture(scope="module")
def byoc_kits(tmp_path_factory):
    return _provision(tmp_path_factory.mktemp("byoc"), "byoc")


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_project_names_the_jobs_sites():
    project = yaml.safe_load(PROJECT.read_text())
    clients = [p["name"] for p in project["participants"] if p["type"] == "client"]
    assert clients == nih_chexpert_recipe().sites
    meta = _json(REPOSITORY / "jobs" / "nih_chexpert" / "meta.json")
    assert clients == [site for sites in meta["deploy_map"].values() for site in sites if site != "server"]


@pytest.mark.slow
def test_kits_are_mtls_with_the_sites_names_and_certificates(byoc_kits):
    server = _json(byoc_kits / SERVER / "startup" / "fed_server.json")
    assert server["servers"][0]["connection_security"] == "mtls"
    # a site that went down is logged out after 2 minutes without a heartbeat (FLARE's default: 10 minutes)
    assert server["servers"][0]["heart_beat_timeout"] == SERVER_HEARTBEAT_TIMEOUT == 120
    for site in SITES:
        startup = byoc_kits / site / "startup"
        client = _json(startup / "fed_client.json")
        assert client["client"]["fqsn"] == site and client["client"]["connection_security"] == "mtls"
        assert client["servers"][0]["service"]["target"].startswith(f"{SERVER}:")
        certificate = x509.load_pem_x509_certificate((startup / "client.crt").read_bytes())
        assert certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == site
        root = x509.load_pem_x509_certificate((startup / "rootCA.pem").read_bytes())
        assert certificate.issuer == root.subject  # signed by the project's root CA
        assert (startup / "client.key").is_file()


@pytest.mark.slow
def test_admin_certificates_carry_their_roles(byoc_kits):
    for user, role in ADMINS.items():
        certificate = x509.load_pem_x509_certificate((byoc_kits / user / "startup" / "client.crt").read_bytes())
        subject = certificate.subject
        assert subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == user
        assert subject.get_attributes_for_oid(NameOID.UNSTRUCTURED_NAME)[0].value == role


def _without_launcher(resources: dict) -> tuple[dict, list[str]]:
    """The resources less their job launcher component, and the launcher's class path(s)."""
    others = [component for component in resources["components"] if component["id"] != "process_launcher"]
    launchers = [component["path"] for component in resources["components"] if component["id"] == "process_launcher"]
    return {**resources, "components": others}, launchers


@pytest.mark.slow
def test_byoc_kits_keep_flares_policies_and_get_the_bundles_files(byoc_kits):
    for participant in (SERVER, *SITES):
        local = byoc_kits / participant / "local"
        assert _json(local / "authorization.json") == _json(local / "authorization.json.default")
        resources, launchers = _without_launcher(_json(local / "resources.json"))
        default, default_launchers = _without_launcher(_json(local / "resources.json.default"))
        assert resources == default
        # a site launches its job processes with the bundle's launcher (a killed one costs the job one site)
        assert launchers == (default_launchers if participant == SERVER else [SITE_LAUNCHER])
        assert _json(local / "privacy.json")["default_scope"] == PRIVACY_SCOPE
    lead = _json(byoc_kits / "site-nih" / "local" / "authorization.json")["permissions"]["lead"]
    assert lead["byoc"] == "any" and lead["submit_job"] == "any"
    for site, kind in SITES.items():
        template = _json(byoc_kits / site / "local" / SITE_CONFIG_TEMPLATE)
        assert template["data"]["kind"] == kind and template["data"]["location"] == DATA_LOCATION_PLACEHOLDER
        job_preprocessing = controller_settings(MAIN_JOB)["preprocessing"]  # the kits are for the main job
        assert {key: template[key] for key in job_preprocessing} == job_preprocessing and template["device"] == "auto"
        site_config_from_dict(template)  # a valid config once the location is filled in
        # provisioned outside the repository, "jobs/nih_chexpert" is the bundle's job, as committed
        assert template == site_config_template(kind, MAIN_JOB, site)
    assert not (byoc_kits / SERVER / "local" / SITE_CONFIG_TEMPLATE).exists()


@pytest.mark.slow
def test_preinstalled_kits_allow_list_the_bundle_and_refuse_byoc(tmp_path):
    kits = _provision(tmp_path, "preinstalled")
    for participant in (SERVER, *SITES):
        local = kits / participant / "local"
        resources = _json(local / "resources.json")
        assert resources["class_list_enforcement_mode"] == "enforce"
        allowed = resources["class_allow_list"]
        assert allowed[: len(DEFAULT_CLASS_ALLOW_LIST)] == list(DEFAULT_CLASS_ALLOW_LIST)
        assert set(allowed) >= BUNDLE_CLASSES
        assert not any(entry.endswith(".") for entry in allowed)  # exact classes, no package wildcards
        # everything else of FLARE's default resources is kept
        default = _json(local / "resources.json.default")
        if participant != SERVER:
            resources, _ = _without_launcher(resources)
            default, _ = _without_launcher(default)
        assert {k: v for k, v in resources.items() if k != "class_allow_list"} == {
            k: v for k, v in default.items() if k != "class_allow_list"
        }
        permissions = _json(local / "authorization.json")["permissions"]
        assert all(role == "none" or role["byoc"] == "none" for role in permissions.values())
        assert permissions["project_admin"]["submit_job"] == "any"
        assert permissions["lead"]["submit_job"] == "any" and permissions["org_admin"]["submit_job"] == "none"


def test_every_component_of_a_preinstalled_job_is_allow_listed(tmp_path):
    job = write_job(nih_chexpert_recipe(code="preinstalled", client_execution="external_process"), tmp_path / "job")
    assert not list(job.glob("app*/custom"))
    assert job_component_paths(job) <= set(class_allow_list(bundle_component_paths()))
    assert job_component_paths(job) >= BUNDLE_CLASSES
    # provisioning/README.md: how many exact classes a preinstalled participant's allow-list adds to FLARE's
    added = len(resources_for("preinstalled", {})["class_allow_list"]) - len(DEFAULT_CLASS_ALLOW_LIST)
    readme = " ".join((REPOSITORY / "provisioning" / "README.md").read_text().split())
    assert f"the exact classes of the bundle's jobs and filters it lacks ({added}, no wildcards)" in readme


def test_authorization_for_preinstalled_spells_out_the_project_admins_rights():
    provisioned = {
        "format_version": "1.0",
        "permissions": {
            "project_admin": "any",
            "lead": {"submit_job": "any", "byoc": "any", "view": "any"},
            "member": {"view": "any"},
        },
    }
    policy = authorization_for("preinstalled", provisioned)
    assert policy["permissions"] == {
        "project_admin": {"byoc": "none", "submit_job": "any", "view": "any"},
        "lead": {"submit_job": "any", "byoc": "none", "view": "any"},
        "member": {"view": "any", "byoc": "none"},
    }
    assert authorization_for("byoc", provisioned) == provisioned
    assert provisioned["permissions"]["project_admin"] == "any"  # the input is not modified


def test_the_heartbeat_timeout_must_leave_room_for_the_sites_heartbeats(tmp_path):
    with pytest.raises(ValueError, match="must exceed the sites' 10 s heartbeat interval, got 5"):
        set_heartbeat_timeout(tmp_path, 5)
    with pytest.raises(FileNotFoundError, match=r"fed_server.json: not found; is .* a server's startup/ folder\?"):
        set_heartbeat_timeout(tmp_path, 60)


def test_local_folder_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"resources.json\(.default\): not found"):
        write_local_folder(tmp_path, "client")
    with pytest.raises(ValueError, match="code must be one of"):
        write_local_folder(tmp_path, "client", code="shipped")
    with pytest.raises(ValueError, match="data_kind must be one of"):
        write_local_folder(tmp_path, "client", data_kind="xray")


def _preflight(kit: Path) -> list[str]:
    """The preflight checks a kit fails (the rows of FLARE's table whose problem is not PASSED)."""
    result = subprocess.run([str(NVFLARE), "preflight-check", "-p", str(kit)], capture_output=True, text=True)
    rows = [line.split("|") for line in result.stdout.splitlines() if line.startswith("| Check ")]
    return [cells[1].strip() for cells in rows if cells[2].strip() != "PASSED"]


@pytest.mark.slow
def test_kits_pass_preflight_except_reaching_a_server_that_is_not_running(byoc_kits):
    assert _preflight(byoc_kits / SERVER) == []  # ports, storage, a dry run of the server
    for participant in (*SITES, "lead@nih.example", "it@stanford.example"):
        assert _preflight(byoc_kits / participant) == ["Check server available"], participant


@pytest.mark.slow
def test_kits_carry_certificates_valid_for_360_days(byoc_kits):
    """provisioning/README.md's "Certificates expire" (FLARE 2.9's default lifetime)."""
    for path in (byoc_kits / "site-nih" / "startup" / "client.crt", byoc_kits / "site-nih" / "startup" / "rootCA.pem"):
        certificate = x509.load_pem_x509_certificate(path.read_bytes())
        lifetime = certificate.not_valid_after_utc - certificate.not_valid_before_utc
        # a participant's certificate ends with the root's, issued a moment after it
        assert abs(lifetime - datetime.timedelta(days=360)) < datetime.timedelta(minutes=1), (path, lifetime)


def test_committed_site_config_template_is_the_generators():
    committed = _json(REPOSITORY / "provisioning" / "site_config.template.json")
    assert committed == site_config_template(job=MAIN_JOB)
    with pytest.raises(FileNotFoundError, match=r"data\.location still holds the template's placeholder"):
        resolve_table(site_config_from_dict(committed))  # the placeholder is refused, not mistaken for data


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("import time; time.sleep(60)", JobReturnCode.UNKNOWN),  # killed by a signal below
        ("raise SystemExit(1)", JobReturnCode.EXECUTION_ERROR),
        ("pass", JobReturnCode.SUCCESS),
    ],
)
def test_the_site_launcher_reports_only_a_killed_job_process_as_no_failure(command, expected):
    process = subprocess.Popen([sys.executable, "-c", command])
    handle = LostProcessHandle(ProcessHandle(process=process), "job-1")
    if expected == JobReturnCode.UNKNOWN:
        process.send_signal(signal.SIGKILL)
    handle.wait()
    assert handle.poll() == expected


DISTRIBUTED = REPOSITORY / "provisioning" / "distributed"


def _nvflare(*arguments: str, cwd: Path, home: Path) -> str:
    """An nvflare command as a participant runs it (its own home: nvflare keeps an audit trail there)."""
    env = {**os.environ, "HOME": str(home)}
    result = subprocess.run([str(NVFLARE), *arguments], cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.slow
def test_distributed_provisioning_keeps_each_key_where_it_was_made_and_its_kits_pass_preflight(tmp_path, monkeypatch):
    """provisioning/README.md's "Keys that stay at the hospital": each participant makes its key and a certificate
    request; the project admin signs the request (it never sees a key); the participant assembles its kit, and
    ``setup-kit`` adds this bundle's local files."""
    from surgical_aggregation.cli import main

    ports = {"8002": str(free_port()), "8003": str(free_port())}
    admin, participants = tmp_path / "project_admin", {"server": "server.yaml", "site": "site-nih.yaml"}
    participants["lead"] = "lead-nih.yaml"
    admin.mkdir()
    profile = admin / "project_profile.yaml"
    profile.write_text(_with_ports((DISTRIBUTED / "project_profile.yaml").read_text(), ports))
    _nvflare("cert", "init", "--profile", str(profile), "-o", "ca", cwd=admin, home=admin)
    fingerprint = json.loads((admin / "ca" / "ca.json").read_text())["rootCA_fingerprint"]
    kits = {}
    for who, definition in participants.items():
        at = tmp_path / who  # the participant's own machine
        at.mkdir()
        (at / definition).write_text(_with_ports((DISTRIBUTED / definition).read_text(), ports))
        _nvflare("cert", "request", "-p", definition, "--out", "request", cwd=at, home=at)
        [request] = (at / "request").glob("*.request.zip")
        [key] = (at / "request").glob("*.key")
        signed = admin / request.name.replace(".request.zip", ".signed.zip")
        approve = ["cert", "approve", str(request), "-c", "ca", "--profile", str(profile), "--out", str(signed)]
        _nvflare(*approve, cwd=admin, home=admin)
        for travelled in (request, signed):  # what crosses between the participant and the project admin
            assert not [name for name in zipfile.ZipFile(travelled).namelist() if name.endswith(".key")]
        package = ["package", str(signed), "-w", "ws", "--request-dir", "request", "--fingerprint", fingerprint]
        _nvflare(*package, cwd=at, home=at)
        [kit] = (at / "ws" / "surgical_aggregation" / "prod_00").iterdir()
        assert [path.read_bytes() for path in (kit / "startup").glob("*.key")] == [key.read_bytes()]  # made here
        # as the README writes it, in the participant's folder (no jobs/ there: the bundle's job)
        setup = ["setup-kit", str(kit), "--job", "jobs/nih_chexpert", "--data-kind", "nih"]
        with monkeypatch.context() as here:
            here.chdir(at)
            assert main(setup) == 0
        kits[who] = kit
    # the lifetimes provisioning/README.md gives for this path: FLARE's cert init and cert approve defaults
    startup = kits["site"] / "startup"
    for path, days in ((startup / "rootCA.pem", 3650), (startup / "client.crt", 1095)):
        certificate = x509.load_pem_x509_certificate(path.read_bytes())
        lifetime = certificate.not_valid_after_utc - certificate.not_valid_before_utc
        assert abs(lifetime - datetime.timedelta(days=days)) < datetime.timedelta(minutes=1), (path, lifetime)
    assert (kits["site"] / "startup" / "client.key").read_bytes() == next(
        (tmp_path / "site" / "request").glob("*.key")
    ).read_bytes()
    assert _json(kits["site"] / "local" / "privacy.json")["default_scope"] == PRIVACY_SCOPE
    template = _json(kits["site"] / "local" / SITE_CONFIG_TEMPLATE)
    assert template == site_config_template("nih", MAIN_JOB, "site-nih")
    assert _preflight(kits["server"]) == []  # ports, storage, a dry run of the server
    assert _preflight(kits["site"]) == _preflight(kits["lead"]) == ["Check server available"]


def _with_ports(text: str, ports: dict[str, str]) -> str:
    for default, free in ports.items():
        text = text.replace(f": {default}", f": {free}")
    return text


@pytest.mark.slow
def test_the_distributed_provisioning_block_runs_as_written_on_two_machines(tmp_path):
    """provisioning/README.md's shell block, line by line as written: the project admin's lines in one folder, the
    participant's in another (its comments say whose line it is), only what the block says to send crossing
    between them, and the root CA's fingerprint put for ``<fingerprint>``."""
    readme = (REPOSITORY / "provisioning" / "README.md").read_text()
    [block] = [block for block in re.findall(r"```bash\n(.*?)```", readme, re.DOTALL) if "nvflare cert init" in block]
    ports = {"8002": str(free_port()), "8003": str(free_port())}
    admin, participant = tmp_path / "project_admin", tmp_path / "site-nih"
    (admin / "provisioning" / "distributed").mkdir(parents=True)
    participant.mkdir()
    profile = "provisioning/distributed/project_profile.yaml"
    (admin / profile).write_text(_with_ports((REPOSITORY / profile).read_text(), ports))
    (participant / "site-nih.yaml").write_text(_with_ports((DISTRIBUTED / "site-nih.yaml").read_text(), ports))
    environment = {**os.environ, "PATH": f"{NVFLARE.parent}{os.pathsep}{os.environ['PATH']}"}
    machine, ran = None, []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line.startswith("#"):
            machine = admin if line.startswith("# project admin") else participant
            continue
        command = line.split(" #", 1)[0].strip()
        if (admin / "ca" / "ca.json").is_file():
            command = command.replace("<fingerprint>", _json(admin / "ca" / "ca.json")["rootCA_fingerprint"])
        result = subprocess.run(
            command, shell=True, cwd=machine, env={**environment, "HOME": str(machine)}, capture_output=True, text=True
        )
        assert result.returncode == 0, (command, result.stdout[-2000:] + result.stderr[-2000:])
        ran.append(command.split()[:3])
        for sent in (*(participant / "request").glob("*.request.zip"), *admin.glob("*.signed.zip")):
            receiver = admin if sent.is_relative_to(participant) else participant
            shutil.copy(sent, receiver / sent.name)  # "send request/*.request.zip", "send back site-nih.signed.zip"
    assert [words[:2] for words in ran] == [["nvflare", "cert"]] * 3 + [["nvflare", "package"]] + [
        ["surgical-aggregation", "setup-kit"]
    ]
    kit = participant / "ws" / "surgical_aggregation" / "prod_00" / "site-nih"
    assert _json(kit / "local" / SITE_CONFIG_TEMPLATE) == site_config_template("nih", MAIN_JOB, "site-nih")
    assert sorted(str(path.relative_to(admin)) for path in admin.rglob("*.key")) == ["ca/rootCA.key"]  # no site key


def test_the_provisioning_pages_count_of_one_site_classes_is_the_consortiums_union_table():
    """provisioning/README.md: how many of the consortium's classes one site alone labels, from its run's table."""
    with open(REPOSITORY / "docs" / "cxr-consortium" / "union_classes.csv") as handle:
        union = list(csv.DictReader(handle))
    alone = sum(row["labelled_by"] == "1" for row in union)
    page = " ".join((REPOSITORY / "provisioning" / "README.md").read_text().split())
    assert f"(most classes of a consortium: {alone} of the {len(union)} in `cxr_consortium`)" in page
