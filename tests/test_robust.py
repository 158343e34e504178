"""The robust aggregation rules (core.robust), each on a worked example computed by hand, and applied part by part to
a model's state (the backbone weights, the BatchNorm statistics, each head row by name)."""

import math

import numpy as np
import pytest

from surgical_aggregation.core.checks.update import STATISTICS, UpdateSizes
from surgical_aggregation.core.head import NAMED_HEAD
from surgical_aggregation.core.robust import (
    AGGREGATORS,
    DUPLICATE_DISTANCE,
    RobustRule,
    SharedRows,
    SiteResult,
    centered_clipping,
    closest_distance,
    distinct_rows,
    duplicate_groups,
    geometric_median,
    mda,
    meamed,
    median,
    multi_krum,
    nearest_neighbour_mixing,
    opposed_at_warmup,
    peeled_opposed_at_warmup,
    robust_state,
    shared_row_agreement,
    shared_rows_against_consensus,
    trimmed_mean,
    two_site_agreement,
    two_sites_apart,
)

FIVE = np.array([[1.0], [2.0], [6.0], [7.0], [100.0]])
FOUR = np.array([[0.0], [1.0], [2.0], [10.0]])


def test_coordinate_rules_on_five_values_one_of_them_hostile():
    assert median(FIVE) == pytest.approx([6.0])
    assert trimmed_mean(FIVE, 1) == pytest.approx([5.0])  # (2 + 6 + 7) / 3
    assert trimmed_mean(FIVE, 2) == pytest.approx([6.0])
    assert meamed(FIVE, 1) == pytest.approx([4.0])  # the 4 closest to 6: 6, 7, 2, 1
    assert median(np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [100.0, -50.0]])) == pytest.approx([2.5, 15.0])


def test_distance_rules_on_four_values_one_of_them_hostile():
    # squared distances from 0, 1, 2, 10; Krum's score: the 2 nearest others -> 5, 2, 5, 145; keep the 3 smallest
    assert multi_krum(FOUR, 1) == pytest.approx([1.0])
    assert mda(FOUR, 1) == pytest.approx([1.0])  # {0, 1, 2}: diameter 2, the others' at least 9
    mixed = nearest_neighbour_mixing(FOUR, 1)  # each: the mean of its 3 nearest, itself included
    assert mixed[:, 0] == pytest.approx([1.0, 1.0, 1.0, 13.0 / 3.0])


def test_the_geometric_median_is_where_the_unit_vectors_to_the_points_cancel():
    points = np.array([[0.0, 0.0], [4.0, 0.0], [1.0, 3.0], [50.0, 50.0]])
    centre = geometric_median(points)
    pulls = (points - centre) / np.linalg.norm(points - centre, axis=1, keepdims=True)
    assert np.linalg.norm(pulls.sum(axis=0)) < 1e-4
    assert np.linalg.norm(centre) < 5  # the far point does not drag it
    symmetric = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0], [0.0, 0.0]])
    assert geometric_median(symmetric) == pytest.approx([0.0, 0.0], abs=1e-9)


def test_centered_clipping_is_the_fixed_point_of_pulls_clipped_to_the_median_distance():
    # 0, 0, 2, 3, 20: median 2, distances to it 2, 2, 0, 1, 18 -> tau 2. At v in [1, 2] the pulls are -v, -v, 2 - v,
    # 3 - v and +2 (20 clipped): 7 - 4v = 0, v = 1.75 (the mean is 5, the median and the geometric median 2)
    assert centered_clipping(np.array([[0.0], [0.0], [2.0], [3.0], [20.0]])) == pytest.approx([1.75], abs=1e-5)
    points = np.array([[0.0, 0.0], [4.0, 0.0], [1.0, 3.0], [50.0, 50.0]])
    centre = centered_clipping(points)
    tau = float(np.median(np.linalg.norm(points - np.median(points, axis=0), axis=1)))
    pulls = points - centre
    clipped = pulls * np.minimum(1.0, tau / np.linalg.norm(pulls, axis=1, keepdims=True))
    assert np.linalg.norm(clipped.sum(axis=0)) < 1e-4
    farther = points.copy()  # a far row only pulls by tau: moved ten times as far along its ray, it changes nothing
    farther[3] = centre + 10 * (points[3] - centre)
    assert centered_clipping(farther) == pytest.approx(centre, abs=1e-4)
    square = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0], [0.0, 0.0]])
    assert centered_clipping(square) == pytest.approx([0.0, 0.0], abs=1e-9)


def test_centered_clipping_gives_a_near_copy_less_than_the_geometric_median_does():
    """Four sites, one sending a copy of another's update 0.2 % away (mimic_noised): the geometric median follows the
    copied update; centered clipping weighs the pair about as the mean does."""
    rng = np.random.default_rng(0)
    common = rng.normal(size=2000)
    honest = np.stack([common + rng.normal(size=2000) for _ in range(3)])
    copy = honest[0] + 0.002 * np.linalg.norm(honest[0]) * rng.normal(size=2000) / math.sqrt(2000)
    rows = np.vstack([honest, copy])

    def weight_of_the_copied(point: np.ndarray) -> float:
        shares, *_ = np.linalg.lstsq(honest.T, point, rcond=None)
        return float(shares[0])

    assert weight_of_the_copied(geometric_median(rows)) > 0.9
    assert weight_of_the_copied(rows.mean(axis=0)) == pytest.approx(0.5, abs=0.01)
    assert weight_of_the_copied(centered_clipping(rows, 1)) < 0.7


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_every_rule_keeps_one_hostile_value_among_five_inside_the_honest_ones(name):
    rows = np.array([[1.0, -1.0], [1.2, -0.8], [0.8, -1.2], [1.1, -0.9], [1e6, 1e6]])
    aggregate = AGGREGATORS[name](rows, 1 if name != "mean" else 0)
    if name == "mean":
        assert aggregate[0] > 1e5  # the reference: one value moves the mean anywhere
    else:
        assert 0.8 <= aggregate[0] <= 1.2 and -1.2 <= aggregate[1] <= -0.8


def test_a_rule_refuses_as_many_hostile_rows_as_honest_ones():
    with pytest.raises(ValueError, match="2f < n"):
        trimmed_mean(FOUR, 2)


def test_a_rule_reads_its_name_and_tolerates_at_most_a_minority():
    rule = RobustRule.parse("nnm+trimmed_mean")
    assert (rule.pre, rule.aggregator, rule.name) == (("nnm",), "trimmed_mean", "nnm+trimmed_mean")
    assert [rule.tolerated(n) for n in (3, 4, 5, 7)] == [1, 1, 2, 3]
    assert RobustRule.parse("median", byzantine=1).tolerated(7) == 1
    assert RobustRule.parse("median", byzantine=5).tolerated(4) == 1
    assert rule(np.array([[1.0], [3.0]])) == pytest.approx([2.0])  # two rows: their mean
    with pytest.raises(ValueError, match="unknown robust aggregator 'krum'"):
        RobustRule.parse("krum")
    with pytest.raises(ValueError, match="unknown pre-aggregation 'bucketing'"):
        RobustRule.parse("bucketing+median")
    with pytest.raises(ValueError, match="byzantine_sites"):
        RobustRule.parse("median", byzantine=-1)


def _state(weight: float, variance: float, rows: dict[str, float]) -> dict[str, np.ndarray]:
    return {
        "features.conv.weight": np.full((2, 2), weight, dtype=np.float32),
        "features.norm.running_mean": np.zeros(2, dtype=np.float32),
        "features.norm.running_var": np.full(2, variance, dtype=np.float32),
        "features.norm.num_batches_tracked": np.array(3, dtype=np.int64),
        NAMED_HEAD.weight_key: np.array([[value, value] for value in rows.values()], dtype=np.float32),
        NAMED_HEAD.bias_key: np.array(list(rows.values()), dtype=np.float32),
    }


def test_applied_part_by_part_each_head_row_over_the_sites_that_hold_it():
    global_state = _state(0.0, 1.0, {"A": 0.0, "B": 0.0})
    results = [
        SiteResult(_state(1.0, 2.0, {"A": 1.0, "B": 1.0}), ["A", "B"]),
        SiteResult(_state(2.0, 3.0, {"A": 2.0}), ["A"]),
        SiteResult(_state(3.0, 4.0, {"A": 3.0, "B": 5.0}), ["A", "B"]),
        SiteResult(_state(100.0, 500.0, {"A": 100.0}), ["A"]),
    ]
    keys = [key for key in global_state if key not in NAMED_HEAD.keys]
    mean_state = dict(global_state)  # what the surgical mean left in place: each replaced part differs from it
    outcome = robust_state(mean_state, global_state, ["A", "B"], results, keys, RobustRule.parse("median"))
    state, parts = outcome.state, outcome.parts
    assert state["features.conv.weight"] == pytest.approx(np.full((2, 2), 2.5))  # median of 1, 2, 3, 100
    assert state["features.norm.running_var"] == pytest.approx(np.full(2, 1.0))  # statistics keep the mean's value
    assert state["features.norm.num_batches_tracked"] == 3  # an integer counter keeps the mean's value
    assert state[NAMED_HEAD.weight_key][0] == pytest.approx([2.5, 2.5])  # A: four sites
    assert state[NAMED_HEAD.weight_key][1] == pytest.approx([0.0, 0.0])  # B: two sites, the mean's (unchanged here)
    assert parts == {"backbone weights": 4, "head row A": 4}
    assert robust_state(mean_state, global_state, ["A", "B"], results[:2], keys, RobustRule.parse("median")).parts == {}


def test_a_rule_by_part_takes_one_rule_for_the_backbone_and_another_for_each_head_row():
    global_state = _state(0.0, 1.0, {"A": 0.0})
    # the backbone's values 1, 2, 10 and the row's 1, 2, 10 (weights and bias alike)
    results = [SiteResult(_state(value, 2.0, {"A": value}), ["A"]) for value in (1.0, 2.0, 10.0)]
    keys = [key for key in global_state if key not in NAMED_HEAD.keys]
    weighted = _state(7.0, 2.0, {"A": 7.0})  # the surgical (weighted) mean's values: a part whose rule is the mean
    rule = RobustRule.parse({"backbone": "mean", "head_rows": "median"})
    assert (rule.name, rule.rows.name, rule.backbone.name, rule.is_mean) == (
        "backbone mean, head rows median",
        "median",
        "mean",
        False,
    )
    state = robust_state(weighted, global_state, ["A"], results, keys, rule).state
    assert state["features.conv.weight"] == pytest.approx(np.full((2, 2), 7.0))  # keeps the weighted mean
    assert state[NAMED_HEAD.weight_key][0] == pytest.approx([2.0, 2.0])  # the row's median
    assert state[NAMED_HEAD.bias_key][0] == pytest.approx(2.0)
    swapped_rule = RobustRule.parse({"backbone": "median", "head_rows": "mean"})
    swapped = robust_state(weighted, global_state, ["A"], results, keys, swapped_rule).state
    assert swapped["features.conv.weight"] == pytest.approx(np.full((2, 2), 2.0))
    assert swapped[NAMED_HEAD.weight_key][0] == pytest.approx([7.0, 7.0])
    # one rule named for both parts is that rule; every part the mean is the plain mean
    assert RobustRule.parse({"backbone": "median", "head_rows": "median"}) == RobustRule.parse("median")
    assert RobustRule.parse({"backbone": "mean", "head_rows": "mean"}).is_mean
    with pytest.raises(ValueError, match=r"a rule for each of \['backbone', 'head_rows'\], got \{'backbone'"):
        RobustRule.parse({"backbone": "median"})
    with pytest.raises(ValueError, match="a rule for each of"):
        RobustRule.parse({"backbone": "median", "head_rows": {"backbone": "mean", "head_rows": "median"}})
    with pytest.raises(ValueError, match="unknown robust aggregator 'krum'"):
        RobustRule.parse({"backbone": "median", "head_rows": "krum"})


def test_shared_row_agreement_is_the_cosine_of_the_rows_three_or_more_hold_taken_together():
    consensus = {"A": np.array([1.0, 0.0]), "B": np.array([0.0, 2.0])}
    updates = {
        "along": {"A": np.array([2.0, 0.0]), "B": np.array([0.0, 1.0]), "own": np.array([9.0, 9.0])},
        "against": {"A": np.array([-1.0, 0.0]), "B": np.array([0.0, -1.0])},
        "half": {"A": np.array([1.0, 1.0])},  # B not held: only A counts, (1, 1) against (1, 0)
        "still": {"A": np.zeros(2)},  # held, never moved: nothing vouches for it
        "elsewhere": {"own": np.array([1.0, 0.0])},
    }
    agreement = shared_row_agreement(updates, consensus)
    # along: (2, 0, 0, 1) . (1, 0, 0, 2) = 4 over sqrt(5) sqrt(5); against: -3 over sqrt(2) sqrt(5)
    assert agreement == pytest.approx({"along": 0.8, "against": -3 / math.sqrt(10), "half": 1 / math.sqrt(2)})


def test_a_row_two_sites_hold_takes_their_mean_even_against_a_label_flipper():
    """Three sites hold row A, two hold B: honest h1 and a site trained on inverted labels, whose every update points
    the other way. The flipper's shared row is recorded against A's median (cosine -1), and B takes the two holders'
    mean: the flipper cancels it, the limit the docs state (a rule that took h1's row alone changed nothing in the
    attack suite and passed over an honest holder on the clean sweep, so it was removed)."""
    global_state = _state(0.0, 1.0, {"A": 0.0, "B": 0.0})
    mean_state = _state(0.0, 1.0, {"A": 0.0, "B": 0.0})  # the surgical mean of B: (1 - 1) / 2
    h1 = SiteResult(_state(1.0, 1.0, {"A": 1.0, "B": 1.0}), ["A", "B"], "h1")
    h2 = SiteResult(_state(1.0, 1.0, {"A": 2.0}), ["A"], "h2")
    flipper = SiteResult(_state(1.0, 1.0, {"A": -1.0, "B": -1.0}), ["A", "B"], "flipper")
    keys = [key for key in global_state if key not in NAMED_HEAD.keys]
    outcome = robust_state(mean_state, global_state, ["A", "B"], [h1, h2, flipper], keys, RobustRule.parse("median"))
    assert outcome.agreement == pytest.approx({"h1": 1.0, "h2": 1.0, "flipper": -1.0})
    assert outcome.state[NAMED_HEAD.weight_key][0] == pytest.approx([1.0, 1.0])  # A: the median of 1, 2, -1
    assert outcome.state[NAMED_HEAD.weight_key][1] == pytest.approx([0.0, 0.0])  # B: the mean's, cancelled
    assert outcome.parts == {"backbone weights": 3, "head row A": 3}


def test_an_update_sent_twice_counts_once():
    a, b = np.array([3.0, 4.0]), np.array([-1.0, 2.0])
    copy = a * (1 + 1e-5)  # a copy rounded on the way (the suite's arrived exact)
    rows = np.stack([a, b, copy, b + np.array([0.0, 0.004])])  # the last 0.2 % from b: honest sites apart, not a copy
    assert duplicate_groups(rows) == [[0, 2]]
    np.testing.assert_allclose(distinct_rows(rows), [(a + copy) / 2, b, b + np.array([0.0, 0.004])])
    # 5e-5 / (5 (1 + 1e-5)), to the rounding of distances taken from the Gram matrix
    assert closest_distance(rows) == pytest.approx(1e-5 / (1 + 1e-5), rel=1e-4)
    assert closest_distance(rows[:1]) is None
    assert duplicate_groups(np.zeros((2, 3))) == [[0, 1]]  # two sites that sent nothing sent the same
    assert DUPLICATE_DISTANCE == 1e-3


def test_a_copy_of_an_honest_sites_update_does_not_decide_a_median_of_three():
    """The mimic attack (Karimireddy, He, Jaggi, 2022): site 3 sends site 1's update. Counted twice, it is the
    geometric median of the three, backbone and shared row alike, and site 2's update is lost; counted once, the two
    distinct updates take their mean, what the honest sites alone give."""
    global_state = _state(0.0, 1.0, {"A": 0.0})
    honest = [SiteResult(_state(1.0, 2.0, {"A": 1.0}), ["A"]), SiteResult(_state(3.0, 2.0, {"A": -1.0}), ["A"])]
    mimic = SiteResult({key: value.copy() for key, value in honest[0].state.items()}, ["A"])
    keys = [key for key in global_state if key not in NAMED_HEAD.keys]
    rule = RobustRule.parse("geometric_median")
    outcome = robust_state(dict(global_state), global_state, ["A"], [*honest, mimic], keys, rule)
    state, parts = outcome.state, outcome.parts
    assert state["features.conv.weight"] == pytest.approx(np.full((2, 2), 2.0))  # (1 + 3) / 2, not 1
    assert state[NAMED_HEAD.weight_key][0] == pytest.approx([0.0, 0.0])  # (1 - 1) / 2
    assert state[NAMED_HEAD.bias_key][0] == pytest.approx(0.0)
    assert parts == {"backbone weights": 3, "head row A": 3}
    assert rule(np.stack([np.full(4, 1.0), np.full(4, 3.0), np.full(4, 1.0)])) == pytest.approx(np.full(4, 1.0))


def _pull_toward_b(distance: float, rule: str = "geometric_median") -> float:
    """Unit updates a and b at cosine 0.4 (honest sites' backbone updates lay 1.009-1.335 apart in the clean sweep)
    and a third at ``distance`` from a, orthogonal to both: how far ``rule`` (as the server parses it, tolerating one
    hostile row of three) takes the aggregate of the three from a towards b, as a share of a -> b (the honest pair's
    mean is 0.5)."""
    dimensions = 64
    a, b, c = np.zeros(dimensions), np.zeros(dimensions), np.zeros(dimensions)
    a[0], b[0], b[1], c[2] = 1.0, 0.4, math.sqrt(1 - 0.16), distance
    point = RobustRule.parse(rule)(np.stack([a, b, a + c]))
    return float((point - a) @ (b - a) / ((b - a) @ (b - a)))


def test_at_three_sites_every_robust_rule_takes_a_near_copy_for_two_honest_sites():
    """The lower bound docs/server-checks.md states, on every aggregator the bundle ships, alone and after
    nearest-neighbour mixing: updates a, b and a near-copy of a 10 % away are also what two honest sites that trained
    alike and one hostile site send, and each takes them so, staying within 0.05 of a on the way to b, where the honest
    pair's mean is halfway and the plain mean goes a third."""
    expected = {"median": 0.0, "trimmed_mean": 0.0, "meamed": 0.0, "geometric_median": 0.026,
                "centered_clipping": 0.046, "multi_krum": 0.0, "mda": 0.0}  # fmt: skip
    assert set(AGGREGATORS) == {"mean", *expected}
    assert _pull_toward_b(0.1, "mean") == pytest.approx(1 / 3)
    assert {name: _pull_toward_b(0.1, name) for name in expected} == pytest.approx(expected, abs=5e-4)
    assert {name: _pull_toward_b(0.1, f"nnm+{name}") for name in expected} == pytest.approx(
        dict.fromkeys(expected, 0.0), abs=5e-4
    )


def test_at_three_sites_the_geometric_median_gives_the_update_unlike_the_other_two_less_than_a_third():
    """Why a near-copy (mimic_noised) still decides a median of three, at any distance a duplicate rule could allow:
    the geometric median's pull towards b is 0.01 with the copy 0.2 % away and only 0.2 at an honest site's distance,
    where the mean's is a third."""
    shares = [_pull_toward_b(distance) for distance in (0.002, 0.5, 1.1)]
    assert shares == pytest.approx([0.0005, 0.12, 0.21], abs=0.005)  # docs/server-checks.md quotes them
    assert _pull_toward_b(0.002, "mean") == pytest.approx(1 / 3) and _pull_toward_b(1.1, "mean") == pytest.approx(1 / 3)


def test_each_sites_shared_rows_are_read_against_their_consensus_with_their_count():
    rows = [
        np.array([1.0, 0.0]),
        np.array([0.0, 1.0]),
        np.array([1.0, 1.0]),
        np.array([2.0, 0.5]),
        np.array([0.5, 2.0]),
    ]
    names = ["A", "B", "C", "D", "E"]
    honest = {
        f"h{index}": {name: (1 + 0.1 * index) * row for name, row in zip(names, rows, strict=True)}
        for index in range(3)
    }
    flipper = {name: -row for name, row in zip(names, rows, strict=True)}
    one_row = {"A": -rows[0]}  # one shared row the other way: not judged
    against = shared_rows_against_consensus({**honest, "x": flipper, "one": one_row}, median)
    assert {site: shared.rows for site, shared in against.items()} == {"h0": 5, "h1": 5, "h2": 5, "x": 5, "one": 1}
    assert against["x"].cosine == pytest.approx(-1.0, abs=1e-3) and against["one"].cosine == pytest.approx(-1.0)
    assert min(against[site].cosine for site in honest) == pytest.approx(1.0, abs=1e-3)
    # the consensus (a coordinate-wise median): 1.05 rows (A's five holders' -rows[0] twice, a copy counted once)
    assert against["x"].scale == pytest.approx(1 / 1.05) and against["h2"].scale == pytest.approx(1.2 / 1.05)
    assert against["x"].mean_cosine == pytest.approx(-1.0) and against["h2"].mean_cosine == pytest.approx(1.0)


def test_one_large_row_against_its_consensus_does_not_decide_the_mean_cosine():
    """Seven rows each held by three sites; one site's first row points the other way at 100 times its size (as two
    colluders of a row's three holders could make its consensus turn against an honest site's): its rows concatenated
    read against their consensus, their mean cosine (each row alike) does not."""
    rng = np.random.default_rng(0)
    updates = {f"h{index}": {f"c{row}": rng.normal(1.0, 0.1, 4) for row in range(7)} for index in range(3)}
    updates["h0"]["c0"] = -100 * np.ones(4)
    against = shared_rows_against_consensus(updates, median)["h0"]
    assert against.rows == 7 and against.cosine < 0 < against.mean_cosine
    assert against.mean_cosine == pytest.approx((6 - 1) / 7, abs=0.02)  # six rows at about 1, one at -1


def test_only_sites_in_their_warm_up_round_with_five_or_more_opposed_shared_rows_are_named():
    against = {
        site: SharedRows(0.5, rows, 1.0, mean_cosine)  # the rows concatenated (0.5) are not what is judged
        for site, mean_cosine, rows in [
            ("h0", 0.95, 7), ("h1", 0.90, 7), ("h2", -0.30, 14), ("x", -0.98, 7), ("few", -1.0, 4), ("zero", 0.0, 5)
        ]
    }  # fmt: skip
    opposed = opposed_at_warmup(against, judged=["h0", "h1", "x", "few", "zero"])  # h2 has no warm-up: not judged
    assert sorted(opposed) == ["x", "zero"]  # 0 counts as against; four rows are too few to judge
    assert opposed["x"] == (
        "in its warm-up round its updates of the 7 head rows it shares with two or more other sites point against "
        "their consensus (mean cosine -0.98 with their robust aggregates): left out for the rest of the job"
    )
    assert opposed_at_warmup(against, judged=["h0", "h1", "h2", "x", "zero"]) == {}  # three of six: no one's consensus
    assert opposed_at_warmup(against, judged=[]) == {}


def _two_flippers_of_seven(flippers: dict[str, tuple[tuple[float, float], tuple[float, float]]]) -> dict[str, dict]:
    """The attack suite's seven sites as rows: three CheXpert sites and four NIH sites each move 7 rows all seven hold
    and their own dataset's rows (6 CheXpert rows, 7 NIH rows, so the NIH sites' own rows have four holders), each row
    by one 2-vector; the honest sites' point along x, and ``flippers`` gives the last two NIH sites' vectors, for the
    rows all hold and for the NIH rows."""
    honest = {
        "site-c1": (1.0, 0.1), "site-c2": (1.0, -0.1), "site-c3": (1.1, 0.0),
        "site-n1": (0.9, 0.1), "site-n2": (0.9, -0.1),
    }  # fmt: skip
    vectors = {site: (vector, vector) for site, vector in honest.items()} | flippers
    updates = {}
    for site, (shared, own) in vectors.items():
        names = [f"C{row}" for row in range(6)] if site.startswith("site-c") else [f"N{row}" for row in range(7)]
        updates[site] = {f"S{row}": np.array(shared) for row in range(7)} | {name: np.array(own) for name in names}
    return updates


COLLUDING = {"site-n3": ((-1.6, 0.0), (-1.6, 0.0)), "site-n4": ((-1.6, -0.05), (-1.6, -0.05))}
APART = {"site-n3": ((-0.5, 1.0), (-0.6, 1.0)), "site-n4": ((-1.0, 0.0), (-1.0, 1.0))}


def test_a_row_whose_holders_split_judges_no_one():
    """Two colluding flippers among the four holders of the NIH rows send rows closer together than the honest pair's
    (not close enough to count as copies): the rows' geometric median goes to them, so that the honest pair points
    against it. Over every row each of the four NIH sites would read about 0 (the honest sites' 7 rows all hold at +1,
    their 7 NIH rows at -1), and which of them falls at 0 or below is chance (an honest one, stop 114's synthetic
    federations). Half of those rows' holders point against their consensus: it is no one's, and the NIH rows judge no
    one; on the 7 rows all seven sites hold the flippers read -1 and both go, the honest sites stay."""
    updates = _two_flippers_of_seven(COLLUDING)
    against = shared_rows_against_consensus(updates, geometric_median)
    assert {site: (shared.rows, shared.split) for site, shared in against.items()} == {
        "site-c1": (13, 0), "site-c2": (13, 0), "site-c3": (13, 0),
        "site-n1": (7, 7), "site-n2": (7, 7), "site-n3": (7, 7), "site-n4": (7, 7),
    }  # fmt: skip
    assert max(against[site].mean_cosine for site in ("site-n3", "site-n4")) < -0.99
    assert min(shared.mean_cosine for site, shared in against.items() if site < "site-n3") > 0.98
    opposed, _ = peeled_opposed_at_warmup(updates, geometric_median, judged=list(updates))
    assert list(opposed) == ["site-n3", "site-n4"]  # site-n4 judged again without site-n3: no row splits then
    assert opposed["site-n3"] == (
        "in its warm-up round its updates of the 7 head rows it shares with two or more other sites (and 7 more whose "
        "holders split, which judge no one) point against their consensus (mean cosine -1.00 with their robust "
        "aggregates): left out for the rest of the job"
    )


def test_a_site_left_with_fewer_than_five_rows_that_do_not_split_is_read_on_all_its_rows():
    """Four sites hold seven rows (stop 114's review): an honest site whose data point 3 of them the other way and a
    flipper against all of them make those 3 rows split two and two. Set aside, they would leave the flipper 4 rows,
    too few to judge it on: a site left with fewer than five is read on all its shared rows, as before, and the
    flipper goes; the honest dissenter, read on all 7 too, stays."""
    honest = {"site-c1": (1.0, 0.1), "site-c2": (1.0, -0.1)}
    updates = {site: {f"R{row}": np.array(vector) for row in range(7)} for site, vector in honest.items()}
    updates["site-n1"] = {f"R{row}": np.array((-0.9, 0.1) if row < 3 else (0.9, 0.1)) for row in range(7)}
    updates["site-x"] = {f"R{row}": np.array((-1.6, 0.0)) for row in range(7)}
    against = shared_rows_against_consensus(updates, geometric_median)
    assert {site: (shared.rows, shared.split) for site, shared in against.items()} == {
        "site-c1": (7, 3), "site-c2": (7, 3), "site-n1": (7, 3), "site-x": (7, 3)
    }  # fmt: skip
    assert against["site-x"].mean_cosine < 0 < against["site-n1"].mean_cosine
    opposed, _ = peeled_opposed_at_warmup(updates, geometric_median, judged=list(updates))
    assert list(opposed) == ["site-x"]
    assert (
        "its updates of the 7 head rows it shares with two or more other sites (3 of them split among their "
        in (opposed["site-x"])
    )


def test_a_second_flipper_the_first_pass_misses_is_judged_again_without_the_first():
    """Two flippers apart, neither taking the NIH rows' consensus (no row splits): as in stop 113's run (one flipper
    read -0.01 and was rejected, the other +0.05 and was accepted every round), the first pass reads site-n4 at -0.25
    and site-n3 at +0.15, pulled up by the NIH rows whose consensus the two flippers pull towards them. Without
    site-n4 those rows' consensus is the honest pair's, site-n3 reads below 0 and goes too. The record stays the
    first pass's."""
    updates = _two_flippers_of_seven(APART)
    first = shared_rows_against_consensus(updates, geometric_median)
    assert {site: (round(shared.mean_cosine, 3), shared.split) for site, shared in first.items() if "-n" in site} == {
        "site-n1": (0.676, 0), "site-n2": (0.564, 0), "site-n3": (0.148, 0), "site-n4": (-0.245, 0)
    }  # fmt: skip
    assert list(opposed_at_warmup(first, judged=list(updates))) == ["site-n4"]  # one pass

    opposed, record = peeled_opposed_at_warmup(updates, geometric_median, judged=list(updates))
    assert record == first
    assert list(opposed) == ["site-n4", "site-n3"]  # in the order of the passes
    assert opposed["site-n3"].startswith(
        "in its warm-up round (judged again without the 1 site rejected before it) its updates of the 14 head rows it "
        "shares with two or more other sites point against their consensus (mean cosine -"
    )


def test_judging_in_passes_changes_nothing_where_the_first_pass_rejects_no_one_and_stops_before_half():
    """Where no judged site reads 0 or below at first, the passes reject no one (the rule's error rate on clean
    federations is the single pass's). And a pass never leaves half of the sites that share rows out: of four, one."""
    updates = _two_flippers_of_seven({"site-n3": ((1.0, 0.3),) * 2, "site-n4": ((0.8, -0.3),) * 2})  # all honest
    assert peeled_opposed_at_warmup(updates, geometric_median, judged=list(updates))[0] == {}

    four = {site: updates[site] for site in ("site-c1", "site-n1", "site-n2")}
    four["site-x"] = {name: -np.array([1.0, 0.2]) for name in four["site-n1"]}  # against all: a flipper
    opposed, record = peeled_opposed_at_warmup(four, geometric_median, judged=list(four))
    assert list(opposed) == ["site-x"] and record["site-x"].mean_cosine < -0.9
    honest_too = {**four, "site-n2": {name: -row for name, row in four["site-n2"].items()}}  # two of four flip
    assert len(peeled_opposed_at_warmup(honest_too, geometric_median, judged=list(honest_too))[0]) <= 1


def _sizes(statistics: float, rows: dict[str, list[float]]) -> UpdateSizes:
    sizes = UpdateSizes(groups={STATISTICS: statistics})
    sizes.row_changes = {name: np.array(row) for name, row in rows.items()}
    return sizes


def test_two_sites_whose_shared_rows_point_apart_are_named():
    """A round of two: backbone updates (1, 2) and (-1, -1) have cosine -3 / sqrt(10); BatchNorm statistics 0.2
    and 0.9 (4.5 times); five rows both moved point apart (each -1) and a sixth the same way (+1): mean -4/6. In the
    job's first round from untrained heads the rows are judged against 0 and the backbone against -0.5; later rounds
    are not judged by direction (two honest updates cancel near averaging's fixed point); the statistics are
    recorded, not judged."""
    rows = {f"class-{index}": [1.0, 0.0] for index in range(6)}
    flipped = {name: [-1.0, 0.0] for name in list(rows)[:5]} | {"class-5": [2.0, 0.0], "own": [0.0, 1.0]}
    agreement = two_site_agreement(
        {"site-a": np.array([1.0, 2.0]), "site-b": np.array([-1.0, -1.0])},
        {"site-a": _sizes(0.2, rows), "site-b": _sizes(0.9, flipped | {"unmoved": [0.0, 0.0]})},
    )
    assert agreement == pytest.approx(
        {
            "backbone_cosine": -3 / math.sqrt(10),
            "statistics_ratio": 4.5,
            "shared_rows": 6,
            "shared_rows_mean_cosine": -4 / 6,
        }
    )
    assert two_sites_apart(agreement, warmup_round=True) == [
        "in their warm-up round their updates of the 6 head rows both hold point apart (mean cosine -0.67): one of "
        "them reads those findings' labels the other way round",
        "in their warm-up round their backbone updates point opposite (cosine -0.95, at most -0.5): one of them "
        "negates the other's update",
    ]
    assert two_sites_apart(agreement, warmup_round=False) == []  # later, honest pairs come to cancel too
    # backbones at a cosine of -0.5 (the bound: named) and -0.49 (not), with rows that agree, in the first round
    for cosine, named in ((-0.5, True), (-0.49, False)):
        apart = two_site_agreement(
            {"site-a": np.array([1.0, 0.0]), "site-b": np.array([cosine, math.sqrt(1 - cosine**2)])},
            {"site-a": _sizes(0.2, rows), "site-b": _sizes(0.9, rows)},
        )
        assert apart["backbone_cosine"] == pytest.approx(cosine) and apart["shared_rows_mean_cosine"] == 1.0
        assert bool(two_sites_apart(apart, warmup_round=True)) is named
        assert two_sites_apart(apart, warmup_round=False) == []
    # shared rows at a mean cosine of 0 (named) and 0.01 (not) in the first round, the backbones agreeing
    for cosine, named in ((0.0, True), (0.01, False)):
        turned = {name: [cosine, math.sqrt(1 - cosine**2)] for name in rows}
        apart = two_site_agreement(
            {"site-a": np.ones(2), "site-b": np.ones(2)}, {"site-a": _sizes(0.2, rows), "site-b": _sizes(0.2, turned)}
        )
        assert apart["shared_rows_mean_cosine"] == pytest.approx(cosine, abs=1e-12)
        assert bool(two_sites_apart(apart, warmup_round=True)) is named
    # every shared row reversed, the backbones agreeing: named in the first round by the rows alone, later not at all
    reversed_rows = {name: [-1.0, 0.0] for name in rows}
    opposite = two_site_agreement(
        {"site-a": np.ones(2), "site-b": np.ones(2)},
        {"site-a": _sizes(0.2, rows), "site-b": _sizes(0.2, reversed_rows)},
    )
    assert two_sites_apart(opposite, warmup_round=True) == [
        "in their warm-up round their updates of the 6 head rows both hold point apart (mean cosine -1.00): one of "
        "them reads those findings' labels the other way round"
    ]
    assert two_sites_apart(opposite, warmup_round=False) == []
    # far apart, with rows that agree and backbones at a right angle: nothing is named in any round
    agreeing = two_site_agreement(
        {"site-a": np.array([1.0, 0.0]), "site-b": np.array([0.0, 1.0])},
        {"site-a": _sizes(0.2, rows), "site-b": _sizes(0.9, rows)},
    )
    assert agreeing["shared_rows_mean_cosine"] == pytest.approx(1.0)
    assert two_sites_apart(agreeing, warmup_round=True) == two_sites_apart(agreeing, warmup_round=False) == []
    four_rows = {name: [-1.0, 0.0] for name in list(rows)[:4]}  # fewer than five shared rows are not judged
    few = two_site_agreement({"a": np.ones(2), "b": np.ones(2)}, {"a": _sizes(0.2, rows), "b": _sizes(0.2, four_rows)})
    assert (
        few["shared_rows"] == 4
        and two_sites_apart(few, warmup_round=True) == two_sites_apart(few, warmup_round=False) == []
    )


@pytest.mark.parametrize("far", [10.0, 1e3, 1e6])
def test_a_far_row_moves_the_median_of_three_by_a_share_of_the_others_spread(far):
    """docs/server-checks.md (refitting the head rows at a site): two rows a distance d apart and a third anywhere far
    off: the geometric median sits d / (2 sqrt 3), about 0.29 d, from the pair's midpoint towards the third, at any
    distance of the third (the Fermat point: the three sides seen at 120 degrees)."""
    spread = 2.5
    rows = np.array([[0.0, 0.0, 1.0], [spread, 0.0, 1.0], [spread / 2, far, 1.0]])
    median = geometric_median(rows, 1)
    np.testing.assert_allclose(median, [spread / 2, spread / (2 * np.sqrt(3)), 1.0], atol=1e-5)
