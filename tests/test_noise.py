"""The server's noise on the aggregate (``update_noise``, FLAME's adaptive noise): its size, its parts, its seed."""

from __future__ import annotations

import numpy as np
import pytest

from surgical_aggregation.core.head import HeadSpec
from surgical_aggregation.core.noise import noise_seed, noised_state
from surgical_aggregation.flare.settings import checked_arguments

from fake_sites import FakeSite, Harness
from helpers import TOY_FEATURES

HEAD = HeadSpec("head.weight", "head.bias")
SIZE = 40_000  # values in the worked example's backbone weight: its noise's spread is measured to about 1 %


def _state(weight: float, rows: list[float]) -> dict[str, np.ndarray]:
    return {
        "backbone.conv.weight": np.full((SIZE,), weight),
        "backbone.bn.running_var": np.full((4,), 1.0),
        "head.weight": np.array([[value] * 3 for value in rows]),
        "head.bias": np.array(rows, dtype=np.float64),
    }


def _worked_example(scale: float, seed=(0, 1)) -> tuple[dict, dict, dict]:
    """Three sites move the backbone weights by 0.001, 0.002 and 0.005 a value (norms 0.2, 0.4 and 1.0: median 0.4);
    two of them move head row "Mass" (weights and bias: norms 1 and 5, median 3), one moves row "Edema" (norm 2)."""
    received = _state(0.0, [0.0, 0.0])
    sent = [
        (_state(0.001, [0.5]), ["Mass"]),
        (_state(0.002, [2.5, 1.0]), ["mass", "Edema"]),  # its own spelling: matched by name
        (_state(0.005, []), []),
    ]
    aggregate = _state(0.002, [1.0, 1.0])
    averaged = ["backbone.conv.weight", "backbone.bn.running_var", "head.weight", "head.bias"]
    noised, deviations = noised_state(
        aggregate, received, ["Mass", "Edema"], sent, averaged, scale, seed, HEAD, str.capitalize
    )
    return aggregate, noised, deviations


def test_each_part_takes_noise_of_lambda_times_its_median_update_norm():
    aggregate, noised, deviations = _worked_example(0.01)
    assert deviations == pytest.approx({"backbone weights": 0.004, "head row Mass": 0.03, "head row Edema": 0.02})
    added = noised["backbone.conv.weight"] - aggregate["backbone.conv.weight"]
    assert abs(added.mean()) < 3 * 0.004 / np.sqrt(SIZE)
    assert added.std() == pytest.approx(0.004, rel=0.02)
    np.testing.assert_array_equal(noised["backbone.bn.running_var"], aggregate["backbone.bn.running_var"])
    assert not np.array_equal(noised["head.weight"], aggregate["head.weight"])
    assert not np.array_equal(noised["head.bias"], aggregate["head.bias"])


def test_the_same_round_and_sites_draw_the_same_noise_and_lambda_0_draws_none():
    first, second = _worked_example(0.01)[1], _worked_example(0.01)[1]
    other = _worked_example(0.01, seed=(1, 1))[1]
    for key in first:
        np.testing.assert_array_equal(first[key], second[key])
    assert not np.array_equal(first["backbone.conv.weight"], other["backbone.conv.weight"])
    aggregate, unchanged, deviations = _worked_example(0.0)
    assert deviations == {}
    for key in aggregate:
        np.testing.assert_array_equal(unchanged[key], aggregate[key])
    assert noise_seed(3, ["site-b", "site-a"]) == noise_seed(3, ["site-a", "site-b"]) != noise_seed(3, ["site-a"])


@pytest.mark.parametrize("noise", [0.0, 0.5])
def test_the_job_adds_the_noise_it_records_to_the_rounds_mean(tmp_path, noise):
    sites = [FakeSite(f"site-{name}", ["Mass", "Edema"], [0.9, 0.5]) for name in "abc"]
    harness = Harness(sites, tmp_path, num_rounds=1, update_noise=noise)
    harness.run()
    aggregation = harness.history[1]["aggregation"]
    _, received = sites[0].received[0]
    model = harness.saved[0]
    # every site moved every value by 0.01: the mean moves by 0.01; the median update norm is 0.01 x sqrt(values)
    weights = np.concatenate(
        [np.asarray(model.params[key], dtype=np.float64).ravel() - np.asarray(received[key]).ravel()
         for key in ("backbone.conv.weight", "backbone.bn.weight", "backbone.bn.bias")]
    )  # fmt: skip
    statistics = np.asarray(model.params["backbone.bn.running_mean"]) - np.asarray(received["backbone.bn.running_mean"])
    np.testing.assert_allclose(statistics, 0.01, atol=1e-6)  # never noised
    if noise == 0:
        assert "noise" not in aggregation
        np.testing.assert_allclose(weights, 0.01, atol=1e-6)
        return
    expected = noise * 0.01 * np.sqrt(weights.size)
    row = noise * 0.01 * np.sqrt(TOY_FEATURES + 1)
    assert aggregation["noise"] == pytest.approx(
        {"backbone weights": expected, "head row Mass": row, "head row Edema": row}, rel=1e-3
    )
    added = weights - 0.01
    assert np.abs(added).max() > 1e-3  # the noise is there, at its recorded size
    assert 0.5 * expected < added.std() < 1.6 * expected  # 44 draws: far inside the chi-square bounds
    again = Harness([FakeSite(f"site-{name}", ["Mass", "Edema"], [0.9, 0.5]) for name in "abc"], tmp_path / "again",
                    num_rounds=1, update_noise=noise)  # fmt: skip
    again.run()
    for key, value in model.params.items():
        np.testing.assert_array_equal(np.asarray(again.saved[0].params[key]), np.asarray(value), err_msg=key)


@pytest.mark.parametrize("value", [-0.1, 1.0, True, "0.001"])
def test_update_noise_is_a_number_from_0_to_below_1(value):
    with pytest.raises(ValueError, match="update_noise must be a number from 0"):
        checked_arguments({"update_noise": value})
