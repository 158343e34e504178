"""The sites' validation of each round's model through FLARE's simulator, against hostile sites whose client scripts
alter what they send (``benchmarks/hostile_site.py``'s test doubles), held to what the numbers do:

* three NIH-layout sites averaged by the plain mean (an operator's choice), ``site-3`` negating and doubling its
  update and reporting no metric (``test_blind_defences_e2e``'s plain run, made once for both): from round 1 both
  other sites are materially better off without ``site-3``'s result, and the round is made without it (to 1e-4 of
  the honest sites' mean update), for the rest of the job;
* the default job's two sites, ``site-chexpert`` raising its rows' biases: the honest site's loss rises far, its
  ranking and its recalibrated loss do not, so the harm test flags nothing, and the job fails closed by the initial
  model's bar (the mean of the two sites' changes against their start).
* the default job's two sites, ``site-chexpert`` negating its head rows' updates: in their warm-up round the rows both
  sites hold point apart, and with two sites the job stops.

Its own module, so that its jobs are made beside ``test_defences_e2e``'s. Removing the defence makes its test fail
(the closing note of issue 48 shows each).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from surgical_aggregation.core import judging
from surgical_aggregation.core.head import NAMED_HEAD
from surgical_aggregation.flare.client import PUBLISHED_MODEL_FILE
from surgical_aggregation.flare.recipe import nih_chexpert_recipe
from test_blind_defences_e2e import PLAIN_POISONED_RUN, poisoned_federation
from test_defences_e2e import (
    POISONING,
    ROUNDS,
    _app,
    _assert_round_is,
    _exchange,
    _history,
    _simulate,
    _updates,
    _weight_keys,
)

from helpers import better_off_by_a_base_rate, built_once, load_benchmark, tiny_recipe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def three_sites(tmp_path_factory):
    """Three such sites averaged by the plain mean (no robust rule, no clipping, no direction check, no size bound),
    ``site-3`` sending its update negated and doubled."""
    return built_once(tmp_path_factory, PLAIN_POISONED_RUN, lambda root: poisoned_federation(root, blind=False))


@pytest.fixture(scope="module")
def two_sites(tmp_path_factory):
    def build(root: Path) -> tuple[int, str, Path]:
        cache = root / "cache"
        # the validation guard alone: its raised biases also turn its rows against site-nih's in the warm-up round,
        # which stops a two-site job before any validation (the test below)
        controller = {"min_clients": 1, "reject_opposed_updates": False}
        recipe = tiny_recipe(nih_chexpert_recipe, cache, rounds=ROUNDS, controller=controller)
        job = load_benchmark("hostile_site").write_job_with_hostile_sites(
            recipe, root / "job", {"site-chexpert": "poisoned_rows"}
        )
        code, output = _simulate(job, root / "ws", cache)
        return code, output, root / "ws"

    return built_once(tmp_path_factory, "defences-two-sites", build)


@pytest.fixture(scope="module")
def two_sites_rows_apart(tmp_path_factory):
    def build(root: Path) -> tuple[int, str, Path]:
        cache = root / "cache"
        recipe = tiny_recipe(nih_chexpert_recipe, cache, rounds=1)
        job = load_benchmark("hostile_site").write_job_with_hostile_sites(
            recipe, root / "job", {"site-chexpert": "rows_inverted"}
        )
        code, output = _simulate(job, root / "ws", cache)
        return code, output, root / "ws"

    return built_once(tmp_path_factory, "defences-two-sites-rows-apart", build)


def test_a_contribution_both_other_sites_are_better_off_without_is_left_out(three_sites):
    """``site-3`` sends its update negated and doubled; with the plain mean the round's model undoes the honest
    sites' training. Round 0, from untrained heads, is judged by the loss against where it started (it is not worse
    than that: it is the start, about). From round 1 on, the other sites' validation finds the model made without
    ``site-3``'s result materially better: the round is made of theirs alone (to 1e-4), and so is every later round
    (an excluded site stays out), ``site-3`` is named in the history, the log and its own outcome, and the job goes
    on to publish."""
    code, output, workspace = three_sites
    assert code == 0, output[-4000:]
    history = _history(workspace)
    excluded = [entry for entry in history if POISONING in entry.get("aggregation", {}).get("excluded", {})]
    assert excluded, "site-3 was never left out"
    first = excluded[0]
    assert first["round"] == 1 and first["screening"]["action"] == "exclude"
    judged = first["screening"]["left_out"][f"without {POISONING}"]
    assert set(judged) == {"site-1", "site-2"}
    better_off_by_a_base_rate(judged)
    page = (Path(__file__).parents[1] / "docs" / "server-checks.md").read_text()
    said = re.search(
        r"better off without it in round 1 by ([\d.]+) of loss \(p ([\de.+-]+)\) and by ([\d.]+) once each model is "
        r"recalibrated in the large, far inside that test's 10 % margin \(p above 0.5\)",
        " ".join(page.split()),
    )
    assert said, "the page no longer quotes this run"
    for figures in judged.values():  # as the page says, to the run's own figures on another CPU (a 2-core AMD EPYC,
        # family 25 model 1, gave 0.0980 where the page quotes 0.0987)
        assert float(said[1]) == pytest.approx(figures["loss"]["better_by"], abs=1e-3)
        assert said[2] == f"{figures['loss']['p']:.0e}"
        assert float(said[3]) == pytest.approx(figures["loss"]["recalibrated"]["better_by"], abs=1e-3)
    assert judging.IMPROVEMENT_SHARE == 0.10
    assert [entry["round"] for entry in excluded] == list(range(first["round"], ROUNDS))  # out for the rest of the job
    for entry in excluded:
        round_number = entry["round"]
        assert entry["screening"]["excluded"] == [POISONING]
        keys = [*_weight_keys(_exchange(workspace, "site-1", round_number, "sent")), *NAMED_HEAD.keys]
        updates = _updates(workspace, round_number, ["site-1", "site-2"], keys)
        _assert_round_is(workspace, round_number, ROUNDS, (updates["site-1"] + updates["site-2"]) / 2, keys)
    assert f"{POISONING} excluded: left out of the round" in output
    assert list(_app(workspace, "site-1").glob(PUBLISHED_MODEL_FILE))


def test_with_two_sites_raised_biases_fail_closed_by_the_initial_models_bar_not_by_the_harm_test(two_sites):
    """``site-chexpert`` raises its rows' biases: the mean of two results moves every finding's base rate at
    site-nih, its loss far above its own model's, its ranking untouched. The harm test judges the losses recalibrated
    in the large too (stop 98), so no site is flagged (a base rate is the site's to set right); the job still fails
    closed, non-zero, nothing published: no trained model's judged change against the initial model (the mean of the
    two sites') is at most 0. In round 0 the model ranks site-nih's images as its own model did, so its change counts
    recalibrated (stop 104: about 0) and the hostile site's own loss vetoes; from round 1 site-nih's ranking falls
    below its own model's and its loss as it is vetoes."""
    code, output, workspace = two_sites
    assert code != 0, output[-4000:]
    assert "harms a site" not in output
    assert "no trained global model was judged at least as good as the initial model by the sites" in output
    history = _history(workspace)
    trained = [entry for entry in history if entry["round"] >= 0]
    start = history[0]["validation"]["sites"]["site-nih"]
    yardstick = max(start["val_mean_auroc"], start["local_val_mean_auroc"])  # the start's ranking, its own model's
    forgiven = []
    for entry in trained:
        figures, bar = entry["validation"]["sites"]["site-nih"], entry["validation"]["bar"]
        assert entry["screening"]["flags"] == {}
        assert figures["val_loss_minus_own"] > 0.5 and figures["val_recalibrated_loss_minus_own"] < 0.01
        assert abs(figures["val_auroc_minus_own"]) < 0.1
        # the bar forgives site-nih its intercepts where the model ranks its images at least as well as its start and
        # its own first-round model did (stop 104); elsewhere its loss as it is vetoes
        ranks = figures["val_mean_auroc"] >= yardstick
        assert ("site-nih" in bar.get("recalibrated", {})) == ranks and bar["judged_change"] > 0
        forgiven += [entry["round"]] * ranks
    assert forgiven == [0]
    # there site-nih's change counted about 0 and the hostile site's own validation vetoed, as it reported it: a change
    # at or under 0 from it would have carried the mean of two (a liar's to move, as the mean of two raw changes was)
    first = trained[0]["validation"]["bar"]
    assert abs(first["changes"]["site-nih"]) < 0.01 and first["changes"]["site-chexpert"] > 0.5
    assert not list(workspace.glob(f"site-*/simulate_job/app_site-*/{PUBLISHED_MODEL_FILE}"))
    assert not any(entry.get("validation", {}).get("best") for entry in history)


def test_two_sites_whose_shared_rows_point_apart_in_their_warm_up_stop_the_job(two_sites_rows_apart):
    """``site-chexpert`` negates its head rows' updates (what training on inverted labels does to them): in the
    warm-up round the 7 rows both sites hold point apart on average, the server cannot tell which site is hostile,
    and the job stops non-zero after round 0, naming the case; nothing is published."""
    code, output, workspace = two_sites_rows_apart
    assert code != 0, output[-4000:]
    assert (
        "round 0: two sites made the round (['site-chexpert', 'site-nih']) and in their warm-up round their updates "
        "of the 7 head rows both hold point apart (mean cosine -"
    ) in output
    assert "with two sites the server cannot tell which result is hostile. Nothing is published" in output
    aggregation = _history(workspace)[1]["aggregation"]
    assert aggregation["two_sites"]["shared_rows"] == 7 and aggregation["two_sites"]["shared_rows_mean_cosine"] < 0
    assert not list(workspace.glob(f"site-*/simulate_job/app_site-*/{PUBLISHED_MODEL_FILE}"))
