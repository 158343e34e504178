"""The server's statistical rules (core.judging): the harm test on a site's paired figures, Holm's procedure over the
sites of a round, the round's share of the job's false-alarm rate, and what a flag makes the server do."""

import math

import pytest
from scipy.stats import norm

from surgical_aggregation.core import judging
from surgical_aggregation.core.judging import (
    OUTVOTED,
    SEVERAL,
    TWO_SITES,
    Harm,
    Screen,
    decide,
    flagged,
    harm_of,
    holm,
    round_level,
    standard_error_floor,
)

# a site's figures of a candidate: H = 0.1281 (SE 0.0066) above its own model, D = -0.024 (SE 0.0037) against the
# model the round started from, loss 0.6168: its own training gained G = H - D = 0.1521, its own model's loss 0.4887
FIGURES = {
    "val_loss": 0.6168,
    "val_loss_minus_own": 0.1281,
    "val_loss_minus_own_se": 0.0066,
    "val_loss_minus_start": -0.024,
    "val_loss_minus_start_se": 0.0037,
}


def test_the_harm_test_allows_a_share_of_the_sites_own_gain_and_of_its_loss():
    m, c = judging.HARM_GAIN_SHARE, judging.HARM_LOSS_SHARE
    harm = harm_of(FIGURES)
    margin = m * 0.1521 + c * 0.4887
    error = (1 - m) * 0.0066 + m * 0.0037
    assert harm.gain == pytest.approx(0.1521, abs=1e-12) and harm.margin == pytest.approx(margin, abs=1e-12)
    assert harm.error == pytest.approx(error, abs=1e-12)
    assert harm.z == pytest.approx((0.1281 - margin) / error, abs=1e-9)
    assert harm.p == pytest.approx(norm.sf(harm.z), rel=1e-9)


def test_without_a_gain_of_its_own_only_the_share_of_its_loss_is_allowed():
    figures = {**FIGURES, "val_loss_minus_start": 0.2}  # its own training lost: G = -0.0719
    harm = harm_of(figures)
    assert harm.margin == pytest.approx(judging.HARM_LOSS_SHARE * 0.4887, abs=1e-12)
    assert harm.error == pytest.approx(0.0066, abs=1e-12)


def test_a_reported_standard_error_below_what_the_validation_size_allows_is_floored():
    assert standard_error_floor(400) == pytest.approx(judging.SE_FLOOR_SD / 20)
    assert standard_error_floor(None) == 0.0
    precise = {**FIGURES, "val_loss_minus_own_se": 0.0, "val_loss_minus_start_se": 0.0}
    assert harm_of(precise, validation_size=400).error == pytest.approx(judging.SE_FLOOR_SD / 20)
    assert harm_of({"val_loss": 0.5}) is None  # no paired figures: not tested


def test_holm_steps_down_over_the_sites_of_a_round():
    assert holm({"a": 0.001, "b": 0.02, "c": 0.04}, 0.05) == ["a", "b", "c"]  # 0.05/3, 0.05/2, 0.05/1
    assert holm({"a": 0.001, "b": 0.03, "c": 0.04}, 0.05) == ["a"]  # b: 0.03 > 0.025 stops the procedure
    assert holm({}, 0.05) == []
    assert round_level(5) == pytest.approx(judging.FALSE_ALARM_RATE / 5)


def test_flagged_sites_are_those_holm_rejects():
    far = {**FIGURES, "val_loss_minus_own": 0.5}
    near = {**FIGURES, "val_loss_minus_own": 0.05}
    assert list(flagged({"a": far, "b": near, "c": {"val_loss": 0.3}}, {}, 0.01)) == ["a"]


def _harm(z: float = 10.0) -> Harm:
    return Harm(0.2, 0.1, 0.05, 0.01, z, float(norm.sf(z)))


def screens(table: dict[frozenset, list[str]]):
    """A ``without`` callback from {left out: the sites flagged on that candidate}."""
    return lambda left_out: Screen({site: _harm() for site in table[left_out]}, 0.5) if left_out in table else None


def test_no_flag_accepts_and_two_sites_cannot_decide():
    assert decide(["a", "b", "c"], Screen({}), screens({}), 1).action == "accept"
    stop = decide(["a", "b"], Screen({"a": _harm()}), screens({}), 0)
    assert (stop.action, stop.why, list(stop.flags)) == ("stop", TWO_SITES, ["a"])


def test_the_contribution_whose_leave_one_out_clears_the_harm_is_excluded():
    table = {frozenset({"x"}): [], frozenset({"b"}): ["a"], frozenset({"a"}): ["b"]}
    decision = decide(["a", "b", "x"], Screen({"a": _harm()}), screens(table), 1)
    assert (decision.action, decision.excluded, decision.flags) == ("exclude", ["x"], {})


def test_a_flag_only_the_flagged_sites_own_exclusion_clears_is_kept_on_record():
    # "a" is harmed by everyone's contributions together (its data disagree, or it lies): leaving out b or x does not
    # clear it, and leaving a itself out clears nothing of anyone else's
    table = {frozenset({"x"}): ["a"], frozenset({"b"}): ["a"], frozenset({"a"}): []}
    decision = decide(["a", "b", "x"], Screen({"a": _harm()}), screens(table), 1)
    assert (decision.action, decision.excluded, list(decision.flags), decision.why) == ("accept", [], ["a"], OUTVOTED)


def test_several_harmed_sites_no_exclusion_clears_stop_the_job():
    table = {
        frozenset({"x"}): ["a", "b"],
        frozenset({"b"}): ["a"],
        frozenset({"a"}): ["b"],
        frozenset({"c"}): ["a", "b"],
    }
    decision = decide(["a", "b", "c", "x"], Screen({"a": _harm(), "b": _harm()}), screens(table), 1)
    assert (decision.action, decision.why, sorted(decision.flags)) == ("stop", SEVERAL, ["a", "b"])


def test_an_exclusion_that_harms_another_site_is_not_taken():
    table = {frozenset({"x"}): ["c"], frozenset({"b"}): ["a"], frozenset({"a"}): ["b"], frozenset({"c"}): ["a"]}
    decision = decide(["a", "b", "c", "x"], Screen({"a": _harm()}), screens(table), 1)
    assert (decision.action, decision.excluded) == ("accept", [])


def test_two_hostile_contributions_are_left_out_one_at_a_time_up_to_the_tolerated_number():
    sites = ["a", "b", "c", "x", "y"]
    table = {
        frozenset({"x"}): ["a"],  # clears b's harm, a's stays
        frozenset({"y"}): ["a", "b"],
        **{frozenset({site}): ["a", "b"] for site in "abc"},
        frozenset({"x", "y"}): [],
        **{frozenset({"x", site}): ["a"] for site in "abc"},
    }
    decision = decide(sites, Screen({"a": _harm(), "b": _harm()}), screens(table), 2)
    assert (decision.action, decision.excluded) == ("exclude", ["x", "y"])
    assert decide(sites, Screen({"a": _harm(), "b": _harm()}), screens(table), 1).excluded == ["x"]


def test_among_exclusions_that_clear_the_harm_the_lowest_judged_loss_wins():
    def without(left_out):
        return Screen({}, {frozenset({"x"}): 0.4, frozenset({"b"}): 0.3}.get(left_out, math.nan))

    decision = decide(["a", "b", "x"], Screen({"a": _harm()}), without, 1)
    assert decision.excluded == ["b"]


def test_two_flags_of_rejected_sites_stop_the_job_one_does_not():
    objections = {"r": _harm(), "s": _harm()}
    assert decide(["a", "b", "c"], Screen({}), screens({}), 1, objections).why == judging.MAJORITY
    assert decide(["a", "b", "c"], Screen({}), screens({}), 1, {"r": _harm()}).action == "accept"
