from __future__ import annotations

import json

import pytest

from surgical_aggregation.training.config import (
    SITE_CONFIG_ENV,
    SiteConfig,
    SiteConfigError,
    find_site_config,
    load_site_config,
    site_config_from_dict,
)


def test_defaults_follow_the_papers_recipe():
    config = site_config_from_dict({})
    assert config == SiteConfig()
    assert (config.settings.image_size, config.batch_size, config.learning_rate) == (224, 64, 5e-5)
    assert (config.warmup_epochs, config.warmup_learning_rate, config.local_epochs) == (15, 1e-3, 1)
    assert config.data.split_fractions == [0.7, 0.1, 0.2]
    assert config.data.location is None  # embedded data unless a site says where its data is


def test_the_modalitys_fields_sit_flat_in_the_file_and_belong_to_the_modality():
    images = site_config_from_dict({"data": {"kind": "nih"}, "image_size": 64, "embedded": {"patients": 30}})
    assert (images.settings.image_size, images.settings.embedded.patients) == (64, 30)
    written = images.to_dict()
    assert written["image_size"] == 64 and "embedding_model" not in written and "settings" not in written
    assert site_config_from_dict(written) == images
    # a file that lists every field of the bundle (as jobs once wrote them): another modality's at its default is
    # accepted and not kept
    every_field = {"image_size": 224, "embedded": {"patients": 200, "image_size": 64, "seed": 0}}  # images' defaults
    reports = site_config_from_dict({"data": {"kind": "iu_reports"}, **every_field})
    assert reports.settings.embedding_model == "all-MiniLM-L6-v2" and "image_size" not in reports.to_dict()


def test_values_are_read_and_labels_canonicalised(tmp_path):
    path = tmp_path / "site.json"
    path.write_text(json.dumps({"data": {"kind": "chexpert", "labels": ["Effusion", "edema"]}, "learning_rate": 1}))
    config = load_site_config(path)
    assert config.data.labels == ["Pleural Effusion", "Edema"]
    assert config.learning_rate == 1.0 and isinstance(config.learning_rate, float)


def test_a_sites_label_aliases_come_inline_or_from_a_file_next_to_its_config(tmp_path):
    (tmp_path / "our-names.yaml").write_text("TB: Tuberculosis\nPneumo: Pneumothorax\n")
    path = tmp_path / "site.json"
    path.write_text(
        json.dumps({"data": {"labels": ["TB", "Pneumo", "Pneumonitis"], "label_aliases": "our-names.yaml"}})
    )
    config = load_site_config(path)
    assert config.data.labels == ["Tuberculosis", "Pneumothorax", "Pneumonitis"]  # "Pneumonitis": a class of its own
    assert config.data.label_aliases == {"TB": "Tuberculosis", "Pneumo": "Pneumothorax"}  # inlined: a job carries them
    assert site_config_from_dict(config.to_dict()).data.labels == config.data.labels
    for_job = load_site_config(path, job_aliases={"Tuberculosis": "Mycobacterial infection"})
    assert for_job.vocabulary.canonical("TB") == "Mycobacterial infection"  # the job's aliases win over the site's
    assert for_job.data.labels == ["Mycobacterial infection", "Pneumothorax", "Pneumonitis"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"batch_sise": 8}, r"site.json: unknown field\(s\) \['batch_sise'\]; known fields:"),
        ({"data": {"root": "/x"}}, r"site.json: unknown field\(s\) \['data.root'\]; known fields of data: \['kind',"),
        ({"batch_size": "64"}, r"site.json: batch_size must be a whole number, got '64'"),
        ({"batch_size": 0}, r"site.json: batch_size must be positive, got 0"),
        ({"amp": 1}, r"site.json: amp must be true or false, got 1"),
        ({"data": {"kind": "dicom"}}, r"site.json: data.kind must be one of"),
        ({"data": {"kind": "csv"}}, r"site.json: data.location is required for kind 'csv'"),
        (
            {"data": {"labels": ["Effusion", "pleural effusions"]}},
            r"site.json: data.labels: label 'pleural effusions' duplicates 'Effusion': both mean 'Pleural Effusion'",
        ),
        ({"data": {"label_aliases": {"TB": 3}}}, r"site.json: data.label_aliases: entry 'TB': 3: both must be"),
        ({"data": {"label_aliases": "none.json"}}, r"site.json: data.label_aliases: alias file not found: .*none.json"),
        ({"data": {"split_fractions": [0.8, 0.0, 0.2]}}, r"site.json: data.split_fractions must sum to 1"),
        ({"optimizer": "lamb"}, r"site.json: optimizer must be one of \['adam', 'adamw', 'sgd'\]"),
        ({"device": "tpu"}, r"site.json: device must be auto, cpu, cuda or cuda:N"),
        ({"image_size": 8}, r"site.json: image_size must be at least 16 pixels"),
        ({"in_channels": 2}, r"site.json: in_channels must be 1 or 3, got 2"),
        (
            {"embedded": {"co_occurrence": "pairs"}},
            r"site.json: embedded.co_occurrence must be one of \[.shared., .padchest.\], got .pairs.",
        ),
        ({"embedding_model": "bert"}, r"site.json: embedding_model is read by reports sites only; .* \(kind 'nih'\)"),
        (
            {"data": {"kind": "iu_reports"}, "image_size": 64},
            r"site.json: image_size is read by images sites only; this site's data \(kind 'iu_reports'\) is reports",
        ),
        ({"data": {"kind": "iu_reports"}, "embedding_model": "bert"}, r"site.json: embedding_model must be one of"),
    ],
)
def test_errors_name_the_file_and_field(tmp_path, values, message):
    path = tmp_path / "site.json"
    path.write_text(json.dumps(values))
    with pytest.raises(SiteConfigError, match=message):
        load_site_config(path)


def test_unreadable_file_errors(tmp_path):
    with pytest.raises(SiteConfigError, match="site config not found"):
        load_site_config(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SiteConfigError, match=r"bad.json: not valid JSON"):
        load_site_config(tmp_path / "bad.json")


def test_lookup_prefers_environment_then_site_local_then_job_default(tmp_path, monkeypatch):
    monkeypatch.delenv(SITE_CONFIG_ENV, raising=False)
    app = tmp_path / "site-a" / "job-1" / "app_site-a"
    job_default = app / "config" / "site_configs" / "site-a.json"
    local = tmp_path / "site-a" / "local" / "surgical_aggregation.json"
    with pytest.raises(
        SiteConfigError, match=r"no site config for 'site-a'; looked for: .*local/surgical_aggregation.json"
    ):
        find_site_config("site-a", app)
    job_default.parent.mkdir(parents=True)
    job_default.write_text("{}")
    assert find_site_config("site-a", app) == (job_default, "the job's default for this site")
    local.parent.mkdir(parents=True)
    local.write_text("{}")
    assert find_site_config("site-a", app) == (local, "the site's local folder")
    chosen = tmp_path / "elsewhere.json"
    chosen.write_text("{}")
    monkeypatch.setenv(SITE_CONFIG_ENV, str(chosen))
    assert find_site_config("site-a", app) == (chosen, f"${SITE_CONFIG_ENV}")
