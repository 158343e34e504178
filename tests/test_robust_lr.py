"""The robust learning rate (``robust_learning_rate``, Ozdayi et al. 2021): the values it turns back, the job's too."""

from __future__ import annotations

import numpy as np
import pytest

from surgical_aggregation.core.head import HeadSpec
from surgical_aggregation.core.robust_lr import learning_rates, voted_state
from surgical_aggregation.flare import protocol
from surgical_aggregation.flare.settings import checked_arguments

from fake_sites import FakeSite, Harness, shifted

HEAD = HeadSpec("head.weight", "head.bias")
AVERAGED = ["backbone.conv.weight", "backbone.bn.running_var", "head.weight", "head.bias"]


def _state(weights: list[float], rows: list[list[float]]) -> dict[str, np.ndarray]:
    return {
        "backbone.conv.weight": np.array(weights, dtype=np.float64),
        "backbone.bn.running_var": np.full((2,), 1.0),
        "head.weight": np.array([row[:-1] for row in rows], dtype=np.float64).reshape(len(rows), 2),
        "head.bias": np.array([row[-1] for row in rows], dtype=np.float64),
    }


def test_the_sign_vote_of_the_papers_definition():
    rows = np.array([[1.0, 1.0, -1.0, 0.0], [2.0, -1.0, -1.0, 0.0], [3.0, 1.0, 1.0, 5.0], [1.0, -2.0, -4.0, 1.0]])
    # |sum of signs|: 4, 0, 2, 2
    np.testing.assert_array_equal(learning_rates(rows, 1), [1, -1, 1, 1])
    np.testing.assert_array_equal(learning_rates(rows, 3), [1, -1, -1, -1])
    np.testing.assert_array_equal(learning_rates(rows, 4), [1, -1, -1, -1])


def test_a_value_the_sites_disagree_on_is_turned_back_and_what_no_vote_can_judge_is_kept():
    """Three sites: backbone values on which all three agree keep the aggregate, the others are turned back; head
    rows likewise, matched by name, "Mass" over three holders and "Edema" over two; the statistics are kept."""
    received = _state([0.0] * 4, [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    sent = [
        (_state([1.0, 1.0, -1.0, 0.0], [[1.0, 1.0, 1.0]]), ["Mass"]),
        (_state([2.0, -1.0, -1.0, 0.0], [[1.0, -1.0, 1.0], [2.0, -2.0, 2.0]]), ["mass", "Edema"]),
        (_state([3.0, 1.0, 1.0, 5.0], [[1.0, 1.0, -1.0], [-2.0, 2.0, 2.0]]), ["Mass", "edema"]),
    ]
    aggregate = _state([2.0, 1 / 3, -1 / 3, 5 / 3], [[1.0, 1 / 3, 1 / 3], [0.0, 0.0, 2.0]])
    aggregate["backbone.bn.running_var"] = np.full((2,), 3.0)
    voted, shares = voted_state(aggregate, received, ["Mass", "Edema"], sent, AVERAGED, 2, HEAD, str.capitalize)
    np.testing.assert_allclose(voted["backbone.conv.weight"], [2.0, -1 / 3, 1 / 3, -5 / 3], atol=1e-12)
    np.testing.assert_allclose(voted["head.weight"], [[1.0, -1 / 3], [0.0, 0.0]], atol=1e-12)
    np.testing.assert_allclose(voted["head.bias"], [-1 / 3, 2.0], atol=1e-12)
    np.testing.assert_array_equal(voted["backbone.bn.running_var"], [3.0, 3.0])
    # Edema's two weights disagree (turned back: 0 stays 0), its biases agree (2 kept)
    assert shares == pytest.approx({"backbone weights": 0.75, "head row Mass": 2 / 3, "head row Edema": 2 / 3})
    off, none = voted_state(aggregate, received, ["Mass", "Edema"], sent, AVERAGED, 0, HEAD, str.capitalize)
    assert none == {} and all(np.array_equal(off[key], aggregate[key]) for key in aggregate)


def test_a_copy_votes_once_and_one_update_takes_no_vote():
    """A site that sends a copy of another's update gets no second vote: under theta 3, two distinct updates cannot
    vote (counted twice, the copy would turn the second value back); a lone update has nothing to agree with."""
    received = _state([0.0, 0.0], [])
    copy = _state([1.0, -1.0], [])
    sent = [(copy, []), (dict(copy), []), (_state([1.0, 1.0], []), [])]
    aggregate = _state([1.0, -1 / 3], [])
    voted, shares = voted_state(aggregate, received, [], sent, AVERAGED, 3, HEAD)
    assert shares == {}
    np.testing.assert_array_equal(voted["backbone.conv.weight"], aggregate["backbone.conv.weight"])
    voted, shares = voted_state(aggregate, received, [], sent[:1], AVERAGED, 1, HEAD)
    assert shares == {}
    np.testing.assert_array_equal(voted["backbone.conv.weight"], aggregate["backbone.conv.weight"])


def _against_the_others(round_number, params):
    """Moves every value by 0.01, except the convolution's, which it moves by -0.01."""
    moved = shifted(params, 0.01)
    moved["backbone.conv.weight"] = moved["backbone.conv.weight"] - 0.02
    return moved


@pytest.mark.parametrize("threshold", [0, 2])
def test_the_job_turns_back_the_values_its_sites_disagree_on(tmp_path, threshold):
    """Three sites through the controller (plain mean, no clipping): two move every value by +0.01 and +0.02, the
    third by +0.01 but its convolution by -0.01. The convolution's mean, +0.02/3, is turned back to -0.02/3 under
    theta 2; every other value, which all three moved alike, keeps its mean +0.04/3. With the defence removed the
    convolution keeps +0.02/3 and the test fails."""
    sites = [
        FakeSite("site-a", ["Mass", "Edema"], [0.9, 0.5]),
        FakeSite("site-b", ["Mass", "Edema"], [0.9, 0.5], behaviour=lambda number, params: shifted(params, 0.02)),
        FakeSite("site-c", ["Mass", "Edema"], [0.9, 0.5], behaviour=_against_the_others),
    ]
    harness = Harness(sites, tmp_path, num_rounds=1, robust_learning_rate=threshold, reject_opposed_updates=False,
                      clip_updates=False)  # fmt: skip
    harness.run()
    aggregation = harness.history[1]["aggregation"]
    names, received = sites[0].received[0]
    saved = harness.saved[0]
    model = saved.params
    rows = [saved.meta[protocol.META_CLASS_NAMES].index(name) for name in names]  # the site's rows, by name

    def moved(key: str) -> np.ndarray:
        value = np.asarray(model[key], dtype=np.float64)
        return (value[rows] if key.startswith("head.") else value) - np.asarray(received[key], dtype=np.float64)

    expected = 0.02 / 3 if threshold == 0 else -0.02 / 3
    np.testing.assert_allclose(moved("backbone.conv.weight"), expected, atol=1e-6)
    for key in ("backbone.bn.weight", "backbone.bn.bias", "backbone.bn.running_mean", "head.weight", "head.bias"):
        np.testing.assert_allclose(moved(key), 0.04 / 3, atol=1e-6, err_msg=key)
    if threshold == 0:
        assert "robust_learning_rate" not in aggregation
        return
    turned = aggregation["robust_learning_rate"]
    size = {key: np.asarray(received[key]).size for key in ("backbone.conv.weight", "backbone.bn.weight")}
    share = size["backbone.conv.weight"] / (size["backbone.conv.weight"] + 2 * size["backbone.bn.weight"])
    # sites a and c sent the same head rows (counted once): two distinct updates, which agree, so none turned back
    assert turned == pytest.approx({"backbone weights": share, "head row Mass": 0.0, "head row Edema": 0.0}, abs=1e-4)


@pytest.mark.parametrize("value", [-1, 1.5, True, "2"])
def test_robust_learning_rate_is_a_whole_number(value):
    with pytest.raises(ValueError, match="robust_learning_rate must be a whole number"):
        checked_arguments({"robust_learning_rate": value})
