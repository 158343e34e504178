"""The server's checks as plain functions (``core/checks/``), with hand-computed expectations."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from surgical_aggregation.core.checks import STAGES, document_checks, registered_checks
from surgical_aggregation.core.checks.handshake import confusable_skeleton
from surgical_aggregation.core.checks.metrics import check_metrics
from surgical_aggregation.core.checks.model import (
    blame_for_failing_model,
    changes_against_the_bar,
    judged_loss,
    model_problems,
    recalibrated_changes,
)
from surgical_aggregation.core.checks.update import (
    MAX_SIZE_SCALE,
    ROWS,
    SAMPLES,
    STATISTICS,
    WEIGHTS,
    UpdateReference,
    UpdateSizes,
    capped_weights,
    clip_factors,
    consensus_cosines,
    free_riders,
    opposed_updates,
    persistently_opposed,
    size_scale,
    update_problems,
    update_sizes,
)
from surgical_aggregation.core.head import HeadSpec

HEAD = HeadSpec("head.weight", "head.bias")
DOCS = Path(__file__).resolve().parents[1] / "docs" / "server-checks.md"


def _state(conv: list[float], mean: list[float], var: list[float], rows: list[list[float]]) -> dict[str, np.ndarray]:
    rows_array = np.asarray(rows, dtype=np.float32)
    return {
        "conv.weight": np.asarray(conv, dtype=np.float32),
        "bn.running_mean": np.asarray(mean, dtype=np.float32),
        "bn.running_var": np.asarray(var, dtype=np.float32),
        "bn.num_batches_tracked": np.asarray(3, dtype=np.int64),
        "head.weight": rows_array[:, :-1],
        "head.bias": rows_array[:, -1],
    }


def test_update_sizes_are_each_parts_change_over_its_size_with_rows_matched_by_name():
    received = _state([3.0, 4.0], [0.0, 0.0], [1.0, 1.0], [[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])  # rows: Mass, Edema
    sent = _state([3.0, 4.5], [0.5, 0.0], [1.0, 0.5], [[0.0, 2.5, 0.0], [1.0, 0.0, 0.0]])  # rows: Edema, Mass
    keys = ["conv.weight", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]
    sizes = update_sizes(sent, ["Edema", "Mass"], received, ["Mass", "Edema"], keys, HEAD)
    assert sizes.groups[WEIGHTS] == pytest.approx(0.5 / 5.0)
    assert sizes.groups[STATISTICS] == pytest.approx(math.sqrt(0.5**2 + 0.5**2) / math.sqrt(2.0))
    assert sizes.rows == pytest.approx({"Edema": 0.5 / 2.0, "Mass": 0.0})
    assert sizes.summary() == {WEIGHTS: 0.1, STATISTICS: 0.5, ROWS: 0.25}  # rows: the median over moved rows
    assert sizes.row_turns == {"Edema": pytest.approx(1.0)}  # grown along itself; Mass unmoved: no turn


def test_a_row_trained_back_against_the_received_one_turns_negative_whatever_its_bias_does():
    received = _state([1.0], [0.0], [1.0], [[1.0, 0.0, 0.0], [0.0, 2.0, -1.0]])  # rows: Mass, Edema
    sent = _state([1.0], [0.0], [1.0], [[0.4, 0.3, 5.0], [0.0, 2.0, 3.0]])  # Mass turned back; Edema's bias only
    sizes = update_sizes(sent, ["Mass", "Edema"], received, ["Mass", "Edema"], ["conv.weight"], HEAD, str.lower)
    assert sizes.row_turns == {"mass": pytest.approx(-0.6 / math.sqrt(0.6**2 + 0.3**2))}


def test_rows_a_site_left_alone_are_not_part_of_its_typical_update():
    # FL + partial loss: a site sends the union's rows and leaves the classes it does not label as received
    left_alone = UpdateSizes({WEIGHTS: 0.01}, {"Mass": 0.02, "Edema": 0.0, "Nodule": 0.0, "Hernia": 0.0})
    assert left_alone.typical_row == pytest.approx(0.02)
    reference = UpdateReference()
    reference.record([left_alone, UpdateSizes({WEIGHTS: 0.01}, {"Edema": 0.04, "Mass": 0.0})], [False, False])
    assert reference.typical(ROWS) == pytest.approx(0.03)
    next_round = UpdateSizes({WEIGHTS: 0.01}, {"Mass": 0.03, "Edema": 0.0, "Nodule": 0.0, "Hernia": 0.0})
    assert update_problems(next_round, reference, 10.0, warmup=False) == ([], [])
    nothing_moved = UpdateReference()
    nothing_moved.record([UpdateSizes({}, {"Mass": 0.0})], [False])
    assert nothing_moved.typical(ROWS) is None


def test_a_row_near_zero_is_measured_against_the_floor():
    received = _state([1.0], [0.0], [1.0], [[0.0, 0.0, 0.0]])
    sent = _state([1.0], [0.0], [1.0], [[0.3, 0.0, 0.4]])
    sizes = update_sizes(sent, ["Mass"], received, ["Mass"], ["conv.weight"], HEAD)
    assert sizes.rows == {"Mass": pytest.approx(0.5 / 0.1)}


def test_the_typical_update_is_the_median_of_round_medians_over_the_last_ten_rounds():
    reference = UpdateReference()
    assert reference.typical(WEIGHTS) is None
    for value in range(1, 13):
        reference.record(
            [UpdateSizes({WEIGHTS: float(value)}), UpdateSizes({WEIGHTS: float(value) + 2})], [False, False]
        )
    assert [entry[WEIGHTS] for entry in reference.rounds][-1] == 13.0  # the round's median: mean of two
    assert reference.typical(WEIGHTS) == pytest.approx(np.median([v + 1.0 for v in range(3, 13)]))
    warmup_rows = UpdateReference()
    warmup_rows.record([UpdateSizes({}, {"Mass": 0.4})], [True])  # a warm-up's rows do not make the typical
    assert warmup_rows.rounds == []


def test_a_site_with_more_samples_than_the_typical_one_may_move_further_in_proportion_up_to_a_limit():
    # seed 139 of the clean sweep: 842 training samples beside 71 and 37 moved a shared row 0.359 against a typical
    # 0.03; the plain bound (10 x) refused it, the bound for its sample count (10 x 0.03 x 842 / 71) does not
    reference = UpdateReference()
    reference.record(
        [UpdateSizes({WEIGHTS: 0.01}, {"Pneumonia": 0.03}, samples=s) for s in (71.0, 37.0, 842.0)], [False] * 3
    )
    assert reference.typical(SAMPLES) == 71.0
    assert update_problems(UpdateSizes({}, {"Pneumonia": 0.359}, samples=842.0), reference, 10.0, False) == ([], [])
    refused, details = update_problems(UpdateSizes({}, {"Pneumonia": 0.359}, samples=71.0), reference, 10.0, False)
    assert refused == [
        "its update of the head row of 'Pneumonia' (weights and bias) is 0.359 times their size, more than "
        "update_bound (10) times the typical accepted update of earlier rounds"
    ]
    # the bound grows with the count, not without it: 842 / 71 = 11.9 times, and 12.5 times that is refused
    beyond = 0.03 * 10 * (842 / 71) * 1.05
    told, details = update_problems(UpdateSizes({}, {"Pneumonia": beyond}, samples=842.0), reference, 10.0, False)
    assert told == [
        f"its update of the head row of 'Pneumonia' (weights and bias) is {beyond:.3g} times their size, more than "
        "update_bound (10) times the typical accepted update of earlier rounds for its sample count"
    ]
    assert details == [f"the head row of 'Pneumonia' (weights and bias): {beyond:.4g} > 10 x 0.03 x 11.9 (842 samples "
                       "against 71)"]  # fmt: skip
    # a smaller site keeps the plain bound; a declared size buys at most MAX_SIZE_SCALE
    assert size_scale(10.0, 71.0) == 1.0 and size_scale(None, 71.0) == 1.0 and size_scale(842.0, None) == 1.0
    assert size_scale(1e9, 71.0) == MAX_SIZE_SCALE
    huge = UpdateSizes({WEIGHTS: 0.01 * 10 * MAX_SIZE_SCALE * 1.01}, samples=1e9)
    assert update_problems(huge, reference, 10.0, False)[0]


def test_the_bound_has_a_cap_and_a_history_and_names_only_the_sites_own_figures():
    reference = UpdateReference([{WEIGHTS: 0.01, ROWS: 0.05}])
    fine = UpdateSizes({WEIGHTS: 0.09}, {"Mass": 0.4})
    assert update_problems(fine, reference, 10.0, warmup=False) == ([], [])
    history, details = update_problems(UpdateSizes({WEIGHTS: 0.2}), reference, 10.0, warmup=False)
    assert history == [
        "its update of the backbone weights is 0.2 times their size, more than update_bound (10) times the typical "
        "accepted update of earlier rounds"
    ]
    assert details == ["the backbone weights: 0.2 > 10 x 0.01"]
    capped, _ = update_problems(UpdateSizes({WEIGHTS: 2.0}), UpdateReference(), 10.0, warmup=False)
    assert capped == [
        "its update of the backbone weights is 2 times their size; this federation accepts at most 1 in one round"
    ]
    warm, _ = update_problems(UpdateSizes({}, {"Mass": 3.0}), reference, 10.0, warmup=True)
    assert warm == []  # a warm-up's rows: the cap only (3 < 10)
    assert update_problems(UpdateSizes({WEIGHTS: 1e9}), reference, None, warmup=False) == ([], [])  # bound off


def test_free_riders_are_zero_or_negligible_against_the_rounds_largest_update():
    sizes = {"a": UpdateSizes({WEIGHTS: 0.01}), "b": UpdateSizes({WEIGHTS: 0.0}), "c": UpdateSizes({WEIGHTS: 5e-6})}
    assert free_riders(sizes) == ["b", "c"]
    assert free_riders({"a": UpdateSizes({WEIGHTS: 0.01}), "d": UpdateSizes({WEIGHTS: 2e-5})}) == []


def test_the_candidate_check_leaves_each_result_out_then_tries_each_alone_then_discards():
    def checker(broken: set[str], together: set[str] = frozenset()):
        def problems_of(sites):
            if set(sites) & broken or (together and together <= set(sites)):
                return ["outputs not finite"]
            return []

        return problems_of

    kept, rejected, problems = blame_for_failing_model(["a", "b", "c"], checker({"c"}))
    assert (kept, list(rejected), problems) == (["a", "b"], ["c"], ["outputs not finite"])
    assert rejected["c"].endswith("without it the check passes")
    kept, rejected, _ = blame_for_failing_model(["a", "b", "c", "d"], checker({"c", "d"}))
    assert kept == ["a", "b"] and sorted(rejected) == ["c", "d"]
    assert (
        rejected["c"] == "the global model aggregated from its result alone fails the model check (outputs not finite)"
    )
    # only all three together fail: leaving any one out passes, so no one can be singled out
    kept, rejected, _ = blame_for_failing_model(["a", "b", "c"], checker(set(), together={"a", "b", "c"}))
    assert kept == [] and set(rejected) == {"a", "b", "c"}
    assert rejected["a"] == (
        "the round's global model failed the model check (outputs not finite) and no single result could be blamed: "
        "the round's aggregation was discarded"
    )
    kept, rejected, _ = blame_for_failing_model(["a", "b"], checker({"a", "b"}))  # each breaks it, alone too
    assert kept == [] and set(rejected) == {"a", "b"}
    assert blame_for_failing_model(["a"], checker(set())) == (["a"], {}, [])


def test_the_model_check_reads_values_statistics_and_outputs():
    good = _state([1.0], [0.0], [1.0], [[1.0, 0.0, 0.0]])
    assert model_problems(good, ["Mass"], lambda state, names: np.zeros((2, 1))) == []
    bad_var = {**good, "bn.running_var": np.asarray([-1.0], dtype=np.float32)}
    assert model_problems(bad_var, ["Mass"], None) == [
        "'bn.running_var' has 1 value(s) at or below 0 (a variance is positive)"
    ]
    outputs = lambda state, names: np.asarray([[np.inf], [1.0]])  # noqa: E731
    assert model_problems(good, ["Mass"], outputs) == [
        "the model's outputs on the probe input have 1 non-finite value(s)"
    ]


def test_look_alike_names_share_a_skeleton_and_different_names_do_not():
    assert confusable_skeleton("\u041cass") == confusable_skeleton("Mass")  # Cyrillic capital Em
    assert confusable_skeleton("Ed\u0435ma") == confusable_skeleton("Edema")  # Cyrillic small ie
    assert confusable_skeleton("Mass") != confusable_skeleton("Mask")


def test_metrics_keep_documented_keys_of_the_sites_own_classes():
    valid, problems = check_metrics(
        {"val_loss": 0.3, "val_auroc/Mass": 0.8, "val_auroc/Hernia": 0.7, "val_mean_auroc": 1.5, "extra": 1},
        ["Mass"],
    )
    assert valid == {"val_loss": 0.3, "val_auroc/Mass": 0.8}
    assert problems == [
        "val_mean_auroc = 1.5 is outside [0, 1]",
        "2 undocumented metric key(s) dropped, e.g. ['val_auroc/Hernia', 'extra']",
    ]


def test_a_site_whose_own_training_did_not_lower_its_loss_cannot_veto_the_bar():
    initial = {
        "a": {"val_loss": 0.71, "local_val_loss": 0.06},
        "b": {"val_loss": 0.66, "local_val_loss": 1.52},  # its own model worse than the start: no veto
        "c": {"val_loss": 0.5, "local_val_loss": 0.5},  # no lower: no veto either
        "d": {"val_loss": 0.5},  # sent no own-model loss: judges as before
        "e": {"val_loss": 0.5, "local_val_loss": math.nan},
    }
    losses = {"a": 0.05, "b": 2.3, "c": 0.7, "d": 0.4, "e": 0.45, "x": 0.1}  # x did not validate the initial model
    changes, without_veto = changes_against_the_bar(losses, initial, tie=0.01, vetoes=True)
    assert without_veto == ["b", "c"]
    # each against its own start; b and c count as two ties at most; x has no start: not a judge of the bar
    assert changes == pytest.approx({"a": -0.66, "b": 0.02, "c": 0.02, "d": -0.1, "e": -0.05})
    lower = changes_against_the_bar({**losses, "b": 0.3}, initial, tie=0.01, vetoes=True)[0]  # under its start: vouches
    assert lower["b"] == pytest.approx(-0.36) and lower["c"] == pytest.approx(0.02)
    none_can = changes_against_the_bar({"b": 2.3, "c": 0.7}, initial, tie=0.01, vetoes=True)
    assert none_can == (pytest.approx({"b": 1.64, "c": 0.2}), [])
    # a job from trained heads: every site keeps its veto
    assert changes_against_the_bar(losses, initial, tie=0.01)[0]["b"] == pytest.approx(1.64)
    assert changes_against_the_bar({"x": 0.3}, initial, tie=0.01, vetoes=True) == ({}, [])


def test_a_site_whose_model_ranks_no_worse_than_its_start_and_its_own_weighs_its_recalibrated_change_too():
    """Seed 626 from the stand-in, in numbers: a site of one finding found round 0's model worse than the untrained
    start (0.70 -> 2.03) while it ranked its images better than the start and than the site's own first-round model
    (AUROC 0.33 and 0.87 -> 0.90) and, recalibrated in the large, was better (0.70 -> 0.52). Its recalibrated loss of
    the initial model comes from its validation of round 0's model (0.52 minus its change against the start, -0.18); a
    site whose model ranks worse than its start or its own model, or that sent no such figures, has none."""
    initial = {
        "siim": {"val_loss": 0.70, "val_mean_auroc": 0.33, "local_val_mean_auroc": 0.87},
        "chexpert": {"val_loss": 0.71, "val_mean_auroc": 0.43, "local_val_mean_auroc": 0.43},
        "padchest": {"val_loss": 0.71, "val_mean_auroc": 0.52, "local_val_mean_auroc": 0.70},
        "rsna": {"val_loss": 0.66, "val_mean_auroc": 0.70, "local_val_mean_auroc": 0.60},
        "quiet": {"val_loss": 0.70, "val_mean_auroc": 0.60, "local_val_mean_auroc": 0.60},
        "private": {"val_loss": 0.70, "val_mean_auroc": 0.60},  # sent no own-model AUROC
    }
    start = {"val_recalibrated_loss": 0.06, "val_recalibrated_loss_minus_start": -0.6}  # the start's: 0.66
    first = {
        "siim": {"val_recalibrated_loss": 0.52, "val_recalibrated_loss_minus_start": -0.18},
        "chexpert": {"val_recalibrated_loss": 0.37, "val_recalibrated_loss_minus_start": -0.05},
        "padchest": start,
        "rsna": start,
        "private": start,
    }
    later = {
        "siim": {"val_loss": 1.48, "val_recalibrated_loss": 0.53, "val_mean_auroc": 0.89},
        "chexpert": {"val_loss": 0.46, "val_recalibrated_loss": 0.30, "val_mean_auroc": 0.43},  # ties both: counts
        "padchest": {"val_loss": 0.90, "val_recalibrated_loss": 0.10, "val_mean_auroc": 0.65},  # under its own 0.70
        "rsna": {"val_loss": 0.90, "val_recalibrated_loss": 0.10, "val_mean_auroc": 0.65},  # under its start's 0.70
        "quiet": {"val_loss": 0.90, "val_recalibrated_loss": 0.10, "val_mean_auroc": 0.90},  # no round-0 figures
        "private": {"val_loss": 0.90, "val_recalibrated_loss": 0.10, "val_mean_auroc": 0.90},
    }
    again = recalibrated_changes(later, first, initial)
    assert again == pytest.approx({"siim": 0.53 - 0.70, "chexpert": 0.30 - 0.42})
    assert recalibrated_changes({"siim": {**later["siim"], **first["siim"]}}, first, initial) == (
        pytest.approx({"siim": -0.18})  # round 0's own model: its change against the start, exactly
    )
    losses = {site: figures["val_loss"] for site, figures in later.items()}
    changes, _ = changes_against_the_bar(losses, initial, tie=0.01, recalibrated=again)
    # each the lower of its two changes; the others as they are
    assert changes == pytest.approx(
        {"siim": -0.17, "chexpert": -0.25, "padchest": 0.19, "rsna": 0.24, "quiet": 0.2, "private": 0.2}
    )
    assert changes_against_the_bar(losses, initial, tie=0.01)[0]["siim"] == pytest.approx(0.78)
    # a recalibrated change never raises a change: the lower of the two counts
    assert changes_against_the_bar({"siim": 0.5}, initial, tie=0.01, recalibrated={"siim": 0.3})[0] == (
        pytest.approx({"siim": -0.2})
    )


def test_the_judged_loss_is_the_mean_of_two_and_the_median_of_three_or_more():
    assert judged_loss({"a": 0.2, "b": 0.4}) == (pytest.approx(0.3), "mean")
    assert judged_loss({"a": 0.2, "b": 0.4, "c": 100.0}) == (0.4, "median")
    assert judged_loss({"a": math.nan}) == (pytest.approx(math.nan, nan_ok=True), "none")


def test_the_server_checks_page_lists_every_check_of_the_registry():
    page = DOCS.read_text()
    assert document_checks(page) == page, "run: python -m surgical_aggregation.core.checks docs/server-checks.md"
    checks = registered_checks()
    assert {check.stage for check in checks} == set(STAGES)
    assert len({check.name for check in checks}) == len(checks)


def test_clip_factors_scale_each_part_to_the_median_of_three_or_more_sites_or_the_smaller_of_two():
    sizes = {
        "a": UpdateSizes({WEIGHTS: 0.01, STATISTICS: 0.2}, {"Mass": 0.1, "Edema": 0.3}),
        "b": UpdateSizes({WEIGHTS: 0.02, STATISTICS: 0.2}, {"mass": 0.2, "Edema": 0.0}),  # Edema unmoved
        "c": UpdateSizes({WEIGHTS: 0.08, STATISTICS: 0.1}, {"Mass": 0.4, "Edema": 0.9}),
    }
    factors = clip_factors(sizes, str.title)  # rows matched by canonical name
    # Edema: moved by a and c only, so c is scaled to a's size
    assert factors == {
        "c": {WEIGHTS: pytest.approx(0.25), "head row Mass": pytest.approx(0.5), "head row Edema": pytest.approx(1 / 3)}
    }


def test_capped_weights_give_no_site_more_than_the_others_together():
    assert capped_weights({"a": 10.0, "b": 1e9, "c": 30.0}) == {"a": 10.0, "b": 40.0, "c": 30.0}
    assert capped_weights({"a": 1.0, "b": 1.0}) == {"a": 1.0, "b": 1.0}
    assert capped_weights({"a": 5.0}) == {"a": 5.0}


def test_opposed_updates_reject_a_minority_against_the_rounds_consensus_and_nobody_when_it_is_no_ones():
    honest = np.array([1.0, 1.0, 0.0, 0.0], dtype=np.float32)
    changes = {"a": honest, "b": honest * 2, "c": honest + np.array([0, 0, 1, 0], dtype=np.float32), "x": -3 * honest}
    consensus = np.median(np.stack(list(changes.values())), axis=0)  # (1.5, 1.5, 0, 0)
    assert consensus_cosines(changes, consensus)["x"] == pytest.approx(-1.0)
    assert list(opposed_updates(changes, consensus)) == ["x"]
    # nearly orthogonal honest updates: each has a positive cosine with a consensus it is part of
    orthogonal = {name: np.eye(3, dtype=np.float32)[index] for index, name in enumerate("abc")}
    mean = np.mean(np.stack(list(orthogonal.values())), axis=0)
    assert opposed_updates(orthogonal, mean) == {}
    assert opposed_updates({"a": honest, "x": -honest}, honest) == {}  # two sites: no consensus to oppose
    assert opposed_updates({"a": honest, "b": -honest, "c": -honest}, honest) == {}  # half or more: no one's


def test_persistently_opposed_is_pages_cusum_of_each_judged_sites_cosines():
    """Running opposition after = max(0, before - cosine - 0.25); above 0.5 the update is rejected. Sites not judged
    before (not in ``running``) are left to the first-round check."""
    cosines = {"a": 0.6, "b": -0.2, "c": -0.6, "d": -0.9, "new": -1.0}
    after, refused = persistently_opposed(cosines, {"a": 0.3, "b": 0.5, "c": 0.1, "d": 0.0})
    assert after == {"a": 0.0, "b": pytest.approx(0.45), "c": pytest.approx(0.45), "d": pytest.approx(0.65)}
    assert list(refused) == ["d"]
    assert refused["d"] == (
        "its updates of the backbone weights keep pointing against the rounds' consensus (running opposition 0.65 "
        "above 0.5; cosine -0.90 with the robust aggregate this round)"
    )
    assert persistently_opposed({"a": -0.75}, {"a": 0.0}) == ({"a": 0.5}, {})  # at the limit, not above it
    assert "(running opposition 0.5001 above 0.5;" in persistently_opposed({"a": -0.7501}, {"a": 0.0})[1]["a"]
    after, refused = persistently_opposed({"a": -1.0}, {"a": 1.2})  # at most one flipped round past the limit
    assert after == {"a": 1.25} and list(refused) == ["a"]
    # a round whose consensus is no one's: nothing measured or changed, and a site still above the limit stays out
    after, refused = persistently_opposed({"a": 0.9, "b": -0.9, "c": -0.9}, {"a": 0.3, "b": 0.8, "c": 0.2}, False)
    assert after == {} and list(refused) == ["b"]
    assert refused["b"] == (
        "its running opposition to the rounds' consensus, 0.80, is still above 0.5 (this round's consensus is no "
        "one's: not measured)"
    )


def test_the_running_opposition_bounds_what_any_run_of_accepted_rounds_adds_up_to():
    """The page's bound, against sequences an attacker might send (random, alternating, just past the reference): over
    any run of consecutive rounds in which the site is accepted, its opposition (-cosine) adds up to at most 0.5 +
    0.25 a round."""
    generator = np.random.default_rng(0)
    sequences = [generator.uniform(-1, 1, 200), generator.uniform(-1, 0.2, 200), np.tile([-1.0, 0.6], 100),
                 np.full(200, -0.26), np.tile([-0.74, -0.1, 0.9], 67)]  # fmt: skip
    for cosines in sequences:
        running, accepted = {"x": 0.0}, []
        for cosine in cosines:
            after, refused = persistently_opposed({"x": float(cosine)}, running)
            running = after
            accepted.append("x" not in refused)
        for start in range(len(cosines)):
            for end in range(start, len(cosines)):
                if not accepted[end]:
                    break
                assert -cosines[start : end + 1].sum() <= 0.5 + 0.25 * (end - start + 1) + 1e-9


def test_a_site_whose_own_training_learned_no_ranking_counts_constant_outputs_as_no_worse():
    """A limit of stop 104's bar (docs/server-checks.md): a site whose start and own first-round model ranked its images
    no better than chance (AUROC 0.40 and 0.45) finds a model of constant outputs (AUROC 0.5, recalibrated the base
    rate's loss, 0.56, below the start's random scores' 0.75) no worse once recalibrated; a site whose own model
    learned to rank (0.8) does not."""
    initial = {
        "blind": {"val_loss": 0.75, "val_mean_auroc": 0.40, "local_val_mean_auroc": 0.45},
        "seeing": {"val_loss": 0.75, "val_mean_auroc": 0.40, "local_val_mean_auroc": 0.80},
    }
    first = {key: {"val_recalibrated_loss": 0.56, "val_recalibrated_loss_minus_start": -0.19} for key in initial}
    constant = {key: {"val_loss": 0.9, "val_recalibrated_loss": 0.56, "val_mean_auroc": 0.5} for key in initial}
    assert recalibrated_changes(constant, first, initial) == {"blind": pytest.approx(-0.19)}


def test_a_judge_that_did_not_judge_the_best_counts_as_no_improvement():
    """A review's attack on the paired choice of the best (stop 104): round 0's model is the best, judged by a, b and
    a liar x; round 1's is judged by x, which reports 0, and two sites that did not judge the best (c, d). Paired over
    the judges of both, the liar alone would have decided (-0.55); each judge without a loss of the best counts as a
    change of 0, and the median is 0: round 0's model stays the best. Where no judge judged the best, the losses as
    they are decide."""
    from surgical_aggregation.flare.state import INITIAL_ROUND, FederationState, SavedVersion, judge

    federation = FederationState({}, SavedVersion(INITIAL_ROUND, {}, []), None, math.inf, 0, [], [], {}, [])
    judge(federation, SavedVersion(0, {}, [], trained=True), {"a": {"val_loss": 0.5}, "b": {"val_loss": 0.6},
          "x": {"val_loss": 0.55}}, None, 1e-4)  # fmt: skip
    assert federation.best.round == 0
    later = {"x": {"val_loss": 0.0}, "c": {"val_loss": 2.0}, "d": {"val_loss": 2.5}}
    assert not judge(federation, SavedVersion(1, {}, [], trained=True), later, None, 1e-4).best
    record = federation.history[-1]["validation"]["against_best"]
    assert record == {"round": 0, "judged_change": 0.0, "changes": {"c": 0.0, "d": 0.0, "x": -0.55},
                      "not_judges_of_the_best": ["c", "d"]}  # fmt: skip
    assert federation.best.round == 0 and federation.rounds_without_improvement == 1
    strangers = {"c": {"val_loss": 0.1}, "d": {"val_loss": 0.2}, "e": {"val_loss": 0.3}}  # none judged the best
    assert judge(federation, SavedVersion(2, {}, [], trained=True), strangers, None, 1e-4).best
    assert "against_best" not in federation.history[-1]["validation"]  # 0.2 < 0.55: on the losses as they are


def test_a_rounds_means_over_sites_do_not_depend_on_the_order_their_results_arrived_in():
    """Four sites' figures whose float sum depends on its order: the round's record is the same either way."""
    from surgical_aggregation.flare.state import INITIAL_ROUND, FederationState, SavedVersion, judge

    figures = {"site-a": 0.1, "site-b": 0.2, "site-c": 0.3, "site-d": 1e-17}
    assert sum(figures.values()) != sum(reversed(list(figures.values())))  # the order matters to a float sum
    records = []
    for order in (list(figures), list(reversed(figures))):
        federation = FederationState({}, SavedVersion(INITIAL_ROUND, {}, []), None, math.inf, 0, [], [], {}, [])
        metrics = {site: {"val_loss": figures[site], "val_mean_auroc": 0.5 + figures[site]} for site in order}
        judge(federation, SavedVersion(0, {}, [], trained=True), metrics, None, 1e-4)
        records.append(json.dumps(federation.history, allow_nan=True))
    assert records[0] == records[1]
