"""Blind surgical aggregation through FLARE's simulator (``flare.blind``, ``flare.blind_site``): the same tiny
federation run plain and blind gives every site the same models, and nothing the blind server receives, writes or
logs holds a secret key, a plaintext row or a class name.

One pair of runs answers every test (the default job's two sites, tiny, 2 rounds, every exchange recorded).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from surgical_aggregation.core.blind import BlindSecret
from surgical_aggregation.core.head import NAMED_HEAD
from surgical_aggregation.core.labels import BUILTIN_VOCABULARY
from surgical_aggregation.flare.blind import BLIND_BEST_MODEL_FILE, SEEN_FILE
from surgical_aggregation.flare.client import PUBLISHED_MODEL_FILE
from surgical_aggregation.flare.recipe import nih_chexpert_recipe
from surgical_aggregation.training.checkpoint import load_checkpoint
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.profiles import SCRATCH
from surgical_aggregation.training.site_data import resolve_table

from helpers import MAIN_RUN, audit_exchange, build_main_run, built_once, run_main_job

pytestmark = pytest.mark.slow

SITES = ("site-nih", "site-chexpert")


def _classes(recipe) -> dict[str, list[str]]:
    """Each site's classes, canonical, as its config reads them."""
    return {site: list(site_config_from_dict(config).data.labels) for site, config in recipe.site_configs.items()}


def build_blind_run(root: Path) -> tuple[int, str, Path]:
    """The main run's job (:func:`helpers.run_main_job`) in blind mode: (exit code, output, workspace)."""
    return run_main_job(root, blind=True, configure=lambda configs: _with_secret(configs, root))


def _with_secret(configs: dict[str, dict], root: Path, union: list[str] | None = None) -> dict[str, dict]:
    """The consortium's secret, made once by a site and kept in each site's local/ folder (here: one file for all)."""
    union = sorted(union or {name for site in SITES for name in _site_labels(site)})
    secret = root / "local" / "blind_secret.json"
    secret.parent.mkdir(parents=True)
    secret.write_text(BlindSecret.new(union).to_json())
    secret.chmod(0o600)
    return {site: {**config, "blind_secret": str(secret)} for site, config in configs.items()}


BLIND_RUN = "blind-e2e-blind"  # built once for every module and worker that asks (``test_blind_defences_e2e`` too)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The pair of runs of one job, plain (the main run, shared with ``test_flare_e2e``) and blind; the blind one
    asked first, so that a worker here builds it while another builds the main run, not waits for it."""
    blind = built_once(tmp_path_factory, BLIND_RUN, build_blind_run)
    return {"plain": built_once(tmp_path_factory, MAIN_RUN, build_main_run), "blind": blind}


def _app(workspace: Path, site: str) -> Path:
    return workspace / site / "simulate_job" / f"app_{site}"


def _server(workspace: Path) -> Path:
    return workspace / "server" / "simulate_job" / "app_server"


def _trained_from(workspace: Path, site: str, round_number: int, direction: str) -> dict[str, np.ndarray]:
    """What ``site`` trained from in ``round_number`` (its audit's ``direction`` record: the plain site's
    ``received``, the blind site's ``decrypted``), each head row keyed by its canonical class name."""
    return _by_name(*audit_exchange(_app(workspace, site), round_number, direction))


def _by_name(state: dict, class_names: list[str]) -> dict[str, np.ndarray]:
    named = {key: np.asarray(value, dtype=np.float64) for key, value in state.items() if key not in NAMED_HEAD.keys}
    weight, bias = (np.asarray(state[key], dtype=np.float64) for key in NAMED_HEAD.keys)
    for index, name in enumerate(class_names):
        canonical = BUILTIN_VOCABULARY.canonical(name)
        named[f"row/{canonical}"] = np.append(weight[index], bias[index])
    return named


def _largest_difference(plain: dict[str, np.ndarray], blind: dict[str, np.ndarray]) -> float:
    """Over the entries both hold, but BatchNorm's batch counters: integers, not encrypted, each site's own."""
    shared = [key for key in blind if key in plain and not key.endswith("num_batches_tracked")]
    assert set(blind) <= set(plain), sorted(set(blind) - set(plain))
    return max(float(np.max(np.abs(plain[key] - blind[key]), initial=0.0)) for key in shared)


CKKS_ERROR = 1e-6  # CKKS's error on a sum (about 1e-7 here, docs/blind.md) and float32 rounding


def test_blind_and_plain_runs_give_every_site_the_same_models(runs):
    """Each site trains from the same model in both runs: in round 0 the very same one (its rows seeded by name at
    the site as at the plain server), in round 1 the first aggregate, the plain site's slice and the blind site's
    decryption of its parts, to CKKS precision. (Later rounds train from models that differ by that much, and Adam's
    first steps turn such differences into steps of its learning rate: the next test holds those rounds to the
    surgical mean of what the blind sites sent.)"""
    for mode, (code, output, _) in runs.items():
        assert code == 0, f"{mode}: {output[-4000:]}"
    plain_ws, blind_ws = runs["plain"][2], runs["blind"][2]
    for site in SITES:
        first_plain = _trained_from(plain_ws, site, 0, "received")
        first_blind = _trained_from(blind_ws, site, 0, "decrypted")
        assert _largest_difference(first_plain, first_blind) == 0.0, site
        plain, blind = _trained_from(plain_ws, site, 1, "received"), _trained_from(blind_ws, site, 1, "decrypted")
        assert any(key.startswith("row/") for key in blind)
        assert _largest_difference(plain, blind) <= CKKS_ERROR, site


def _sent(workspace: Path, site: str, round_number: int) -> dict[str, np.ndarray]:
    """What a blind site encrypted in ``round_number`` (its audit's ``encrypted`` record), rows by name."""
    return _trained_from(workspace, site, round_number, "encrypted")


def _surgical_mean(sent: dict[str, dict[str, np.ndarray]], site: str) -> dict[str, np.ndarray]:
    """By hand: each backbone entry the mean over the sites (uniform weights), each of ``site``'s rows the mean over
    the sites that sent that class."""
    own = sent[site]
    expected = {}
    for key in own:
        senders = [values[key] for values in sent.values() if key in values]
        expected[key] = np.mean(senders, axis=0)
    return expected


def test_each_blind_model_is_the_surgical_mean_of_what_the_sites_encrypted(runs):
    """Every model a blind site decrypted (to train from in round 1, and the published best one) is, to CKKS
    precision, the surgical mean computed here from what both sites encrypted the round before: the backbone over
    both, each of its rows over the sites that label the class, and no row of a class it does not label."""
    workspace = runs["blind"][2]
    for site in SITES:
        published = load_checkpoint(_app(workspace, site) / PUBLISHED_MODEL_FILE)
        best = int(published.meta["model_round"])
        checks = {"round 1": (0, _trained_from(workspace, site, 1, "decrypted"))}
        checks["published"] = (best, _by_name(published.state, published.class_names))
        for what, (made_in, decrypted) in checks.items():
            expected = _surgical_mean({name: _sent(workspace, name, made_in) for name in SITES}, site)
            assert sorted(key for key in decrypted if key.startswith("row/")) == sorted(
                f"row/{name}" for name in BUILTIN_VOCABULARY.canonical_list(_site_labels(site))
            )
            floats = [key for key in expected if not key.endswith("num_batches_tracked")]
            worst = max(float(np.max(np.abs(decrypted[key] - expected[key]), initial=0.0)) for key in floats)
            assert worst <= CKKS_ERROR, (site, what, worst)


def _site_labels(site: str) -> list[str]:
    """The site's classes, as its trainer reads them (canonical, its order)."""
    return list(resolve_table(site_config_from_dict(nih_chexpert_recipe(start=SCRATCH).site_configs[site])).classes)


def _class_names() -> set[str]:
    """Every spelling of every class of both sites: what must never reach the blind server."""
    names = set()
    for site in SITES:
        labels = _site_labels(site)
        names |= set(labels) | set(BUILTIN_VOCABULARY.canonical_list(labels))
    return names


def test_the_blind_server_receives_no_class_name_no_plaintext_row_and_no_secret_key(runs):
    code, output, workspace = runs["blind"]
    assert code == 0, output[-4000:]
    server = _server(workspace)
    seen = json.loads((server / SEEN_FILE).read_text())
    secret = BlindSecret.from_json((workspace.parent / "local" / "blind_secret.json").read_text(), "secret")
    tasks = {entry["task"] for entry in seen["received"]}
    assert {"describe", "train", "validate", "publish"} <= tasks
    offers = {}
    for entry in seen["received"]:
        if entry["task"] == "describe":  # a public context and a wrapped key (three byte arrays), no secret context
            assert set(entry["params"]) == {"public_context", "uint8[1-d]"} and entry["params"]["uint8[1-d]"] == 3
            assert entry["meta"]["blind"]["consortium"] == secret.fingerprint
            offers[entry["site"]] = entry["params"]["public_context"]["sha256"]
        elif entry["task"] == "train":  # ciphertexts only: bytes, never a float row
            assert entry["param_names"] == ["ciphertext"] and list(entry["params"]) == ["uint8[1-d]"], entry
        else:
            assert entry["params"] == {}, entry
        assert "class_names" not in entry["meta"]
        assert all("/" not in name for name in entry["metric_names"]), entry  # no per-class metric
    # nothing the server wrote or logged names a class (the simulator's server log, and every text file)
    texts = {
        path: path.read_text() for path in (workspace / "server").rglob("*") if path.suffix in (".json", ".txt", ".log")
    }
    assert any(path.name == SEEN_FILE for path in texts) and any(path.name == "log.txt" for path in texts)
    for path, text in texts.items():
        for name in _class_names():
            assert not re.search(rf"\b{re.escape(name)}\b", text), (path.name, name)
        assert secret.key.hex() not in text and secret.wrapping_key.hex() not in text
    # each site offered a key of its own; the job runs under the first site's (by name)
    assert len(set(offers.values())) == len(SITES) and seen["handshake"]["job_key_made_by"] == min(SITES)
    assert seen["handshake"]["public_context_sha256"] == offers[min(SITES)]
    # the sums the server kept are ciphertexts it cannot read; the sites' secret decrypts them to the best model
    assert (server / BLIND_BEST_MODEL_FILE).is_file()
