"""The recipes: the committed job folders are exactly their export; bad arguments are refused before anything
is built; each code-delivery mode gives the folder FLARE expects."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.model import ModelLearnableKey

import surgical_aggregation
from surgical_aggregation.cli import main
from surgical_aggregation.core.checks.update import OPPOSED_FIRST_ROUND
from surgical_aggregation.core.methods import batchnorm_at_defaults
from surgical_aggregation.data.storage import CACHE_ENV
from surgical_aggregation.experiments import pretraining
from surgical_aggregation.experiments.runner import RunOptions, with_initial_model
from surgical_aggregation.flare.client import _config_hint
from surgical_aggregation.flare.persistor import SurgicalModelPersistor
from surgical_aggregation.flare.protocol import BUNDLE_JOBS
from surgical_aggregation.flare.recipe import (
    CLIENT_COMMAND,
    TASK_REQUEST_INTERVAL,
    SurgicalAggregationRecipe,
    cxr_consortium_recipe,
    nih_chexpert_recipe,
    write_job,
)
from surgical_aggregation.images.names import SMOKE_DENSENET
from surgical_aggregation.training.config import JOB_DEFAULT_ORIGIN, SiteConfigError, load_site_config
from surgical_aggregation.training.profiles import (
    BENCHMARK,
    DEMO,
    PAPERS_FINE_TUNING,
    SCRATCH,
    STAND_IN,
    STAND_IN_JOB_PATIENTS,
    STAND_IN_PRETRAINING,
)

REPOSITORY = Path(__file__).resolve().parents[1]
COMMITTED = REPOSITORY / "jobs" / "nih_chexpert"
SITES = ("site-nih", "site-chexpert")


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", BUNDLE_JOBS)
def test_committed_job_is_the_recipes_export(tmp_path, name):
    assert main(["write-job", "--name", name, "--out", str(tmp_path / "job")]) == 0
    committed = REPOSITORY / "jobs" / name
    assert _files(committed) == _files(tmp_path / "job"), (
        f"run: surgical-aggregation write-job --name {name} --out {committed}"
    )


def test_the_jobs_task_request_interval_is_the_one_the_operators_guide_gives():
    server = json.loads((COMMITTED / "app_server/config/config_fed_server.json").read_text())
    assert server["server"] == {"task_request_interval": TASK_REQUEST_INTERVAL}
    guide = " ".join((REPOSITORY / "provisioning" / "README.md").read_text().split())
    assert f'every {TASK_REQUEST_INTERVAL} s (`"server": {{"task_request_interval": {TASK_REQUEST_INTERVAL}}}`' in guide


def test_main_job_layout():
    meta = json.loads((COMMITTED / "meta.json").read_text())
    assert meta["deploy_map"] == {"app_server": ["server"], **{f"app_{site}": [site] for site in SITES}}
    assert meta["min_clients"] == 2 and meta["scope"] == "surgical_aggregation"
    server = json.loads((COMMITTED / "app_server/config/config_fed_server.json").read_text())
    # no FLARE cross-site evaluation of the sites' models by default: it would reveal their class sets
    assert [w["path"] for w in server["workflows"]] == [
        "surgical_aggregation.flare.controller.SurgicalAggregatorShareable"
    ]
    assert server["workflows"][0]["args"]["publish_global_model"] is True
    for site, kind in zip(SITES, ("nih", "chexpert"), strict=True):
        config = load_site_config(COMMITTED / f"app_{site}/config/site_configs/{site}.json")
        assert config.data.kind == kind and config.data.location is None  # embedded data out of the box
        # each site's app carries its own config only: no site learns another's from the job folder
        assert [p.name for p in (COMMITTED / f"app_{site}/config/site_configs").iterdir()] == [f"{site}.json"]
    # the job holds configuration only, plus a two-line entry point per site: no copy of the package's source
    python_files = sorted(str(p.relative_to(COMMITTED)) for p in COMMITTED.rglob("*.py"))
    assert python_files == [f"app_{site}/custom/client.py" for site in sorted(SITES)]
    assert len((COMMITTED / "app_site-nih/custom/client.py").read_text().splitlines()) == 5


def test_the_main_job_starts_from_the_stand_in_with_fedbn_plus_or_from_scratch_with_fedavg():
    """Where the backbone starts decides how it trains: FedBN+ and the papers' rates from pretrained weights (the
    stand-in or ImageNet's), FedAvg and the demo's rates from a random DenseNet121, whose BatchNorm FedBN+ would freeze
    at the identity."""
    standard = nih_chexpert_recipe()
    assert standard.persistor_args["pretrained_weights"] == STAND_IN
    assert standard.controller_args["backbone_strategy"] == "fedbn_plus"
    imagenet = nih_chexpert_recipe(start="/models/densenet121-a639ec97.pth")
    assert imagenet.persistor_args["pretrained_weights"] == "/models/densenet121-a639ec97.pth"
    scratch = nih_chexpert_recipe(start=SCRATCH)
    assert "pretrained_weights" not in scratch.persistor_args
    assert scratch.controller_args["backbone_strategy"] == "fedavg"
    # the direction check: every round from scratch (the controller's default), the first round from pretrained weights
    assert "reject_opposed_updates" not in scratch.controller_args
    assert standard.controller_args["reject_opposed_updates"] == OPPOSED_FIRST_ROUND
    assert imagenet.controller_args["reject_opposed_updates"] == OPPOSED_FIRST_ROUND
    operators = nih_chexpert_recipe(controller={"reject_opposed_updates": True})  # the operator's setting wins
    assert operators.controller_args["reject_opposed_updates"] is True
    # a blind job judges no direction (its server reads no update): the start adds nothing it would refuse
    for blind in (nih_chexpert_recipe(blind=True), cxr_consortium_recipe(start=STAND_IN, blind=True)):
        assert "reject_opposed_updates" not in blind.controller_args and blind.blind
    with pytest.raises(SiteConfigError, match=r"blind mode cannot run \['reject_opposed_updates'\]"):
        nih_chexpert_recipe(blind=True, controller={"reject_opposed_updates": True})
    for recipe, rates, patients in (
        (standard, PAPERS_FINE_TUNING, STAND_IN_JOB_PATIENTS),
        (imagenet, PAPERS_FINE_TUNING, STAND_IN_JOB_PATIENTS),
        (scratch, {"learning_rate": 3e-4, "warmup_learning_rate": 1e-3}, 400),
    ):
        for values in recipe.site_configs.values():
            assert {name: values[name] for name in rates} == dict(rates)
            assert values["embedded"]["patients"] == patients
    # the written job says so: the server's persistor names the stand-in, its controller FedBN+
    server = json.loads((COMMITTED / "app_server/config/config_fed_server.json").read_text())
    persistor = next(c for c in server["components"] if c["path"].endswith("SurgicalModelPersistor"))
    assert persistor["args"]["pretrained_weights"] == STAND_IN
    assert server["workflows"][0]["args"]["backbone_strategy"] == "fedbn_plus"
    assert server["workflows"][0]["args"]["reject_opposed_updates"] == OPPOSED_FIRST_ROUND


def test_the_stand_in_is_refused_for_another_network_and_start_for_another_job(tmp_path, capsys):
    sites = {site: {**values, "network": SMOKE_DENSENET} for site, values in nih_chexpert_recipe().site_configs.items()}
    with pytest.raises(
        SiteConfigError, match="the stand-in backbone is a densenet121, but the sites train a densenet-sm"
    ):
        nih_chexpert_recipe(sites)
    assert nih_chexpert_recipe(sites, start=SCRATCH).persistor_args["preprocessing"]["network"] == SMOKE_DENSENET
    continued = nih_chexpert_recipe(sites, initial_model="/models/best.pt").persistor_args  # its model is the start
    assert continued["initial_model"] == "/models/best.pt" and "pretrained_weights" not in continued
    color = {site: {**values, "in_channels": 3} for site, values in nih_chexpert_recipe().site_configs.items()}
    with pytest.raises(SiteConfigError, match=r"trained on images fed as .* but the sites feed \{'in_channels': 3\}"):
        nih_chexpert_recipe(color)
    for typo in ("stand_in", "", "weights"):
        with pytest.raises(SiteConfigError, match="start must be 'stand-in', 'scratch' or the path of a DenseNet121"):
            nih_chexpert_recipe(start=typo)
    assert main(["simulate", "--start", str(tmp_path / "nope.pth"), "--workspace", str(tmp_path / "ws")]) == 2
    assert f"--start {tmp_path / 'nope.pth'}: no such checkpoint file" in capsys.readouterr().err
    assert not (tmp_path / "ws").exists()
    assert main(["write-job", "--name", "report_labeling", "--start", SCRATCH, "--out", str(tmp_path / "job")]) == 2
    assert (
        "--start applies to the nih_chexpert and cxr_consortium jobs; report_labeling has no images"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "job").exists()


def test_the_consortium_starts_from_the_stand_in_or_where_it_is_told(tmp_path):
    """``cxr_consortium``: from the stand-in by default, the main job's start (the committed job: FedBN+, the papers'
    fine-tuning rates, the direction check in the first round), on its own sites' sizes; ``--start scratch``: FedAvg
    at the demo rates, the direction check every round."""
    standing, scratch = cxr_consortium_recipe(), cxr_consortium_recipe(start=SCRATCH)
    assert "pretrained_weights" not in scratch.persistor_args
    assert scratch.controller_args["backbone_strategy"] == "fedavg"
    assert standing.persistor_args["pretrained_weights"] == STAND_IN
    assert standing.controller_args["backbone_strategy"] == "fedbn_plus"
    assert standing.controller_args["reject_opposed_updates"] == OPPOSED_FIRST_ROUND
    assert "reject_opposed_updates" not in scratch.controller_args
    for site, values in standing.site_configs.items():
        assert {name: values[name] for name in PAPERS_FINE_TUNING} == dict(PAPERS_FINE_TUNING)
        assert values["embedded"] == scratch.site_configs[site]["embedded"]
        assert scratch.site_configs[site]["learning_rate"] != PAPERS_FINE_TUNING["learning_rate"]  # the demo's
    with pytest.raises(SiteConfigError, match="start must be 'stand-in', 'scratch' or the path of a DenseNet121"):
        cxr_consortium_recipe(start="stand_in")
    committed = json.loads(
        (REPOSITORY / "jobs" / "cxr_consortium" / "app_server/config/config_fed_server.json").read_text()
    )
    assert (
        next(c for c in committed["components"] if c["path"].endswith("SurgicalModelPersistor"))["args"][
            "pretrained_weights"
        ]
        == STAND_IN
    )
    assert main(["write-job", "--name", "cxr_consortium", "--start", SCRATCH, "--out", str(tmp_path / "job")]) == 0
    server = json.loads((tmp_path / "job" / "app_server/config/config_fed_server.json").read_text())
    persistor = next(c for c in server["components"] if c["path"].endswith("SurgicalModelPersistor"))
    assert "pretrained_weights" not in persistor["args"]
    assert server["workflows"][0]["args"]["backbone_strategy"] == "fedavg"


def test_the_persistor_builds_the_stand_in_once_and_starts_from_its_statistics(tmp_path, monkeypatch):
    """``pretrained_weights: "stand-in"``: at an image size the bundle ships no stand-in for, the server
    trains it when its cache lacks it (a tiny budget here; 40 minutes at 64 px), keeps it, and the initial global
    model holds its learned BatchNorm statistics, which FedBN+ then freezes."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(pretraining, "STAND_IN_PRETRAINING", {"images": 40, "epochs": 1})
    preprocessing = {"image_size": 32, "in_channels": 1, "imagenet_normalize": True}
    persistor = SurgicalModelPersistor(preprocessing=preprocessing, pretrained_weights=STAND_IN)
    learnable = persistor.load_model(FLContext())
    weights = learnable[ModelLearnableKey.WEIGHTS]
    built = tmp_path / "cache" / "pretrained" / f"{pretraining.Pretraining(32, images=40, epochs=1).name}.pt"
    assert built.is_file()
    stand_in = torch.load(built, weights_only=False)["state_dict"]
    key = next(name for name in stand_in if name.endswith("running_var"))
    assert np.allclose(weights[key], stand_in[key].numpy()) and not np.allclose(weights[key], 1.0)
    assert not batchnorm_at_defaults({name: torch.as_tensor(value) for name, value in weights.items()})
    assert learnable[ModelLearnableKey.META]["initial_model"].startswith(f"pretrained weights from {built}")
    stamp = built.stat().st_mtime_ns
    persistor.load_model(FLContext())  # found in the cache, not trained again
    assert built.stat().st_mtime_ns == stamp


def test_external_process_variant_has_no_entry_point(tmp_path):
    job = write_job(nih_chexpert_recipe(client_execution="external_process"), tmp_path / "job")
    client = json.loads((job / "app_site-nih/config/config_fed_client.json").read_text())
    assert client["executors"][0]["executor"]["args"]["command"] == CLIENT_COMMAND
    assert not list(job.rglob("client.py"))


def test_bad_arguments_are_refused_before_anything_is_built():
    with pytest.raises(ValueError, match="backbone_strategy must be one of"):
        nih_chexpert_recipe(controller={"backbone_strategy": "fedprox"})
    sites = nih_chexpert_recipe().site_configs
    sites["site-nih"]["batch_size"] = -1
    with pytest.raises(SiteConfigError, match=r"job 'broken' site 'site-nih': batch_size must be positive"):
        SurgicalAggregationRecipe("broken", sites)


def test_preinstalled_job_has_no_custom_folder_and_runs_the_installed_trainer(tmp_path):
    assert main(["write-job", "--code", "preinstalled", "--out", str(tmp_path / "job")]) == 0
    job = tmp_path / "job"
    assert not list(job.glob("app*/custom"))  # not bring-your-own-code: the allow-list applies
    arguments = json.loads((job / "app_site-nih/config/config_fed_client.json").read_text())["executors"][0]
    assert arguments["executor"]["args"]["execution_mode"] == "external_process"
    assert arguments["executor"]["args"]["command"] == CLIENT_COMMAND
    for site in SITES:
        folder = f"app_{site}/config/site_configs"
        assert _files(job / folder) == _files(COMMITTED / folder)
    assert json.loads((job / "meta.json").read_text()) == json.loads((COMMITTED / "meta.json").read_text())


def test_shipped_library_is_the_package_without_caches_and_only_the_server_carries_the_stand_in(tmp_path):
    assert main(["write-job", "--ship-library", "--out", str(tmp_path / "job")]) == 0
    shipped = tmp_path / "job/app_site-nih/custom/surgical_aggregation"
    package = Path(surgical_aggregation.__file__).parent
    expected = {str(p.relative_to(package)) for p in package.rglob("*.py")}
    assert {str(p.relative_to(shipped)) for p in shipped.rglob("*.py")} == expected
    assert "flare/controller.py" in expected and not list(shipped.rglob("__pycache__"))
    assert (tmp_path / "job/app_site-nih/custom/client.py").is_file()
    # the server's persistor starts from the stand-in; no site reads it (28 MB a site spared)
    stand_in = pretraining.shipped_stand_in(pretraining.Pretraining(64, **STAND_IN_PRETRAINING))
    relative = stand_in.relative_to(package)
    server = tmp_path / "job/app_server/custom/surgical_aggregation"
    assert (server / relative).read_bytes() == stand_in.read_bytes()
    assert not list(shipped.rglob("*.pt"))


def test_code_delivery_combinations_that_cannot_work_are_refused():
    with pytest.raises(ValueError, match="needs client_execution='external_process'"):
        nih_chexpert_recipe(code="preinstalled")  # still in_process
    with pytest.raises(ValueError, match="ship_library puts the package in custom/"):
        nih_chexpert_recipe(code="preinstalled", client_execution="external_process", ship_library=True)
    with pytest.raises(ValueError, match=r"code must be one of \('byoc', 'preinstalled'\)"):
        nih_chexpert_recipe(code="shipped")


def test_write_job_takes_a_sites_own_config_in_place_of_the_default(tmp_path):
    real = {"data": {"kind": "nih", "location": str(tmp_path / "NIH")}, "learning_rate": 1e-5, "image_size": 64}
    (tmp_path / "site-nih.json").write_text(json.dumps(real))
    arguments = ["write-job", "--out", str(tmp_path / "job"), "--site-config", f"site-nih={tmp_path / 'site-nih.json'}"]
    assert main(arguments) == 0
    written = load_site_config(tmp_path / "job/app_site-nih/config/site_configs/site-nih.json")
    assert written.data.location == str(tmp_path / "NIH") and written.learning_rate == 1e-5
    assert written.warmup_epochs == 15  # fields left out take the defaults (the papers' recipe)
    chexpert = "app_site-chexpert/config/site_configs"
    assert _files(tmp_path / "job" / chexpert) == _files(COMMITTED / chexpert)  # the other site keeps its default
    assert main([*arguments[:3], "--site-config", f"site-xyz={tmp_path / 'site-nih.json'}"]) == 2


def test_a_job_whose_sites_preprocess_differently_is_refused(tmp_path, capsys):
    larger = {"data": {"kind": "nih", "location": str(tmp_path / "NIH")}}  # the default 224 px, the other site 64
    (tmp_path / "site-nih.json").write_text(json.dumps(larger))
    site_config = f"site-nih={tmp_path / 'site-nih.json'}"
    assert main(["write-job", "--out", str(tmp_path / "job"), "--site-config", site_config]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: job 'nih_chexpert': site 'site-chexpert': it preprocesses its data otherwise: image_size 64 "
        "(site-nih's: 224); one preprocessing per federation, so the model can be used on every site's data: set "
        '"image_size": 224 in its site config'
    )
    assert not (tmp_path / "job").exists()


def test_the_job_sets_the_federations_preprocessing_and_each_tasks_time(tmp_path):
    arguments = ["write-job", "--out", str(tmp_path / "job"), "--train-timeout", "7200", "--handshake-timeout", "3600"]
    assert main(arguments) == 0
    controller = json.loads((tmp_path / "job/app_server/config/config_fed_server.json").read_text())["workflows"][0]
    assert controller["args"]["preprocessing"] == {"image_size": 64, "in_channels": 1, "imagenet_normalize": True}
    timeouts = {name: controller["args"][f"{name}_timeout"] for name in ("handshake", "train", "validate")}
    assert timeouts == {"handshake": 3600, "train": 7200, "validate": 300}  # validate: the job's default


def test_an_operator_leaves_a_site_out_and_sets_min_clients(tmp_path, capsys):
    arguments = ["write-job", "--name", "cxr_consortium", "--out", str(tmp_path / "job"), "--leave-out", "site-siim"]
    assert main([*arguments, "--leave-out", "site-rsna", "--min-clients", "4"]) == 0
    meta = json.loads((tmp_path / "job" / "meta.json").read_text())
    assert "site-siim" not in meta["deploy_map"] and "site-rsna" not in meta["deploy_map"]
    assert len(meta["deploy_map"]) == 6 and not (tmp_path / "job" / "app_site-siim").exists()  # 5 sites and the server
    controller = json.loads((tmp_path / "job/app_server/config/config_fed_server.json").read_text())["workflows"][0]
    assert controller["args"]["min_clients"] == 4
    assert main(["write-job", "--out", str(tmp_path / "other"), "--leave-out", "site-x"]) == 2
    assert (
        "has no site(s) ['site-x'] to leave out; its sites are ['site-chexpert', 'site-nih']" in capsys.readouterr().err
    )
    assert main(["write-job", "--out", str(tmp_path / "more"), "--min-clients", "3"]) == 2
    assert "min_clients 3 is more than its 2 site(s)" in capsys.readouterr().err


def test_the_job_carries_its_label_aliases_to_the_server_and_every_site_and_its_accepted_classes(tmp_path):
    (tmp_path / "consortium.json").write_text(json.dumps({"Opacity": "Consolidation", "TB": "Tuberculosis"}))
    arguments = ["write-job", "--out", str(tmp_path / "job"), "--label-aliases", str(tmp_path / "consortium.json")]
    accepted = ["--accepted-class", "Effusion", "--accepted-class", "Tuberculosis"]
    assert main([*arguments, *accepted]) == 0
    controller = json.loads((tmp_path / "job/app_server/config/config_fed_server.json").read_text())["workflows"][0]
    aliases = {"Opacity": "Consolidation", "TB": "Tuberculosis"}
    assert controller["args"]["label_aliases"] == aliases
    assert controller["args"]["accepted_classes"] == ["Pleural Effusion", "Tuberculosis"]
    for site in ("site-nih", "site-chexpert"):
        assert json.loads((tmp_path / f"job/app_{site}/config/label_aliases.json").read_text()) == aliases
    # without them the job has neither
    assert main(["write-job", "--out", str(tmp_path / "plain")]) == 0
    plain = json.loads((tmp_path / "plain/app_server/config/config_fed_server.json").read_text())["workflows"][0]
    assert "label_aliases" not in plain["args"] and "accepted_classes" not in plain["args"]
    assert not (tmp_path / "plain/app_site-nih/config/label_aliases.json").exists()


def test_a_bad_job_alias_file_is_one_error_line(tmp_path, capsys):
    (tmp_path / "consortium.json").write_text('{"TB": ""}')
    arguments = ["write-job", "--out", str(tmp_path / "job"), "--label-aliases", str(tmp_path / "consortium.json")]
    assert main(arguments) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {tmp_path / 'consortium.json'}: entry 'TB': '': both must be non-empty names"
    )


def test_site_to_site_evaluation_is_an_explicit_option(tmp_path):
    job = write_job(nih_chexpert_recipe(site_to_site_evaluation=True), tmp_path / "job")
    workflows = json.loads((job / "app_server/config/config_fed_server.json").read_text())["workflows"]
    evaluation = workflows[-1]
    assert evaluation["path"] == "nvflare.app_common.workflows.cross_site_model_eval.CrossSiteModelEval"
    assert "model_locator_id" not in evaluation["args"]  # the sites' models only; the server's go as slices


def test_a_site_config_error_at_a_site_names_the_file_the_user_edits():
    copy = Path("/ws/site-nih/simulate_job/app_site-nih/config/site_configs/site-nih.json")  # the workspace's copy
    assert _config_hint("site-nih", copy, JOB_DEFAULT_ORIGIN) == (
        " (site config: the job's app_site-nih/config/site_configs/site-nih.json; correct it in the job folder and "
        "run it again)"
    )
    own = Path("/hospital/ws/local/surgical_aggregation.json")
    assert _config_hint("site-nih", own, "the site's local folder") == f" (site config: {own}, the site's local folder)"
    assert _config_hint("site-nih", None, "") == ""  # no config found: the error lists where it looked


def test_the_stand_in_trains_by_its_own_recipe_whichever_profile_asks(tmp_path):
    """The cached stand-in's name holds only the pretraining's settings, so every caller must train the same file: the
    grids' benchmark profile (a 15-epoch head warm-up at 5e-3 for fine-tuning) asks for the very stand-in the main job
    and the demo build, trained with one head warm-up epoch and Adam at 1e-3 throughout, batch 64."""
    asked = {profile.name: pretraining.Pretraining.for_profile(profile) for profile in (DEMO, BENCHMARK)}
    assert asked["demo"] == asked["benchmark"] == pretraining.Pretraining(64, **STAND_IN_PRETRAINING)
    config = pretraining.pretraining_site_config(asked["benchmark"], tmp_path / "patterns.csv")
    recipe = (config.warmup_epochs, config.warmup_learning_rate, config.learning_rate, config.batch_size, config.seed)
    assert recipe == (1, 1e-3, 1e-3, 64, 0)
    assert (config.settings.image_size, tuple(config.data.split_fractions)) == (64, pretraining.PRETRAINING_SPLIT)


def test_every_caller_starts_from_the_shipped_stand_in_the_cpu_grids_runs_started_from(tmp_path, monkeypatch):
    """The profiles' stand-in ships with the bundle: the main job's persistor, a grid (the benchmark profile) and the
    pretraining function start from that file without training (an empty cache stays empty); it is the very file
    every run of the CPU grid in docs/benchmark started from (its digest), holds what its name promises, and its
    BatchNorm statistics are learned."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    stand_in = pretraining.Pretraining(64, **STAND_IN_PRETRAINING)
    shipped = pretraining.shipped_stand_in(stand_in)
    assert shipped is not None and shipped.parent == pretraining.SHIPPED_STAND_INS
    assert pretraining.pretrained_backbone(stand_in, tmp_path) == shipped
    grid = with_initial_model([], ["surgical"], BENCHMARK, RunOptions(pretrain="always", cache_dir=str(tmp_path)))
    assert grid.pretrained_weights == str(shipped)
    preprocessing = {"image_size": 64, "in_channels": 1, "imagenet_normalize": True}
    job = SurgicalModelPersistor(preprocessing=preprocessing, pretrained_weights=STAND_IN).load_model(FLContext())
    assert job[ModelLearnableKey.META]["initial_model"].startswith(f"pretrained weights from {shipped}")
    assert not (tmp_path / "pretrained").exists()
    digest = hashlib.sha256(shipped.read_bytes()).hexdigest()[:12]
    runs = list((REPOSITORY / "docs" / "benchmark" / "full-psi-cpu" / "runs").glob("*/*/seed*/result.json"))
    starts = {json.loads(run.read_text())["training"]["initial_model"].rsplit("(sha256 ", 1)[1] for run in runs}
    assert len(runs) >= 28 and starts == {f"{digest}...)"}
    assert f"sha256 `{digest}...`" in (REPOSITORY / "docs" / "data.md").read_text()
    assert f"here `{digest}`" in (REPOSITORY / "docs" / "benchmark" / "README.md").read_text()
    payload = torch.load(shipped, weights_only=True)
    record = json.loads(payload[pretraining.PRETRAINING_KEY])
    expected = json.loads(json.dumps(stand_in.settings()))  # what a build here writes: the shipped file's record
    assert record == {**expected, "description": stand_in.describe(), "classes": 32}
    assert not batchnorm_at_defaults(payload["state_dict"])


def test_the_docs_say_a_build_of_the_stand_in_has_its_bits_only_on_cpus_of_the_same_kernels():
    """docs/data.md and the benchmark page against a rebuild's record (``benchmarks/stand_in_bits.py``): built here on a
    CPU of other kernels, every tensor differs from the shipped file's, and the page's figures are the record's."""
    record = json.loads((REPOSITORY / "docs" / "stand-in" / "rebuild-amd-epyc-25-17.json").read_text())
    shipped = pretraining.shipped_stand_in(pretraining.Pretraining(64, **STAND_IN_PRETRAINING))
    assert (
        record["built"] == shipped.name and record["shipped_sha256"] == hashlib.sha256(shipped.read_bytes()).hexdigest()
    )
    assert record["built_sha256"] != record["shipped_sha256"] and record["tensors_that_differ"] == record["tensors"]
    assert record["machine"].startswith("AMD EPYC, family 25 model 17, AVX512")
    page = " ".join((REPOSITORY / "docs" / "benchmark" / "README.md").read_text().split())
    convolution = record["first_convolution"]
    assert (
        f"built on an AMD EPYC of family 25, model 17 (AVX512), every one of the {record['tensors']} tensors differs "
        f"(the first convolution's weights by up to {convolution['largest_difference']:.2f}, where they average "
        f"{convolution['mean_absolute_weight']:.2f} in size), though it tells its shapes apart as well (validation "
        f"AUROC {record['validation_mean_auroc_by_epoch'][-1]:.2f}; {record['seconds']:,} s;"
    ) in page
    data = " ".join((REPOSITORY / "docs" / "data.md").read_text().split())
    assert (
        "`pretrain` builds the same bits only on a CPU of the same kernels (on an AVX512 AMD EPYC every weight" in data
    )
    minutes = f"{round(record['seconds'] / 60)} minutes on 2 CPU cores at 64 px"
    assert f"({minutes}: {record['seconds']:,} s by the record below)" in data
    provisioning = " ".join((REPOSITORY / "provisioning" / "README.md").read_text().split())
    assert f"({minutes}, {record['seconds']:,} s by [a build's record]" in provisioning
