"""The server's statistical rules (core.judging): the harm test on a site's paired figures, Holm's procedure over the
sites of a round, the round's share of the job's false-alarm rate, and what a flag makes the server do."""

import numpy as np
import pytest
from scipy.stats import norm

from surgical_aggregation.core import judging
from surgical_aggregation.core.judging import (
    MAJORITY,
    NOT_MOST,
    SEVERAL,
    TWO_SITES,
    Harm,
    auroc_harm_of,
    decide,
    flagged,
    harm_of,
    holm,
    improvement_of,
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
    # far: 0.5 above its own model and 0.45 above the round's start (its own training gained 0.05)
    far = {**FIGURES, "val_loss_minus_own": 0.5, "val_loss_minus_start": 0.45}
    near = {**FIGURES, "val_loss_minus_own": 0.05, "val_loss_minus_start": 0.0}
    assert list(flagged({"a": far, "b": near, "c": {"val_loss": 0.3}}, {}, 0.01)) == ["a"]


def _harm(z: float = 10.0) -> Harm:
    return Harm(0.2, 0.1, 0.05, 0.01, z, float(norm.sf(z)))


def verdicts(table: dict[str, dict[str, str]]):
    """A ``verdicts_without`` callback from {contribution: {other judge: "better" / "worse" / "neither"}}."""
    return lambda site: table.get(site)


SITES = ["a", "b", "c", "x"]
B, W, N = judging.BETTER, judging.WORSE, judging.NEITHER


def test_no_flag_accepts_and_two_sites_cannot_decide():
    assert decide(SITES, {}, verdicts({}), None).action == "accept"
    stop = decide(["a", "b"], {"a": _harm()}, verdicts({}), None)
    assert (stop.action, stop.why, list(stop.flags)) == ("stop", TWO_SITES, ["a"])


def test_a_contribution_more_than_half_of_the_other_sites_are_better_without_is_left_out():
    table = {
        "x": {"a": B, "b": B, "c": N},  # two of three: more than half
        "c": {"a": N, "b": N, "x": N},
        "a": {"b": N, "c": N, "x": N},
        "b": {"a": N, "c": N, "x": N},
    }
    decision = decide(SITES, {"a": _harm()}, verdicts(table), None)
    assert (decision.action, decision.excluded, list(decision.flags)) == ("exclude", ["x"], ["a"])
    table["x"]["b"] = N  # one of three: a third is not enough
    decision = decide(SITES, {"a": _harm()}, verdicts(table), None)
    assert (decision.action, decision.excluded, decision.why) == ("accept", [], NOT_MOST)
    # at three sites both other judges must be better off: one judge's data conflict, or one liar, removes no one
    three = {"x": {"a": B, "b": N}, "a": {"b": N, "x": N}, "b": {"a": N, "x": N}}
    assert decide(["a", "b", "x"], {}, verdicts(three), None).action == "accept"
    three["x"]["b"] = B
    assert decide(["a", "b", "x"], {}, verdicts(three), None).excluded == ["x"]


def test_a_contribution_another_site_needs_stays():
    three = {"x": {"a": B, "b": W}, "a": {"b": N, "x": N}, "b": {"a": N, "x": N}}
    assert decide(["a", "b", "x"], {}, verdicts(three), None).action == "accept"
    # at seven sites three of the six others (half) remove no one; four do
    seven = [*"abcdefx"]
    table = {site: {other: N for other in seven if other != site} for site in seven}
    table["x"].update(a=B, b=B, c=B)
    decision = decide(seven, {"a": _harm()}, verdicts(table), None)
    assert (decision.action, decision.excluded, decision.why) == ("accept", [], NOT_MOST)
    table["x"]["d"] = B
    assert decide(seven, {"a": _harm()}, verdicts(table), None).excluded == ["x"]


def test_the_largest_net_share_of_better_off_sites_decides_which_is_left_out():
    table = {"x": {"a": B, "b": B, "c": B}, "c": {"a": B, "b": B, "x": N}}
    assert decide(SITES, {"a": _harm()}, verdicts(table), None).excluded == ["x"]


def test_a_verdict_is_better_worse_or_neither_at_the_level():
    base = {"val_loss": 0.4, "val_loss_minus_reference_se": 0.01}
    # the round's candidate: 0.5 (and 0.3 when worse); the margin is IMPROVEMENT_SHARE of it
    assert judging.verdict_of({**base, "val_loss_minus_reference": -0.1}, None, 0.01) == B
    assert judging.verdict_of({**base, "val_loss": 0.4, "val_loss_minus_reference": 0.1}, None, 0.01) == W
    assert judging.verdict_of({**base, "val_loss_minus_reference": -0.001}, None, 0.01) == N
    assert judging.verdict_of({"val_loss": 0.4}, None, 0.01) == N  # no figure: no verdict


def test_several_harmed_sites_that_no_exclusion_explains_stop_the_job():
    table = {site: {other: False for other in SITES if other != site} for site in SITES}
    decision = decide(SITES, {"a": _harm(), "b": _harm()}, verdicts(table), None)
    assert (decision.action, decision.why, sorted(decision.flags)) == ("stop", SEVERAL, ["a", "b"])


def test_two_flags_of_rejected_sites_stop_the_job_one_does_not():
    objections = {"r": _harm(), "s": _harm()}
    assert decide(SITES, {}, verdicts({}), objections).why == MAJORITY
    assert decide(SITES, {}, verdicts({}), {"r": _harm()}).action == "accept"


def test_improvements_are_tested_on_the_loss_and_on_the_mean_auroc():
    figures = {
        "val_loss": 0.4,
        "val_loss_minus_reference": -0.1,  # the round's candidate: 0.5; 2 % of it is 0.01
        "val_loss_minus_reference_se": 0.01,
        "val_auroc_minus_reference": 0.05,
        "val_auroc_minus_reference_se": 0.01,
    }
    loss, auroc = improvement_of(figures)
    assert (loss.kind, auroc.kind) == ("loss", "AUROC")
    assert loss.z == pytest.approx((0.1 - judging.IMPROVEMENT_SHARE * 0.5) / 0.01)
    assert auroc.z == pytest.approx((0.05 - judging.AUROC_IMPROVEMENT) / 0.01)
    assert improvement_of({"val_loss": 0.4}) == []


def test_a_ranking_harm_is_a_harm_too():
    figures = {"val_auroc_minus_own": -0.2, "val_auroc_minus_own_se": 0.02, "val_loss": 0.3}
    harm = auroc_harm_of(figures)
    assert harm.kind == "AUROC" and harm.z == pytest.approx((0.2 - judging.AUROC_HARM) / 0.02)
    assert list(flagged({"a": figures, "b": {"val_loss": 0.3}}, {}, 0.01)) == ["a"]
    floored = auroc_harm_of({**figures, "val_auroc_minus_own_se": 0.0}, validation_size=100)
    assert floored.error == pytest.approx(judging.AUROC_SE_FLOOR_SD / 10)


def test_a_ranking_harm_allows_what_the_sites_own_training_gained_as_the_loss_does():
    # own model 0.80, start 0.55 (gain 0.25), candidate 0.52: 0.28 below its own, 0.03 below the start
    figures = {
        "val_auroc_minus_own": -0.28,
        "val_auroc_minus_own_se": 0.02,
        "val_auroc_minus_start": -0.03,
        "val_auroc_minus_start_se": 0.01,
    }
    harm = auroc_harm_of(figures)
    assert harm.gain == pytest.approx(0.25)
    assert harm.margin == pytest.approx(0.25 + judging.AUROC_HARM)
    assert harm.z == pytest.approx((0.03 - judging.AUROC_HARM) / 0.01)  # the start's difference, its error
    worse_than_start = auroc_harm_of({**figures, "val_auroc_minus_own": -0.40, "val_auroc_minus_start": -0.15})
    assert worse_than_start.z == pytest.approx((0.15 - judging.AUROC_HARM) / 0.01) and worse_than_start.p < 1e-10
    # own training that lost ranking (gain -0.05) is no licence: the margin is AUROC_HARM alone, on its own model
    lost = auroc_harm_of({**figures, "val_auroc_minus_own": -0.2, "val_auroc_minus_start": -0.25})
    assert (lost.gain, lost.margin) == (pytest.approx(-0.05), judging.AUROC_HARM)
    assert lost.z == pytest.approx((0.2 - judging.AUROC_HARM) / 0.02)


def test_a_round_from_untrained_heads_is_made_again_only_when_a_site_flags_it():
    everyone_better = {"x": {other: B for other in SITES if other != "x"}}  # the three others
    assert decide(SITES, {}, verdicts(everyone_better), None, untrained_start=True).action == "accept"
    assert decide(SITES, {}, verdicts(everyone_better), None).action == "exclude"
    flagged_start = decide(SITES, {"b": _harm()}, verdicts(everyone_better), None, untrained_start=True)
    assert flagged_start.action == "exclude"
    two = decide(["a", "b"], {"a": _harm()}, verdicts({}), None, untrained_start=True)
    assert (two.action, two.why) == ("stop", TWO_SITES)


def test_several_flagged_sites_each_better_off_without_one_contribution_have_it_left_out():
    # seven sites: x poisons rows only a and b hold; they flag the model and are better off without x, the other
    # four judges neither: not a majority, but x explains both flags
    seven = [*"abcdefx"]
    table = {site: {other: N for other in seven if other != site} for site in seven}
    table["x"].update(a=B, b=B)
    decision = decide(seven, {"a": _harm(), "b": _harm()}, verdicts(table), None)
    assert (decision.action, decision.excluded) == ("exclude", ["x"])
    # one flag is no such evidence: kept on record
    assert decide(seven, {"a": _harm()}, verdicts(table), None).excluded == []
    # a flagged site that is not better off without x: x does not explain it, the job stops
    table["x"]["b"] = N
    assert decide(seven, {"a": _harm(), "b": _harm()}, verdicts(table), None).why == SEVERAL
    # nor when as many judges are worse off without x as better
    table["x"].update(b=B, c=W, d=W)
    assert decide(seven, {"a": _harm(), "b": _harm()}, verdicts(table), None).why == SEVERAL


def test_a_round_from_untrained_heads_is_judged_by_the_loss_alone():
    ranked_worse = {
        "val_auroc_minus_own": -0.4,
        "val_auroc_minus_own_se": 0.01,
        "val_auroc_minus_start": -0.3,
        "val_auroc_minus_start_se": 0.01,
    }
    assert list(flagged({"a": ranked_worse}, {}, 0.01)) == ["a"]
    assert flagged({"a": ranked_worse}, {}, 0.01, ranking=False) == {}
    better_ranked = {"val_loss": 0.4, "val_auroc_minus_reference": 0.3, "val_auroc_minus_reference_se": 0.01}
    assert judging.verdict_of(better_ranked, None, 0.01) == B
    assert judging.verdict_of(better_ranked, None, 0.01, ranking=False) == N


# the same site's figures once each model is recalibrated in the large to its images: the candidate 0.01 above its own
# model (SE 0.004), 0.02 below the round's start (SE 0.003), its recalibrated loss 0.45
RECALIBRATED = {
    "val_recalibrated_loss": 0.45,
    "val_recalibrated_loss_minus_own": 0.01,
    "val_recalibrated_loss_minus_own_se": 0.004,
    "val_recalibrated_loss_minus_start": -0.02,
    "val_recalibrated_loss_minus_start_se": 0.003,
}


def test_a_harm_that_recalibration_in_the_large_undoes_flags_no_one():
    base_rate = {**FIGURES, "val_loss_minus_own": 1.6, "val_loss_minus_start": 1.4, **RECALIBRATED}
    raw = harm_of({key: value for key, value in base_rate.items() if "recalibrated" not in key})
    harm = harm_of(base_rate)
    # by hand: gain 0.03, the site's own recalibrated loss 0.44, the margin 0.03 + c * 0.44, the start's error
    margin = 0.03 + judging.HARM_LOSS_SHARE * 0.44
    assert harm.recalibrated.margin == pytest.approx(margin, abs=1e-12)
    assert harm.recalibrated.z == pytest.approx((0.01 - margin) / 0.003, abs=1e-9)
    assert raw.p < 1e-10 and harm.p == pytest.approx(harm.recalibrated.p) and harm.p > 0.5
    assert (harm.difference, harm.margin) == (raw.difference, raw.margin)  # the figures as they are stay on record
    assert flagged({"a": base_rate}, {}, 0.01) == {}
    ranked_worse = {"val_recalibrated_loss_minus_own": 0.5, "val_recalibrated_loss_minus_start": 0.48}
    assert list(flagged({"a": {**base_rate, **ranked_worse}}, {}, 0.01)) == ["a"]


def test_the_harm_test_flags_only_what_the_test_on_the_losses_as_they_are_flags():
    """An intersection-union test: with the recalibrated figures the p-value is never below the one without them, so
    no clean run that the loss test did not stop is stopped by it, whatever the recalibrated figures say."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        figures = {**FIGURES, "val_loss_minus_own": rng.normal(0.1, 0.3), "val_loss_minus_start": rng.normal(0, 0.3)}
        figures |= {key: abs(rng.normal(value, 0.3)) for key, value in RECALIBRATED.items()}
        for key in ("val_recalibrated_loss_minus_own", "val_recalibrated_loss_minus_start"):
            figures[key] = rng.normal(0.0, 0.5)
        both, alone = harm_of(figures), harm_of({k: v for k, v in figures.items() if "recalibrated" not in k})
        assert both.p == max(alone.p, both.recalibrated.p) and both.p >= alone.p
    both_reason = harm_of({**FIGURES, "val_loss_minus_own": 1.6, **RECALIBRATED}).reason()
    assert "above once each model is recalibrated to its images" in both_reason


def test_a_site_whose_candidate_only_moves_a_findings_base_rate_is_not_harmed_and_a_reversed_one_is():
    """From the site's own scores: a candidate whose logits are its own model's shifted down by 6 (the base rate of a
    finding averaged with a site where it is rare) costs the loss as it is far more than the margin, and nothing once
    recalibrated; a candidate that ranks the images the other way is harmed both ways."""
    from surgical_aggregation.flare.client import paired_figures
    from surgical_aggregation.training.loops import Evaluation

    rng = np.random.default_rng(5)
    labels = (rng.random((300, 1)) < 0.22).astype(float)
    own_logits = 2.0 * labels - 1.5 + rng.normal(0.0, 1.0, labels.shape)
    start_logits = rng.normal(-1.2, 0.3, labels.shape)

    def evaluated(logits: np.ndarray) -> Evaluation:
        return Evaluation.of(labels, 1.0 / (1.0 + np.exp(-logits)), ["Pneumothorax"], None)

    own, start = evaluated(own_logits), evaluated(start_logits)

    def figures_of(candidate: Evaluation) -> dict[str, float]:
        paired = paired_figures(candidate, own, "own", recalibrated=True)
        paired |= paired_figures(candidate, start, "start", recalibrated=True)
        return paired | {"val_loss": candidate.loss, "val_recalibrated_loss": candidate.recalibrated_loss()}

    shifted, reversed_ = figures_of(evaluated(own_logits - 6.0)), figures_of(evaluated(-own_logits))
    alone = {key: value for key, value in shifted.items() if "recalibrated" not in key}
    assert shifted["val_loss_minus_own"] > 0.8 and abs(shifted["val_recalibrated_loss_minus_own"]) < 1e-9
    assert list(flagged({"site": alone}, {"site": 300}, 0.01)) == ["site"]
    assert flagged({"site": shifted}, {"site": 300}, 0.01) == {}
    assert list(flagged({"site": reversed_}, {"site": 300}, 0.01)) == ["site"]


def test_a_verdict_of_better_off_judges_the_losses_as_they_are_whatever_the_recalibrated_figures_say():
    """A leave-one-out candidate better by a base rate alone (its recalibrated loss no lower) is better: an attack
    that keeps the honest sites' intercepts from learning their prevalences shows in the losses as they are only
    (test_exclusion_e2e's three sites)."""
    base_rate_only = {
        "val_loss": 0.4,
        "val_loss_minus_reference": -0.1,
        "val_loss_minus_reference_se": 0.01,
        judging.RECALIBRATED_REFERENCE: 0.0,
        f"{judging.RECALIBRATED_REFERENCE}_se": 0.01,
    }
    assert judging.verdict_of(base_rate_only, None, 0.01, ranking=False) == B
    assert improvement_of(base_rate_only) == improvement_of(
        {"val_loss": 0.4, "val_loss_minus_reference": -0.1, "val_loss_minus_reference_se": 0.01}
    )
    assert judging.recalibrated_improvement_of(base_rate_only) is None  # without the recalibrated loss: no test
    # on record: the same test on the recalibrated losses, by hand (the round's candidate recalibrated: 0.3)
    again = judging.recalibrated_improvement_of({**base_rate_only, "val_recalibrated_loss": 0.3})
    assert (again.difference, again.margin) == (0.0, pytest.approx(judging.IMPROVEMENT_SHARE * 0.3))
    assert again.z == pytest.approx(-judging.IMPROVEMENT_SHARE * 0.3 / 0.01) and again.p > 0.99
