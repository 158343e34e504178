"""Blind mode's defences through FLARE's simulator: the sites' validation of what they decrypt leaves out a harmful
contribution the server cannot read, a site that sends no figure breaks nothing, and each blind job runs under its own
key. Its own module, so that its run is made beside ``test_blind_e2e``'s runs, not after them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from surgical_aggregation.core.labels import NIH_LABELS
from surgical_aggregation.experiments.grid_run import machine
from surgical_aggregation.flare.blind import SEEN_FILE
from surgical_aggregation.flare.client import PUBLISHED_MODEL_FILE
from surgical_aggregation.flare.recipe import DEMO, SurgicalAggregationRecipe
from surgical_aggregation.flare.results import HISTORY_FILE as HISTORY
from test_blind_e2e import BLIND_RUN, _app, _server, _with_secret, build_blind_run

from helpers import REPOSITORY, better_off_by_a_base_rate, built_once, errors_and_tail, load_benchmark, tiny_sites

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def blind_run(tmp_path_factory):
    """``test_blind_e2e``'s blind run (the same build, made once)."""
    return built_once(tmp_path_factory, BLIND_RUN, build_blind_run)


# the plain workflow's defences that read an update's values: off in the plain twin of the poisoned blind job, so
# that both are judged by the sites' validation alone (the one defence both modes share)
VALUE_DEFENCES_OFF = {
    "update_bound": None,
    "clip_updates": False,
    "reject_opposed_updates": False,
    "robust_aggregation": "mean",
}


PLAIN_POISONED_RUN = "plain-e2e-poisoned"  # also test_exclusion_e2e's three-site run

# how far a blind run's judged loss after round 1 may lie from plain mode's (docs/blind.md says so)
BLIND_ROUND_ONE_DRIFT = 0.005


def poisoned_federation(root: Path, blind: bool) -> tuple[int, str, Path]:
    """Three NIH-layout sites (tiny, the same 60 patients each), ``site-3`` sending its update negated and doubled
    and reporting no metric at all (it never judges, and the server must not need its figures), 3 rounds: blind, or
    plain with the defences that read values off. The plain sites record every exchange in full, so that
    test_exclusion_e2e recomputes its rounds from them (a record changes no number: the two modes' losses agree)."""
    cache = root / "cache"
    defences = load_benchmark("hostile_site")
    recorded = "off" if blind else "full"
    site = DEMO.site_config({"kind": "nih"}, embedded={"patients": 60}, record_exchanges=recorded)
    configs = tiny_sites({f"site-{index}": dict(site) for index in (1, 2, 3)}, cache)
    for config in configs.values():
        # learning_rate: the smoke network's honest rounds, large enough to be told from noise
        config.update(embedded={**config["embedded"], "patients": 60}, max_batches_per_epoch=8, learning_rate=3e-3)
    controller = {"num_rounds": 3, "min_clients": 1, "handshake_timeout": 300, "train_timeout": 600}
    if blind:
        recipe = SurgicalAggregationRecipe(
            "blind-poisoned", _with_secret(configs, root, NIH_LABELS), controller=controller, blind=True
        )
    else:
        recipe = SurgicalAggregationRecipe("plain-poisoned", configs, controller={**controller, **VALUE_DEFENCES_OFF})
    job = defences.write_job_with_hostile_sites(recipe, root / "job", {"site-3": "flip_x2_quiet"})
    code, output = defences.run_simulator(job, root / "ws", cache=cache, timeout=900)
    return code, output, root / "ws"


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    """The poisoned federation in blind mode: the server cannot see ``site-3``'s update."""
    return built_once(tmp_path_factory, "blind-e2e-poisoned", lambda root: poisoned_federation(root, blind=True))


@pytest.fixture(scope="module")
def poisoned_plain(tmp_path_factory):
    """The same federation in plain mode, judged by the sites' validation alone."""
    return built_once(tmp_path_factory, PLAIN_POISONED_RUN, lambda root: poisoned_federation(root, blind=False))


def test_two_blind_jobs_of_one_consortium_run_under_different_keys(blind_run, poisoned):
    keys = [
        json.loads((_server(workspace) / SEEN_FILE).read_text())["handshake"]["public_context_sha256"]
        for workspace in (blind_run[2], poisoned[2])
    ]
    assert len(set(keys)) == 2


def test_the_sites_validation_leaves_out_a_harmful_blind_contribution_and_a_silent_site_breaks_nothing(poisoned):
    """The server reads no update, so the checks of values cannot run; the sites' validation of what they decrypt
    still judges every model. ``site-3`` sends its update negated and doubled: from round 1 (round 0, from untrained
    heads, is judged against where it started only) both other sites find the sums made without ``site-3``'s
    ciphertexts (added again without them) materially better, so the round is made without it, and the job goes on
    to publish. ``site-3`` sends no metric at all: nothing waits for it."""
    code, output, workspace = poisoned
    assert code == 0, errors_and_tail(output)
    assert "Traceback" not in output
    history = json.loads((_server(workspace) / "round_history.json").read_text())
    excluded = [entry for entry in history if "site-3" in entry.get("aggregation", {}).get("excluded", {})]
    assert excluded, "site-3 was never left out"
    first, *later = excluded
    assert set(first["screening"]["left_out"]["without site-3"]) == {"site-1", "site-2"}
    better_off_by_a_base_rate(first["screening"]["left_out"]["without site-3"])
    assert [entry["round"] for entry in excluded] == list(range(first["round"], 3))  # out for the rest of the job
    for entry in excluded:
        assert "site-3" not in entry["validation"]["judged_by"]["sites"]
    for entry in later:
        assert entry["aggregation"]["excluded"]["site-3"].startswith(f"left out since round {first['round']}")
    assert "site-3 excluded: left out of the round" in output
    assert list(_app(workspace, "site-1").glob(PUBLISHED_MODEL_FILE))


def _decisions(workspace: Path) -> list[dict]:
    """What the round loop decided each round: who was left out, the screening's action, who judged, the best."""
    history = json.loads((_server(workspace) / HISTORY).read_text())
    return [
        {
            "round": entry["round"],
            "excluded": sorted(entry.get("aggregation", {}).get("excluded", {})),
            "action": entry.get("screening", {}).get("action"),
            "judged_by": sorted(entry.get("validation", {}).get("judged_by", {}).get("sites", [])),
            "best": bool(entry.get("validation", {}).get("best")),
        }
        for entry in history
    ]


def test_plain_and_blind_modes_judge_the_same_poisoned_federation_alike(poisoned, poisoned_plain):
    """One round loop (flare/loop.py) for both workflows: the same federation, judged by the sites' validation alone,
    leaves the same site out in the same rounds, with the same screening action, judges and best models, and both
    jobs end the same way. The sums differ only by the ciphertexts' rounding, far below what the judging tells."""
    (blind_code, blind_output, blind_workspace), (plain_code, plain_output, plain_workspace) = poisoned, poisoned_plain
    assert (plain_code, blind_code) == (0, 0), (errors_and_tail(plain_output), errors_and_tail(blind_output))
    plain, blind = _decisions(plain_workspace), _decisions(blind_workspace)
    assert plain == blind
    assert [round_["round"] for round_ in plain if round_["excluded"] == ["site-3"]] == [1, 2]
    assert any(round_["best"] for round_ in plain)
    # the model after round 0 is the same to the ciphertexts' rounding; later rounds train from it, and local training
    # amplifies that rounding: only the decisions must agree there. docs/blind.md quotes plain mode's losses (the same
    # on every run) and how far a blind run's lie from them after round 1.
    plain_losses, blind_losses = (
        [entry["validation"].get("judged_val_loss") for entry in json.loads((_server(ws) / HISTORY).read_text())]
        for ws in (plain_workspace, blind_workspace)
    )
    assert blind_losses[:2] == pytest.approx(plain_losses[:2], rel=1e-6)
    page = " ".join((REPOSITORY / "docs" / "blind.md").read_text().split())
    round_one = re.search(r"a judged loss of (\d\.\d{3}) after round 1 on both CPUs it ran on", page)
    assert round_one, "docs/blind.md no longer quotes plain mode's round 1"
    here = machine()  # the page's figures are those of the CPU kinds it ran on; another kind may train other bits
    if here in page:
        assert f"{plain_losses[2]:.3f}" == round_one[1]
        assert f"{plain_losses[3]:.3f} on an {here}" in page
    assert f"lie within {BLIND_ROUND_ONE_DRIFT} of plain mode's after round 1" in page
    assert abs(blind_losses[2] - plain_losses[2]) < BLIND_ROUND_ONE_DRIFT
