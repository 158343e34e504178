"""Each defence of docs/server-checks.md through FLARE's simulator, against hostile sites whose client scripts alter
what they send (``benchmarks/hostile_site.py``'s test doubles), held to what the numbers do: the global model of a
round is recomputed here from what every site recorded that it received and sent (``record_exchanges: full``).

One job answers the tests, built once: five NIH-layout sites (the same images at each) with the product's
defences: ``site-3`` triples its update, skewed, and claims 10^9 training samples (clipped to the round's median; a
robust rule counts each site once), ``site-4`` negates and doubles its update (against the round's consensus:
rejected), ``site-5`` negates its head rows' updates only (its 14 shared rows against their consensus in its warm-up
round: rejected, then left out for the job), and the model is the robust rule's aggregate of the others' clipped
updates. The sites' validation of each round's model (leaving a contribution out, stopping a two-site job) is
``test_exclusion_e2e``'s.

Removing any one defence makes its test fail (the closing note of issue 48 shows each).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from surgical_aggregation.core.head import NAMED_HEAD
from surgical_aggregation.core.robust import RobustRule, distinct_rows
from surgical_aggregation.flare.controller import SurgicalAggregatorShareable
from surgical_aggregation.flare.recipe import DEMO, SurgicalAggregationRecipe
from surgical_aggregation.flare.results import HISTORY_FILE
from surgical_aggregation.training.checkpoint import load_checkpoint

from helpers import audit_exchange, built_once, load_benchmark, tiny_sites

pytestmark = pytest.mark.slow

ROUNDS = 3
SITES = [f"site-{index + 1}" for index in range(5)]
INFLATING, FLIPPING, POISONING, INVERTING = "site-3", "site-4", "site-3", "site-5"
CLAIMED = 10**9
PATIENTS = 60  # the jobs' patients (every site holds them all)
STEPS, BATCH = 8, 8  # its training steps a round (each site has more than STEPS x BATCH training images), batch size
TIMEOUTS = {"handshake_timeout": 300, "train_timeout": 300, "validate_timeout": 300}


def _simulate(job: Path, workspace: Path, cache: Path) -> tuple[int, str]:
    return load_benchmark("hostile_site").run_simulator(job, workspace, cache=cache, timeout=600)


def _app(workspace: Path, site: str) -> Path:
    return workspace / site / "simulate_job" / f"app_{site}"


def _history(workspace: Path) -> list[dict]:
    return json.loads((workspace / "server" / "simulate_job" / "app_server" / HISTORY_FILE).read_text())


def _nih_sites(names: list[str], cache: Path) -> dict[str, dict]:
    site = DEMO.site_config({"kind": "nih"}, embedded={"patients": PATIENTS}, record_exchanges="full")
    configs = tiny_sites({name: site for name in names}, cache)
    for config in configs.values():
        config.update(embedded={**config["embedded"], "patients": PATIENTS}, max_batches_per_epoch=STEPS)
    return configs


def _hostile_job(root: Path, configs: dict, controller: dict, attacks: dict[str, str]) -> tuple[int, str, Path]:
    recipe = SurgicalAggregationRecipe("defences", configs, controller={**TIMEOUTS, **controller})
    job = load_benchmark("hostile_site").write_job_with_hostile_sites(recipe, root / "job", attacks)
    code, output = _simulate(job, root / "ws", root / "cache")
    return code, output, root / "ws"


@pytest.fixture(scope="module")
def five_sites(tmp_path_factory):
    """Five sites holding the same 60 embedded NIH-layout patients, with the product's defences (the robust rule,
    the direction check, clipping) under ``weighting: samples``."""

    def build(root: Path) -> tuple[int, str, Path]:
        controller = {"num_rounds": 2, "min_clients": 1, "weighting": "samples"}
        attacks = {INFLATING: "x3_claiming_1e9", FLIPPING: "flip_x2", INVERTING: "rows_inverted"}
        return _hostile_job(root, _nih_sites(SITES, root / "cache"), controller, attacks)

    return built_once(tmp_path_factory, "defences-five-sites", build)


def _exchange(workspace: Path, site: str, round_number: int, direction: str) -> dict[str, np.ndarray]:
    """What ``site`` received or sent with its training task of ``round_number``, as its audit kept it."""
    state, _ = audit_exchange(_app(workspace, site), round_number, direction)
    return {key: value.double().numpy() for key, value in state.items()}


def _weight_keys(state: dict[str, np.ndarray]) -> list[str]:
    """The backbone's learned weights: what the clipping calls "backbone weights" (no head, no BatchNorm statistics,
    no counters)."""
    return sorted(
        key
        for key in state
        if key not in NAMED_HEAD.keys and not key.endswith((".running_mean", ".running_var", ".num_batches_tracked"))
    )


def _global_after(workspace: Path, round_number: int, rounds: int, site: str = SITES[0]) -> dict[str, np.ndarray]:
    """The global model the round gave: what the sites received next round, or the server's last model (its head
    rows in ``site``'s class order, matched by name)."""
    if round_number + 1 < rounds:
        return _exchange(workspace, site, round_number + 1, "received")
    saved = load_checkpoint(workspace / "server" / "simulate_job" / "app_server" / "FL_global_model.pt")
    state = {key: value.double().numpy() for key, value in saved.state.items()}
    _, site_classes = audit_exchange(_app(workspace, site), round_number, "received")
    rows = [saved.class_names.index(name) for name in site_classes]
    for key in NAMED_HEAD.keys:
        state[key] = state[key][rows]
    return state


def _updates(workspace: Path, round_number: int, sites: list[str], keys: list[str]) -> dict[str, np.ndarray]:
    """Each site's update of ``keys`` in ``round_number`` (what it sent minus what it received), flattened."""
    updates = {}
    for site in sites:
        received, sent = (_exchange(workspace, site, round_number, direction) for direction in ("received", "sent"))
        updates[site] = np.concatenate([(sent[key] - received[key]).ravel() for key in keys])
    return updates


def _assert_round_is(workspace: Path, round_number: int, rounds: int, moved: np.ndarray, keys: list[str]) -> None:
    """The round's global model is what the sites received plus ``moved`` (the aggregate update of ``keys``)."""
    received = _exchange(workspace, SITES[0], round_number, "received")
    observed = _global_after(workspace, round_number, rounds)
    expected = np.concatenate([received[key].ravel() for key in keys]) + moved
    got = np.concatenate([observed[key].ravel() for key in keys])
    worst, scale = float(np.max(np.abs(got - expected))), float(np.max(np.abs(moved)))
    assert worst <= 1e-4 * scale, f"round {round_number}: the global model differs from the hand-computed by {worst}"


def test_the_five_site_job_completes_with_the_honest_sites_aggregated_every_round(five_sites):
    code, output, workspace = five_sites
    assert code == 0, output[-4000:]
    rounds = [entry["aggregation"] for entry in _history(workspace) if "aggregation" in entry]
    assert len(rounds) == 2
    for aggregation in rounds:
        assert aggregation["accepted"] == ["site-1", "site-2", INFLATING]


def test_an_update_against_the_rounds_consensus_is_rejected_every_round(five_sites):
    """``site-4`` sends its update negated and doubled (inside the size bound): its cosine with the robust aggregate
    of the round's updates is negative, so it is rejected in every round and nothing of it is aggregated."""
    code, output, workspace = five_sites
    assert code == 0, output[-4000:]
    for entry in [entry for entry in _history(workspace) if "aggregation" in entry]:
        aggregation = entry["aggregation"]
        assert "points against the round's consensus" in aggregation["rejected"].get(FLIPPING, "")
        assert (
            aggregation["directions"][FLIPPING]
            < 0
            < min(aggregation["directions"][site] for site in aggregation["accepted"])
        )


def test_a_site_whose_shared_head_rows_oppose_their_consensus_in_its_warm_up_is_left_out_for_the_job(five_sites):
    """``site-5`` trains honestly and negates its head rows' updates (as training on inverted labels turns them): its
    backbone update is an honest one, its 14 rows, each held by every site, point against their robust aggregates in
    its warm-up round (round 0), so it is rejected then and left out of every later round; the accepted sites' rows
    agree with them."""
    code, output, workspace = five_sites
    assert code == 0, output[-4000:]
    warmup, *later = [entry["aggregation"] for entry in _history(workspace) if "aggregation" in entry]
    reason = warmup["rejected"].get(INVERTING, "")
    assert reason.startswith("in its warm-up round its updates of the 14 head rows it shares with two or more other")
    assert warmup["opposed_at_warmup"] == [INVERTING] and warmup["excluded"] == {INVERTING: reason}
    shared = warmup["shared_rows"]
    assert shared[INVERTING]["rows"] == 14
    assert shared[INVERTING]["cosine"] < 0 < min(shared[site]["cosine"] for site in warmup["accepted"])
    assert later and all(list(aggregation["excluded"]) == [INVERTING] for aggregation in later)
    assert all(INVERTING not in aggregation["shared_rows"] for aggregation in later)


def test_the_model_is_the_robust_rules_aggregate_of_the_clipped_updates(five_sites):
    """The round's backbone weights are the job's robust rule (``robust_aggregation``, the product's default) over
    the three accepted updates (site-1's and site-2's one update, counted once), ``site-3``'s scaled down to the median
    size first: computed here from the sites' records to 1e-4 of the step. A tripled update and a claim of 10^9
    samples weigh as one site."""
    code, output, workspace = five_sites
    assert code == 0, output[-4000:]
    rule = RobustRule.parse(SurgicalAggregatorShareable().robust_aggregation)
    assert not rule.is_mean
    for entry in [entry for entry in _history(workspace) if "aggregation" in entry]:
        aggregation, round_number = entry["aggregation"], entry["round"]
        accepted = aggregation["accepted"]
        keys = _weight_keys(_exchange(workspace, accepted[0], round_number, "sent"))
        updates = _updates(workspace, round_number, accepted, keys)
        norms = {site: float(np.linalg.norm(update)) for site, update in updates.items()}
        factor = float(np.median(list(norms.values()))) / norms[INFLATING]
        assert factor < 1.0
        assert aggregation["clipped"][INFLATING]["backbone weights"] == pytest.approx(factor, rel=1e-3)
        updates[INFLATING] = updates[INFLATING] * factor
        assert aggregation["robust"]["backbone weights"] == 3
        # site-1, site-2 and site-5 train the same data with the same seed: one backbone update sent three times (site-5
        # rejected after, for its rows, and left out of round 1), which the rule counts once
        assert aggregation["duplicates"] == [["site-1", "site-2", *([INVERTING] if round_number == 0 else [])]]
        distinct = distinct_rows(np.stack([updates[site] for site in accepted]))
        _assert_round_is(workspace, round_number, 2, rule(distinct), keys)
