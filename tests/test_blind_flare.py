"""Blind mode's FLARE layer without a federation: what a blind job refuses, what the server accepts of an answer, and
the tables of docs/blind.md."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from surgical_aggregation.core.blind import (
    PART_PREFIX,
    SCALE_BITS,
    BlindAggregationError,
    params_as_parts,
    parts_as_params,
)
from surgical_aggregation.core.errors import SiteConfigError
from surgical_aggregation.flare.blind import BLIND_REFUSED, classless_check, refused_table
from surgical_aggregation.flare.recipe import nih_chexpert_recipe, write_job
from surgical_aggregation.training.profiles import SCRATCH

from helpers import load_benchmark, marked_block

REPOSITORY = Path(__file__).resolve().parents[1]


RECIPE_OPTIONS = {  # the refused settings that are the recipe's own arguments, with a value asking for each
    "initial_model": "best_FL_global_model.pt",
    "site_to_site_evaluation": True,
    "update_privacy": {"path": "exclude_vars", "args": {}},
    "accepted_classes": ["Mass"],
    "label_aliases": {"Water On The Lung": "Effusion"},
}


@pytest.mark.parametrize("named", list(BLIND_REFUSED))
def test_a_blind_job_refuses_what_the_server_cannot_do_blind(named):
    options = {named: RECIPE_OPTIONS[named]} if named in RECIPE_OPTIONS else {"controller": {named: 1}}
    with pytest.raises(SiteConfigError, match=rf"blind mode cannot run \['{named}'\]: {named}: "):
        nih_chexpert_recipe(blind=True, **options)


def test_a_blind_job_writes_no_class_name_into_the_servers_app(tmp_path):
    job = write_job(nih_chexpert_recipe(blind=True), tmp_path / "job")
    server = "".join(path.read_text() for path in (job / "app_server").rglob("*.json"))
    assert "blind.BlindSurgicalAggregator" in server
    assert not any(name in server for name in ("Effusion", "Mass", "Atelectasis", "Cardiomegaly", "Edema"))


def test_ciphertexts_travel_as_bytes_and_nothing_else_is_taken_for_one():
    parts = {0: b"\x00\x01", 7: b"abc"}
    assert params_as_parts(parts_as_params(parts), "site-x") == parts
    with pytest.raises(BlindAggregationError, match=r"site-x: 'class_head\.weight' is not a ciphertext"):
        params_as_parts({"class_head.weight": np.zeros((2, 3), np.float32)}, "site-x")
    with pytest.raises(BlindAggregationError, match=rf"site-x: '{PART_PREFIX}000001' is float32 of shape \(3,\)"):
        params_as_parts({f"{PART_PREFIX}000001": np.zeros(3, np.float32)}, "site-x")


def test_a_per_class_metric_is_refused_without_its_name():
    checked, problems = classless_check({"val_loss": 0.5, "val_auroc/Mass": 0.7, "val_auroc/Edema": 0.6})
    assert checked == {"val_loss": 0.5}
    assert problems == ["2 metric(s) other than the documented ones refused (not named here)"]
    assert "Mass" not in " ".join(problems)


def test_the_threat_model_page_shows_the_refused_settings_and_the_measured_cost():
    page = (REPOSITORY / "docs" / "blind.md").read_text()
    block = marked_block(page, "blind-refused")
    assert block == refused_table()
    assert len(block.splitlines()) == 2 + len(BLIND_REFUSED)
    cost = load_benchmark("blind_cost")
    rows = json.loads((REPOSITORY / "docs" / "blind" / "cost.json").read_text())
    block = marked_block(page, cost.MARKER)
    assert block == "\n".join(cost.table(rows))
    assert {(row["sites"], row["classes"]) for row in rows} == {(2, 20), (2, 199), (7, 20), (7, 199)}
    assert max(row["largest_difference"] for row in rows) < 1e-6


@pytest.mark.slow
def test_the_blind_secret_command_writes_a_secret_only_its_owner_reads_and_never_replaces_one(tmp_path, capsys):
    from surgical_aggregation.cli import main
    from surgical_aggregation.core.blind import BlindSecret

    out = tmp_path / "local" / "blind_secret.json"
    assert main(["blind-secret", "--out", str(out), "--classes", "Mass", "effusion", "Nodule"]) == 0
    secret = BlindSecret.from_json(out.read_text(), str(out))
    assert secret.classes == ("Mass", "Nodule", "Pleural Effusion")  # canonical, in name order
    assert out.stat().st_mode & 0o777 == 0o600
    printed = capsys.readouterr().out
    assert f"{secret.fingerprint}" in printed and str(out) in printed
    before = out.read_text()
    assert main(["blind-secret", "--out", str(out), "--classes", "Mass"]) == 2
    assert "exists: a new secret would lock its sites out" in capsys.readouterr().err
    assert out.read_text() == before
    out.chmod(0o644)  # replaced whole with --force: the new file is its owner's only again
    assert main(["blind-secret", "--out", str(out), "--job", "nih_chexpert", "--force"]) == 0
    assert len(BlindSecret.from_json(out.read_text(), str(out)).classes) == 20  # the job's union
    assert out.stat().st_mode & 0o777 == 0o600 and [path.name for path in out.parent.iterdir()] == [out.name]


def _session(tmp_path: Path, blind_secret: str | None):
    import logging

    from surgical_aggregation.flare.client import ClientSession
    from surgical_aggregation.training.config import site_config_from_dict

    from helpers import tiny_sites

    values = tiny_sites(nih_chexpert_recipe(start=SCRATCH).site_configs, tmp_path / "cache")["site-nih"]
    config = site_config_from_dict({**values, "blind_secret": blind_secret}, "site config")
    return ClientSession("site-nih", config, tmp_path / "job" / "app_site-nih", logging.getLogger("test"))


def test_a_site_sends_nothing_of_its_classes_to_a_server_of_the_other_mode(tmp_path, caplog):
    """A site without the consortium's secret in a blind job, and a site with one in a plain job, answer the
    handshake with nothing (the blind server refuses it; the plain server cannot read it) and say why in their log;
    with the secret in a blind job the answer holds positions and the public context, never a class name."""
    from nvflare.app_common.abstract.fl_model import FLModel

    from surgical_aggregation.core.blind import JOB_KEY_PARAMS, PUBLIC_CONTEXT, BlindSecret
    from surgical_aggregation.flare.protocol import META_BLIND, META_CLASS_NAMES, TASK_DESCRIBE, TASK_SUBMIT_MODEL

    blind_task = FLModel(params={}, meta={META_BLIND: {"weighting": "uniform"}})
    plain_site = _session(tmp_path / "plain-site", None)
    answer = plain_site.handle(TASK_DESCRIBE, blind_task)
    assert (answer.params, answer.meta) == ({}, {})
    assert "this job runs in blind mode and this site's config has no blind_secret" in caplog.text

    secret_file = tmp_path / "local" / "blind_secret.json"
    secret_file.parent.mkdir()
    secret = BlindSecret.new(sorted([*plain_site.class_names, "Fracture", "Lung Opacity"]))  # two it does not label
    secret_file.write_text(secret.to_json())
    secret_file.chmod(0o644)  # as a copy onto a shared drive leaves it: the site refuses a secret others can read
    with pytest.raises(SiteConfigError, match=r"blind_secret .*blind_secret.json can be read by others \(mode 644\)"):
        _session(tmp_path / "blind-site", str(secret_file))
    secret_file.chmod(0o600)
    blind_site = _session(tmp_path / "blind-site", str(secret_file))
    answer = blind_site.handle(TASK_DESCRIBE, FLModel(params={}, meta={}))
    assert (answer.params, answer.meta) == ({}, {})
    assert "this site's config has blind_secret, so it takes part in blind jobs only" in caplog.text

    # a blind site answers the blind tasks only: asked for its model (site-to-site evaluation), it sends nothing
    answer = blind_site.handle(TASK_SUBMIT_MODEL, FLModel(params={}, meta={META_BLIND: {"weighting": "uniform"}}))
    assert (answer.params, answer.meta) == ({}, {})
    answer = blind_site.handle(TASK_DESCRIBE, blind_task)
    assert META_CLASS_NAMES not in answer.meta and set(answer.params) == {PUBLIC_CONTEXT, *JOB_KEY_PARAMS}
    assert bytes(answer.params[PUBLIC_CONTEXT]) == bytes(answer.params["job_key/public"])  # a fresh key of its own
    assert answer.meta[META_BLIND]["consortium"] == secret.fingerprint
    again = blind_site.handle(TASK_DESCRIBE, blind_task)  # every handshake (every job) offers a new key
    assert bytes(again.params[PUBLIC_CONTEXT]) != bytes(answer.params[PUBLIC_CONTEXT])
    sent = json.dumps(answer.meta)
    assert not any(name in sent for name in secret.classes)
    assert len(answer.meta[META_BLIND]["wanted"]) == answer.meta[META_BLIND]["parts"] - 2  # not its two slots


def test_what_a_blind_server_still_checks_of_answers_it_cannot_read():
    """The handshake: an answer without the blind fields, with class names, or with a context holding the secret key
    is refused; a round's result: the wrong number of ciphertexts or bytes that are no ciphertext is refused."""
    from surgical_aggregation.core.blind import PUBLIC_CONTEXT, BlindCipher, BlindSecret, split_job_key
    from surgical_aggregation.flare.blind import BlindSurgicalAggregator
    from surgical_aggregation.flare.protocol import META_BLIND, META_CLASS_NAMES

    server = BlindSurgicalAggregator()
    secret = BlindSecret.new(["Mass", "Nodule"])
    job_key = secret.new_job_key("job")
    offer = {PUBLIC_CONTEXT: np.frombuffer(job_key.public, np.uint8), **job_key.as_params()}
    blind = {META_BLIND: {"parts": 5, "wanted": [0, 3], "consortium": secret.fingerprint}}
    entries, _ = split_job_key(offer)
    assert server._handshake_problem(blind, offer) == (
        None, {**blind[META_BLIND], "context": job_key.public, "job_key": entries}
    )  # fmt: skip
    with_secret = {**offer, PUBLIC_CONTEXT: np.frombuffer(job_key.cipher.to_bytes(), np.uint8)}
    refusals = [
        ({}, {}, "it did not answer in blind mode"),
        ({**blind, META_CLASS_NAMES: ["Mass"]}, offer, "it sent class names"),
        ({META_BLIND: {**blind[META_BLIND], "wanted": [0, 7]}}, offer, "not part numbers below 5"),
        ({META_BLIND: {**blind[META_BLIND], "consortium": "Mass"}}, offer, "consortium fingerprint is not"),
        (blind, {PUBLIC_CONTEXT: offer[PUBLIC_CONTEXT]}, "it did not answer in blind mode"),  # no key offer
        (blind, with_secret, "context with the secret key"),
        (blind, {**offer, PUBLIC_CONTEXT: np.frombuffer(b"junk", np.uint8)}, "its public context cannot be read"),
    ]
    for meta, params, reason in refusals:
        problem, _ = server._handshake_problem(meta, params)
        assert reason in problem and "Mass" not in problem.replace("it sent class names", "")

    server._cipher, server._parts = BlindCipher.from_bytes(job_key.public), 2
    good = job_key.cipher.encrypt(np.arange(4096.0))[0]
    assert server._parts_problem({0: good, 1: good}) is None
    assert server._parts_problem({0: good}) == "it sent 1 ciphertexts, not the 2 of every update"
    assert server._parts_problem({0: good, 1: b"junk"}).startswith("ciphertext 1: not a ciphertext")
    # either would make the server's addition raise (TenSEAL adds vectors of one size and one scale only)
    short = job_key.cipher.encrypt(np.arange(3.0))[0]
    assert (
        server._parts_problem({0: good, 1: short})
        == "ciphertext 1: it holds 3 values, every ciphertext of an update 4096"
    )
    import tenseal

    context = tenseal.context_from(job_key.cipher.to_bytes())
    rescaled = tenseal.ckks_vector(context, list(np.arange(4096.0)), scale=2.0**30).serialize()
    assert server._parts_problem({0: good, 1: rescaled}) == (
        f"ciphertext 1: its scale is 2^30, the consortium's 2^{SCALE_BITS}"
    )


@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        ({"judging_sites": []}, "judging_sites must list at least one site name"),
        ({"judging_sites": "site-1"}, "judging_sites must list at least one site name"),
        ({"validation_guard": "yes"}, "validation_guard must be true or false"),
        ({"min_clients": 0}, "min_clients must be a positive integer"),
        ({"num_rounds": True}, "num_rounds must be a positive integer"),
    ],
)
def test_both_workflows_refuse_a_bad_setting_by_the_same_rule(setting, reason):
    """flare/settings.py's rules hold in the blind workflow as in the plain one: one rule, written once."""
    from surgical_aggregation.flare.blind import BlindSurgicalAggregator
    from surgical_aggregation.flare.controller import SurgicalAggregatorShareable

    for workflow in (SurgicalAggregatorShareable, BlindSurgicalAggregator):
        with pytest.raises(ValueError, match=reason):
            workflow(**setting)


def test_the_threat_model_pages_figures_are_the_cost_record_and_the_flooding_constants():
    """docs/blind.md's prose about the measured cost (its ranges over cost.json's four rows) and about the flooding
    (the standard deviation on a sum and at one site of ten images, and how many sites the tested error bound covers:
    the norm grows as the square root of the sites, held at an eighth of the budget for MOST_SITES)."""
    from surgical_aggregation.core.blind import FLOODING_SD, MOST_SITES

    page = " ".join((REPOSITORY / "docs" / "blind.md").read_text().split())
    rows = json.loads((REPOSITORY / "docs" / "blind" / "cost.json").read_text())

    def span(key: str, form: str = ".1f") -> str:
        values = [row[key] for row in rows]
        return f"{min(values):{form}} to {max(values):{form}}"

    ratios = [row["blind_bytes_per_site"] / row["plain_bytes_per_site"] for row in rows]
    assert f"A site sends {min(ratios):.0f} to {max(ratios):.0f} times the bytes of the plain job" in page
    assert (
        f"Encryption costs a site {span('blind_site_encrypt_seconds')} s a round and decryption with its flooding "
        f"{span('blind_site_decrypt_seconds')} s, against minutes of training; the server's additions take "
        f"{span('blind_server_add_seconds')} s."
    ) in page
    largest = max(row["largest_difference"] for row in rows)
    assert f"The largest difference from plain aggregation, {largest:.1e}".replace("e-07", "e-7") in page
    on_a_sum = f"{FLOODING_SD:.1e}"
    assert f"That gives {on_a_sum} on each summed value" in page
    assert f"(the flooding is {on_a_sum} on a sum)" in page
    one_small_site = f"{FLOODING_SD / (10 / 10_000):.1e}".replace("e-08", "e-8")  # its weight: 10 images over 10,000
    assert f"over 10,000): {one_small_site} at one site of ten images" in page
    assert f"at the 2^21 the test holds for {MOST_SITES} sites, the bound holds to {MOST_SITES * 8**2:,})" in page
