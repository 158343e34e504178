"""Surgical aggregation and FedAvg on state dicts, checked against hand-computed means to 1e-6."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from surgical_aggregation.core.aggregation import Contribution, ContributionRejected, SurgicalAggregator
from surgical_aggregation.core.head import batchnorm_keys, slice_for_client
from surgical_aggregation.core.labels import BUILTIN_VOCABULARY, Vocabulary
from surgical_aggregation.images.model import NamedDenseNet

from helpers import TOY_HEAD, fedavg_reference, rows_by_name, toy_state

TOL = 1e-6
BN_KEYS = {
    "backbone.bn.weight",
    "backbone.bn.bias",
    "backbone.bn.running_mean",
    "backbone.bn.running_var",
    "backbone.bn.num_batches_tracked",
}


def surgical(global_state, global_classes, contributions, **options):
    aggregator = SurgicalAggregator(global_state, global_classes, head=options.pop("head", TOY_HEAD), **options)
    for contribution in contributions:
        aggregator.add(contribution)
    return aggregator.finalize()


def hand_mean(arrays, weights=None):
    weights = [1.0] * len(arrays) if weights is None else weights
    total = sum(np.asarray(a, dtype=np.float64) * w for a, w in zip(arrays, weights, strict=True))
    return total / sum(weights)


# Three clients, overlapping classes, each in its own order.
CLIENT_CLASSES = {
    "site-a": ["Atelectasis", "Cardiomegaly", "Edema", "Hernia"],
    "site-b": ["Edema", "Fracture", "Atelectasis"],
    "site-c": ["Cardiomegaly", "Edema", "Lung Lesion", "Atelectasis"],
}


@pytest.fixture
def three_clients():
    states = {client: toy_state(len(classes), seed) for seed, (client, classes) in enumerate(CLIENT_CLASSES.items(), 1)}
    return [
        Contribution(c, states[c], CLIENT_CLASSES[c], num_samples=n) for c, n in zip(states, (10, 30, 60), strict=True)
    ]


def test_identical_class_sets_reduce_to_fedavg_on_every_key():
    classes = ["Atelectasis", "Cardiomegaly", "Pleural Effusion"]
    base = NamedDenseNet(classes).state_dict()
    states = []
    for seed in range(3):
        generator = torch.Generator().manual_seed(seed)
        states.append(
            {
                k: (v + torch.randn(v.shape, generator=generator) * 0.01) if v.is_floating_point() else v + seed
                for k, v in base.items()
            }
        )
    for weighting, weights in (("uniform", None), ("samples", [5, 10, 20])):
        contributions = [Contribution(f"site-{i}", s, classes, num_samples=5 * 2**i) for i, s in enumerate(states)]
        aggregator = SurgicalAggregator(base, classes, backbone_strategy="fedavg", weighting=weighting)
        for contribution in contributions:
            aggregator.add(contribution)
        result = aggregator.finalize()
        expected = fedavg_reference(states, weights)
        assert result.class_names == classes
        assert set(result.state) == set(expected)
        for key in expected:
            assert result.state[key].dtype == expected[key].dtype, key
            np.testing.assert_allclose(
                result.state[key].double(), expected[key].double(), atol=TOL, rtol=0, err_msg=key
            )
        # and FedAvg itself is the hand-computed mean
        np.testing.assert_allclose(
            expected["features.conv0.weight"].double(),
            hand_mean([s["features.conv0.weight"] for s in states], weights),
            atol=TOL,
        )


def test_overlapping_classes_rows_are_means_over_holders(three_clients):
    global_classes = ["Atelectasis", "Cardiomegaly"]
    global_state = toy_state(len(global_classes), seed=99)
    result = surgical(global_state, global_classes, three_clients)

    # existing classes first, new ones appended by (client name, position in its list)
    assert result.class_names == ["Atelectasis", "Cardiomegaly", "Edema", "Hernia", "Fracture", "Lung Lesion"]
    assert result.new_classes == ["Edema", "Hernia", "Fracture", "Lung Lesion"]
    submitted = {c.client: rows_by_name(c.state, c.class_names) for c in three_clients}
    global_rows = rows_by_name(result.state, result.class_names)
    for name in result.class_names:
        holders = [client for client, classes in CLIENT_CLASSES.items() if name in classes]
        expected = hand_mean([submitted[client][name] for client in holders])
        np.testing.assert_allclose(global_rows[name], expected, atol=TOL, rtol=0, err_msg=name)
        assert sorted(result.contributors[name]) == sorted(holders)
    # unique classes equal their owner's row exactly
    for name, owner in (("Hernia", "site-a"), ("Fracture", "site-b"), ("Lung Lesion", "site-c")):
        np.testing.assert_allclose(global_rows[name], submitted[owner][name], atol=TOL, rtol=0)
    # backbone: plain mean over all three; the integer buffer is rounded and stays int64
    np.testing.assert_allclose(
        result.state["backbone.conv.weight"].double(),
        hand_mean([c.state["backbone.conv.weight"] for c in three_clients]),
        atol=TOL,
    )
    counter = result.state["backbone.bn.num_batches_tracked"]
    assert counter.dtype == torch.int64
    assert counter.item() == round(np.mean([c.state["backbone.bn.num_batches_tracked"].item() for c in three_clients]))


def test_sample_weighting_weights_rows_and_backbone(three_clients):
    global_state = toy_state(0, seed=5)
    result = surgical(global_state, [], three_clients, weighting="samples")
    counts = {c.client: c.num_samples for c in three_clients}
    submitted = {c.client: rows_by_name(c.state, c.class_names) for c in three_clients}
    global_rows = rows_by_name(result.state, result.class_names)
    holders = ["site-a", "site-b", "site-c"]  # Edema is everywhere
    expected = hand_mean([submitted[c]["Edema"] for c in holders], [counts[c] for c in holders])
    np.testing.assert_allclose(global_rows["Edema"], expected, atol=TOL, rtol=0)
    holders = ["site-a", "site-c"]
    expected = hand_mean([submitted[c]["Cardiomegaly"] for c in holders], [counts[c] for c in holders])
    np.testing.assert_allclose(global_rows["Cardiomegaly"], expected, atol=TOL, rtol=0)
    np.testing.assert_allclose(
        result.state["backbone.bn.running_var"].double(),
        hand_mean([c.state["backbone.bn.running_var"] for c in three_clients], [10, 30, 60]),
        atol=TOL,
    )


def test_class_without_contributor_keeps_previous_row(three_clients):
    global_classes = ["Atelectasis", "Pneumothorax", "Cardiomegaly"]
    global_state = toy_state(3, seed=42)
    result = surgical(global_state, global_classes, three_clients)
    before = rows_by_name(global_state, global_classes)
    after = rows_by_name(result.state, result.class_names)
    assert result.class_names[:3] == global_classes
    np.testing.assert_array_equal(after["Pneumothorax"], before["Pneumothorax"])
    assert "Pneumothorax" not in result.contributors


def test_union_order_does_not_depend_on_arrival_order(three_clients):
    forward = surgical(toy_state(0, 1), [], three_clients)
    backward = surgical(toy_state(0, 1), [], list(reversed(three_clients)))
    assert forward.class_names == backward.class_names
    for key in forward.state:
        np.testing.assert_allclose(forward.state[key].double(), backward.state[key].double(), atol=TOL)
    # a second round keeps the first round's order and appends nothing
    again = surgical(forward.state, forward.class_names, list(reversed(three_clients)))
    assert again.class_names == forward.class_names
    assert again.new_classes == []


def test_fedbn_plus_leaves_batchnorm_exactly_as_it_was(three_clients):
    global_state = toy_state(0, seed=3)
    result = surgical(global_state, [], three_clients, backbone_strategy="fedbn_plus")
    assert batchnorm_keys(global_state) == BN_KEYS
    for key in BN_KEYS:
        assert torch.equal(result.state[key], global_state[key]), key
    np.testing.assert_allclose(
        result.state["backbone.conv.weight"].double(),
        hand_mean([c.state["backbone.conv.weight"] for c in three_clients]),
        atol=TOL,
    )


def test_fedbn_plus_on_densenet_keeps_every_batchnorm_entry():
    classes = ["Atelectasis", "Edema"]
    global_state = NamedDenseNet(classes).state_dict()
    client = NamedDenseNet(classes).state_dict()  # different random init everywhere
    for key, value in client.items():
        if key.endswith("running_mean"):
            value += 1.0
    aggregator = SurgicalAggregator(global_state, classes, backbone_strategy="fedbn_plus")
    aggregator.add(Contribution("site-a", client, classes))
    result = aggregator.finalize()
    bn = batchnorm_keys(global_state)
    assert len(bn) == 121 * 5  # 121 BatchNorm layers x (weight, bias, mean, var, counter)
    assert all(torch.equal(result.state[k], global_state[k]) for k in bn)
    assert torch.equal(result.state["features.conv0.weight"], client["features.conv0.weight"])


def test_slice_has_the_clients_classes_in_its_order(three_clients):
    result = surgical(toy_state(0, 1), [], three_clients)
    global_rows = rows_by_name(result.state, result.class_names)
    for classes in CLIENT_CLASSES.values():
        sliced = slice_for_client(result.state, result.class_names, classes, head=TOY_HEAD)
        assert sliced["head.weight"].shape == (len(classes), 4)
        assert set(sliced) == set(result.state)
        for name, row in rows_by_name(sliced, classes).items():
            np.testing.assert_array_equal(row, global_rows[name])
        assert torch.equal(sliced["backbone.conv.weight"], result.state["backbone.conv.weight"])
    with pytest.raises(KeyError, match="Pneumothorax"):
        slice_for_client(result.state, result.class_names, ["Edema", "Pneumothorax"], head=TOY_HEAD)


def test_slice_matches_aliases_by_name():
    sliced = slice_for_client(
        toy_state(2, 3),
        ["Pleural Effusion", "Mass"],
        ["Mass", "Effusion"],
        head=TOY_HEAD,
        normalize_name=BUILTIN_VOCABULARY.canonical,
    )
    original = rows_by_name(toy_state(2, 3), ["Pleural Effusion", "Mass"])
    np.testing.assert_array_equal(rows_by_name(sliced, ["Mass", "Effusion"])["Effusion"], original["Pleural Effusion"])


@pytest.mark.parametrize(
    ("break_it", "reason"),
    [
        (
            lambda s: s["backbone.conv.weight"].view(-1).__setitem__(0, float("nan")),
            "'backbone.conv.weight' has 1 non-finite",
        ),
        (lambda s: s["head.bias"].__setitem__(0, float("inf")), "'head.bias' has 1 non-finite"),
        (
            lambda s: s.__setitem__("backbone.conv.weight", torch.zeros(4, 1, 5, 5)),
            "has shape (4, 1, 5, 5), expected (4, 1, 3, 3)",
        ),
        (lambda s: s.__setitem__("head.weight", torch.zeros(3, 7)), "expected (3, 4)"),
        (lambda s: s.__setitem__("backbone.extra", torch.zeros(1)), "unknown key"),
        (lambda s: s.pop("backbone.bn.running_var"), "missing 1 key"),
        (lambda s: s.pop("head.bias"), "missing head key 'head.bias'"),
    ],
)
def test_broken_contribution_is_rejected_and_the_rest_aggregate(three_clients, break_it, reason):
    broken = three_clients[1]
    break_it(broken.state)
    aggregator = SurgicalAggregator(toy_state(0, 1), [], head=TOY_HEAD)
    aggregator.add(three_clients[0])
    with pytest.raises(ContributionRejected, match="site-b") as caught:
        aggregator.add(broken)
    assert reason in caught.value.reason
    aggregator.add(three_clients[2])
    result = aggregator.finalize()
    assert result.accepted == ["site-a", "site-c"]
    assert reason in result.rejected["site-b"]
    assert "Fracture" not in result.class_names  # only site-b held it
    np.testing.assert_allclose(
        result.state["backbone.conv.weight"].double(),
        hand_mean([three_clients[0].state["backbone.conv.weight"], three_clients[2].state["backbone.conv.weight"]]),
        atol=TOL,
    )


def test_a_contribution_carries_exactly_the_classes_its_site_declared():
    aggregator = SurgicalAggregator(toy_state(0, 1), [], head=TOY_HEAD, normalize_name=BUILTIN_VOCABULARY.canonical)
    declared = ["Pleural Effusion", "Mass"]
    with pytest.raises(ContributionRejected, match=r"rows for classes it did not declare: \['Fracture'\]"):
        aggregator.add(Contribution("site-a", toy_state(2, 2), ["Mass", "Fracture"], expected_classes=declared))
    with pytest.raises(ContributionRejected, match=r"no rows for its classes \['Pleural Effusion'\]"):
        aggregator.add(Contribution("site-a", toy_state(1, 2), ["Mass"], expected_classes=declared))
    # any order and spelling that canonicalises to the declared classes
    aggregator.add(Contribution("site-a", toy_state(2, 2), ["Mass", "Effusion"], expected_classes=declared))
    assert aggregator.finalize().class_names == ["Mass", "Pleural Effusion"]


@pytest.mark.parametrize(
    ("state", "names", "reason"),
    [
        ([1, 2], ["Mass"], "its weights are a list, not named arrays"),
        (None, ["Mass"], "its weights are a NoneType, not named arrays"),
        ("weights", ["Mass"], "its weights are a str, not named arrays"),
        ({}, "Mass", "its class names are not a list of names: 'Mass'"),
        ({}, [3], "its class names are not a list of names: [3]"),
        ({}, 7, "its class names are not a list of names: 7"),
    ],
)
def test_a_contribution_of_the_wrong_types_is_rejected_not_raised(state, names, reason):
    aggregator = SurgicalAggregator(toy_state(0, 1), [], head=TOY_HEAD)
    with pytest.raises(ContributionRejected) as caught:
        aggregator.add(Contribution("site-a", toy_state(1, 2) if state == {} else state, names))
    assert caught.value.reason == reason and aggregator.rejected == {"site-a": reason}


def test_duplicate_and_unaccepted_class_names_are_rejected():
    closed = Vocabulary(accepted=["Effusion", "Mass"])  # a job's closed vocabulary
    aggregator = SurgicalAggregator(toy_state(0, 1), [], head=TOY_HEAD, normalize_name=closed.canonical)
    with pytest.raises(ContributionRejected, match="duplicate class names \\['Pleural Effusion'\\]"):
        aggregator.add(Contribution("site-x", toy_state(2, 2), ["Effusion", "Pleural Effusion"]))
    with pytest.raises(ContributionRejected, match=r"class 'Efusion' .* is not one of the job's accepted classes"):
        aggregator.add(Contribution("site-y", toy_state(2, 2), ["Efusion", "Mass"]))
    with pytest.raises(ContributionRejected, match="positive sample count"):
        SurgicalAggregator(toy_state(0, 1), [], weighting="samples", head=TOY_HEAD).add(
            Contribution("site-z", toy_state(1, 2), ["Mass"], num_samples=0)
        )
    aggregator.add(Contribution("site-ok", toy_state(1, 3), ["Effusion"]))
    with pytest.raises(ContributionRejected, match="already contributed"):
        aggregator.add(Contribution("site-ok", toy_state(1, 3), ["Effusion"]))
    result = aggregator.finalize()
    assert result.class_names == ["Pleural Effusion"]
    assert result.accepted == ["site-ok"]
    assert set(result.rejected) == {"site-x", "site-y", "site-ok"}  # site-ok's second attempt


def test_aliases_from_different_clients_are_one_class():
    a, b = toy_state(1, 1), toy_state(1, 2)
    result = surgical(
        toy_state(0, 0),
        [],
        [Contribution("site-nih", a, ["Effusion"]), Contribution("site-chexpert", b, ["Pleural Effusion"])],
        normalize_name=BUILTIN_VOCABULARY.canonical,
    )
    assert result.class_names == ["Pleural Effusion"]
    expected = hand_mean([rows_by_name(a, ["x"])["x"], rows_by_name(b, ["x"])["x"]])
    np.testing.assert_allclose(rows_by_name(result.state, ["x"])["x"], expected, atol=TOL)


def test_without_accepted_contributions_the_global_model_is_unchanged():
    global_state = toy_state(2, 11)
    result = SurgicalAggregator(global_state, ["Mass", "Nodule"], head=TOY_HEAD).finalize()
    assert not result.updated
    for key in global_state:
        assert torch.equal(result.state[key], global_state[key])


def test_numpy_contributions_give_numpy_results_of_the_same_dtypes():
    states = [{k: v.numpy() for k, v in toy_state(2, seed).items()} for seed in (1, 2)]
    result = surgical(
        states[0], ["Mass", "Nodule"], [Contribution(f"s{i}", s, ["Nodule", "Mass"]) for i, s in enumerate(states)]
    )
    assert isinstance(result.state["head.weight"], np.ndarray)
    assert result.state["head.weight"].dtype == np.float32
    assert result.state["backbone.bn.num_batches_tracked"].dtype == np.int64
    # both clients list Nodule first; the global head lists Mass first
    expected_mass = hand_mean([np.append(s["head.weight"][1], s["head.bias"][1]) for s in states])
    np.testing.assert_allclose(rows_by_name(result.state, result.class_names)["Mass"], expected_mass, atol=TOL)


def test_identical_class_sets_reject_a_mismatched_head_and_keep_the_others():
    classes = ["Mass", "Edema", "Hernia"]
    aggregator = SurgicalAggregator(toy_state(3, 0), classes, head=TOY_HEAD)
    aggregator.add(Contribution("a", toy_state(3, 1), classes))
    with pytest.raises(ContributionRejected, match=r"'head.weight' has shape \(2, 4\), expected \(3, 4\)"):
        aggregator.add(Contribution("b", toy_state(2, 2), classes))
    result = aggregator.finalize()
    assert torch.equal(result.state["head.weight"], toy_state(3, 1)["head.weight"])


def test_initial_head_rows_depend_only_on_the_class_name():
    from surgical_aggregation.core.head import extend_head, initial_head_rows

    weight, bias = initial_head_rows(["Mass", "Edema"], 16, seed=3)
    alone_weight, alone_bias = initial_head_rows(["Edema"], 16, seed=3)
    np.testing.assert_array_equal(weight[1], alone_weight[0])
    assert bias[1] == alone_bias[0]
    assert np.abs(weight).max() <= 1 / np.sqrt(16)  # torch.nn.Linear's default range
    assert not np.array_equal(initial_head_rows(["Edema"], 16, seed=4)[0], alone_weight)

    state = toy_state(2, 5)
    extended, names = extend_head(state, ["Mass", "Nodule"], ["Nodule", "Edema", "Edema"], head=TOY_HEAD)
    assert names == ["Mass", "Nodule", "Edema"]
    assert torch.equal(extended["head.weight"][:2], state["head.weight"])  # existing rows untouched
    np.testing.assert_array_equal(extended["head.weight"][2].numpy(), initial_head_rows(["Edema"], 4)[0][0])
    assert extended["head.bias"].shape == (3,)


def test_a_value_check_registered_in_a_module_of_its_own_rejects_results(monkeypatch, tmp_path):
    """docs/library.md's recipe for a new check of a result's values: a module with the decorated function and its
    line in ``CHECK_MODULES``; nothing imports it, yet ``check_result`` runs it."""
    from surgical_aggregation.core import checks

    (tmp_path / "no_huge_bias.py").write_text(
        "from surgical_aggregation.core.checks import server_check\n\n"
        "@server_check('result', 'no head bias above 100', 'head.bias above 100', on_values=True)\n"
        "def huge_bias_problems(state, layout):\n"
        "    return ['head.bias above 100'] if float(state['head.bias'].abs().max()) > 100 else []\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(checks, "CHECKS", list(checks.CHECKS))
    monkeypatch.setattr(checks, "VALUE_CHECKS", list(checks.VALUE_CHECKS))
    monkeypatch.setattr(checks, "CHECK_MODULES", (*checks.CHECK_MODULES, "no_huge_bias"))
    monkeypatch.delitem(__import__("sys").modules, "no_huge_bias", raising=False)
    state = toy_state(1, 2)
    state["head.bias"][0] = 1000.0
    aggregator = SurgicalAggregator(toy_state(0, 1), [], head=TOY_HEAD)
    with pytest.raises(ContributionRejected) as caught:
        aggregator.add(Contribution("site-a", state, ["Mass"]))
    assert caught.value.reason == "head.bias above 100"
    aggregator.add(Contribution("site-b", toy_state(1, 2), ["Mass"]))
    assert aggregator.finalize().accepted == ["site-b"]
    assert [check.name for check in checks.registered_checks()].count("huge_bias_problems") == 1
