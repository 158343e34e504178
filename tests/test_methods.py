"""The comparators through the one controller and the one site trainer: what each method sends,
trains and keeps; psi = 0 equivalence; FedSLD's prior and weights; FedProx; PFL's personal models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from nvflare.app_common.abstract.fl_model import FLModel

from surgical_aggregation.core.head import NAMED_HEAD, batchnorm_keys, slice_for_client
from surgical_aggregation.core.methods import (
    IdentityBatchNormError,
    LabelCounts,
    SiteMethod,
    batchnorm_at_defaults,
    controller_arguments,
    federation_label_prior,
    label_prior_weights,
)
from surgical_aggregation.flare.protocol import (
    META_CLASS_NAMES,
    META_LABEL_COUNTS,
    META_METHOD,
    META_WANT_LABEL_COUNTS,
    TASK_DESCRIBE,
)
from surgical_aggregation.flare.results import PERSONAL_MODELS_DIR
from surgical_aggregation.images.model import NamedDenseNet
from surgical_aggregation.images.names import SMOKE_DENSENET
from surgical_aggregation.training.checkpoint import load_checkpoint
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.loops import masked_bce_with_logits
from surgical_aggregation.training.site_data import prepare_site_data
from surgical_aggregation.training.trainer import SiteTrainer

from fake_sites import FakeSite, Harness, shifted
from helpers import rows_by_name, toy_state

W, B = NAMED_HEAD.keys


class EchoSite(FakeSite):
    """Answers with rows for exactly the classes it received (union heads included) and keeps what it was told."""

    def __init__(self, *args, counts: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.counts = counts or {}
        self.site_methods: list[dict] = []
        self.handshake_meta: dict = {}

    def answer(self, task: str, data: FLModel) -> FLModel | None:
        if task == TASK_DESCRIBE:
            self.handshake_meta = dict(data.meta)
            answer = super().answer(task, data)
            if data.meta.get(META_WANT_LABEL_COUNTS):
                answer.meta[META_LABEL_COUNTS] = self.counts
            return answer
        answer = super().answer(task, data)
        if META_METHOD in (data.meta or {}):
            self.site_methods.append(data.meta[META_METHOD])
            answer.meta[META_CLASS_NAMES] = list(data.meta[META_CLASS_NAMES])
        return answer


def _federation(method: str, tmp_path, classes_a: list[str], classes_b: list[str], **arguments) -> Harness:
    sites = [
        EchoSite("site-a", classes_a, [0.5, 0.4, 0.3], lambda r, p: shifted(p, 0.01 * (1 + r))),
        EchoSite("site-b", classes_b, [0.6, 0.5, 0.4], lambda r, p: shifted(p, -0.03 * (1 + r))),
    ]
    # the methods' aggregation alone: the two toy updates point exactly opposite, which stops a job of two sites
    harness = Harness(
        sites, tmp_path / method, num_rounds=2, method=method, **{"reject_opposed_updates": False, **arguments}
    )
    (tmp_path / method).mkdir()
    harness.run()
    return harness


def test_at_psi_zero_the_three_methods_aggregate_the_same_updates_into_the_same_model(tmp_path):
    classes = ["Mass", "Edema", "Hernia"]
    models = {}
    for method in ("surgical", "vanilla", "partial_loss"):
        harness = _federation(method, tmp_path, classes, classes)
        site_a = harness.sites["site-a"]
        order = classes if method == "surgical" else sorted(classes)  # its own order, or the union's (by name)
        assert [received for received, _ in site_a.received] == [order, order]
        assert site_a.site_methods[0]["method"] == method
        models[method] = harness.saved[-1]
    reference = models["surgical"]
    for method in ("vanilla", "partial_loss"):
        assert models[method].meta[META_CLASS_NAMES] == reference.meta[META_CLASS_NAMES] == sorted(classes)
        for key, value in reference.params.items():
            np.testing.assert_allclose(np.asarray(models[method].params[key]), np.asarray(value), atol=1e-7)
    # and that model is FedAvg by hand: round 1's slice, shifted by +0.02 at one site and -0.06 at the other
    received = harness.sites["site-a"].received[1][1]
    for key, value in received.items():
        expected = value - 0.02 if value.is_floating_point() else value
        np.testing.assert_allclose(np.asarray(models["partial_loss"].params[key]), expected.numpy(), atol=1e-6)


def test_union_head_methods_send_every_site_the_whole_union(tmp_path):
    harness = _federation("vanilla", tmp_path, ["Mass", "Effusion"], ["Pleural Effusion", "Hernia"])
    union = ["Hernia", "Mass", "Pleural Effusion"]  # by name: its order says nothing of who brought what
    for site in harness.sites.values():
        assert [received for received, _ in site.received] == [union, union]
        assert site.received[0][1]["head.weight"].shape == (3, 4)
    # every row is averaged over both sites (plain FedAvg), unlike surgical aggregation
    shifts = {"site-a": 0.02, "site-b": -0.06}
    sent = {
        name: rows_by_name(shifted(harness.sites[name].received[1][1], shift), union) for name, shift in shifts.items()
    }
    result = rows_by_name(harness.saved[-1].params, union)
    for name in union:
        np.testing.assert_allclose(result[name], (sent["site-a"][name] + sent["site-b"][name]) / 2, atol=1e-6)


def test_surgical_sends_only_own_rows_and_personal_keeps_models_per_site(tmp_path):
    surgical = _federation("surgical", tmp_path, ["Mass", "Effusion"], ["Pleural Effusion", "Hernia"])
    assert [received for received, _ in surgical.sites["site-a"].received] == [["Mass", "Effusion"]] * 2
    personal = _federation("personal", tmp_path, ["Mass", "Effusion"], ["Pleural Effusion", "Hernia"])
    folder = tmp_path / "personal" / PERSONAL_MODELS_DIR
    assert sorted(p.name for p in folder.iterdir()) == ["best_site-a.pt", "best_site-b.pt", "site-a.pt", "site-b.pt"]
    latest_a = load_checkpoint(folder / "site-a.pt")
    assert latest_a.class_names == ["Mass", "Pleural Effusion"] and latest_a.meta["site"] == "site-a"
    # site-a's personal model: its own last head rows (sent in round 1), the averaged backbone
    site_a = personal.sites["site-a"]
    own_rows = rows_by_name(shifted(site_a.received[1][1], 0.02), ["Mass", "Pleural Effusion"])
    np.testing.assert_allclose(rows_by_name(latest_a.state, latest_a.class_names)["Mass"], own_rows["Mass"], atol=1e-6)
    global_state = personal.saved[-1].params
    np.testing.assert_allclose(
        latest_a.state["backbone.conv.weight"].numpy(), np.asarray(global_state["backbone.conv.weight"]), atol=1e-7
    )
    # the final validation sent each site its personal model
    assert {tuple(site.classes) for site in personal.sites.values()} == {
        ("Mass", "Effusion"),
        ("Pleural Effusion", "Hernia"),
    }


def test_fedsld_prior_is_computed_from_the_handshake_and_sent_per_site(tmp_path):
    counts_a = {"Mass": [3, 10], "Effusion": [5, 10]}
    counts_b = {"Pleural Effusion": [1, 10], "Hernia": [2, 9]}  # at most the 10 training images each site declares
    sites = [
        EchoSite("site-a", ["Mass", "Effusion"], [0.5, 0.4, 0.3], counts=counts_a),
        EchoSite("site-b", ["Pleural Effusion", "Hernia"], [0.6, 0.5, 0.4], counts=counts_b),
    ]
    harness = Harness(sites, tmp_path, num_rounds=1, label_prior=True, weighting="samples")
    harness.run()
    assert sites[0].handshake_meta[META_WANT_LABEL_COUNTS] is True
    # by hand: Pleural Effusion = (5 + 1) / (10 + 10), Mass = 3/10, Hernia = 2/9
    assert sites[0].site_methods[0]["label_prior"] == pytest.approx({"Mass": 0.3, "Pleural Effusion": 6 / 20})
    assert sites[1].site_methods[0]["label_prior"] == pytest.approx({"Pleural Effusion": 6 / 20, "Hernia": 2 / 9})
    # without FedSLD nothing is asked for and no prior is sent
    plain = [EchoSite("site-a", ["Mass"], [0.5]), EchoSite("site-b", ["Edema"], [0.5])]
    Harness(plain, tmp_path, num_rounds=1).run()
    assert plain[0].handshake_meta[META_WANT_LABEL_COUNTS] is False and plain[0].site_methods[0]["label_prior"] is None


def test_federation_label_prior_by_hand():
    counts = {
        "site-1": {"Mass": LabelCounts(10, 100), "Edema": LabelCounts(0, 100)},
        "site-2": {"Mass": LabelCounts(30, 50)},
        "site-3": {"Edema": LabelCounts(4, 40), "Hernia": LabelCounts(0, 0)},
    }
    assert federation_label_prior(counts) == pytest.approx({"Mass": 40 / 150, "Edema": 4 / 140})
    with pytest.raises(ValueError, match="site 'x', class 'Mass': impossible counts"):
        federation_label_prior({"x": {"Mass": LabelCounts(5, 3)}})


def test_label_prior_weights_by_hand():
    target = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    prior = torch.tensor([0.5, 0.1, float("nan")])
    weights = label_prior_weights(target, mask, prior)
    # class 0: batch rate 1/4 -> positives 0.25/0.5, negatives 0.75/0.5; class 1: rate 1/3 over 3 labelled
    expected_0 = torch.tensor([0.5, 1.5, 1.5, 1.5])
    expected_1 = torch.tensor([(2 / 3) / 0.9, (2 / 3) / 0.9, (1 / 3) / 0.1, (2 / 3) / 0.9])
    torch.testing.assert_close(weights[:, 0], expected_0)
    torch.testing.assert_close(weights[:, 1], expected_1)
    torch.testing.assert_close(weights[:, 2], torch.ones(4))  # no prior: unweighted
    logits = torch.zeros(4, 3)
    weighted = masked_bce_with_logits(logits, target, mask, weights)
    by_hand = (np.log(2) * (weights * mask).sum() / mask.sum()).item()
    assert weighted.item() == pytest.approx(by_hand, rel=1e-6)


def test_comparator_presets():
    assert controller_arguments("surgical") == {
        "method": "surgical",
        "backbone_strategy": "fedavg",
        "weighting": "uniform",
        "clip_updates": False,  # the papers' plain means and selection
        "reject_opposed_updates": False,
        "robust_aggregation": "mean",
        "validation_guard": False,
    }
    assert controller_arguments("fedsld")["weighting"] == "samples"
    assert controller_arguments("pfl_fedbn")["backbone_strategy"] == "fedbn"
    assert controller_arguments("vanilla", "fedbn_plus")["backbone_strategy"] == "fedbn_plus"
    with pytest.raises(ValueError, match="not a federated comparator"):
        controller_arguments("centralized")
    with pytest.raises(ValueError, match="use it with method 'personal'"):
        Harness([], ".", method="surgical", backbone_strategy="fedbn")


# --- the site side ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(nih_data):
    config = site_config_from_dict(
        {
            "data": {"kind": "nih", "location": str(nih_data.root), "labels": ["Mass", "Atelectasis"]},
            "image_size": 32,
            "batch_size": 8,
            "max_batches_per_epoch": 1,
            "warmup_epochs": 0,
            "augment": False,
            "network": SMOKE_DENSENET,
        }
    )
    return config, prepare_site_data(config)


def _global(classes: list[str], seed: int = 1) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return NamedDenseNet(classes, network=SMOKE_DENSENET).state_dict()


def _first_batch(trainer: SiteTrainer) -> dict[str, torch.Tensor]:
    trainer._reseed()
    return next(iter(trainer.train_loader))


def test_site_labels_per_method(site):
    config, data = site
    union = ["Mass", "Hernia", "Atelectasis"]
    batches = {}
    for method in ("surgical", "vanilla", "partial_loss"):
        trainer = SiteTrainer(config, data, "site-test")
        trainer.set_method(SiteMethod(method))
        trainer.load_global(_global(union), union)
        batches[method] = (trainer.head_classes, _first_batch(trainer))
    assert batches["surgical"][0] == ["Mass", "Atelectasis"]
    # the union head: the site's own classes first, in its order, then the others in the server's
    assert batches["vanilla"][0] == batches["partial_loss"][0] == ["Mass", "Atelectasis", "Hernia"]
    own = batches["surgical"][1]
    for method in ("vanilla", "partial_loss"):
        batch = batches[method][1]
        torch.testing.assert_close(batch["image"], own["image"])  # the same images in the same order
        torch.testing.assert_close(batch["label"][:, [0, 1]], own["label"])
        assert (batch["label"][:, 2] == 0).all()  # Hernia: not this site's label
    assert (batches["vanilla"][1]["mask"][:, 2] == 1).all()  # vanilla: a negative
    assert (batches["partial_loss"][1]["mask"][:, 2] == 0).all()  # partial loss: left out of the loss


def test_at_psi_zero_the_site_trains_identically_under_the_three_methods(site):
    config, data = site
    classes = ["Mass", "Atelectasis"]
    states = {}
    for method in ("surgical", "vanilla", "partial_loss"):
        trainer = SiteTrainer(config, data, "site-test")
        trainer.set_method(SiteMethod(method))
        trainer.load_global(_global(classes), classes)
        trainer.fit(0, warmup=False)
        states[method] = trainer.state_dict()
    for method in ("vanilla", "partial_loss"):
        for key, value in states["surgical"].items():
            torch.testing.assert_close(states[method][key], value, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_personal_recipes_keep_the_head_and_fedbn_keeps_batchnorm(site):
    config, data = site
    classes = ["Mass", "Atelectasis"]
    trainer = SiteTrainer(config, data, "site-test")
    trainer.set_method(SiteMethod("personal", backbone_strategy="fedbn"))
    trainer.load_global(_global(classes, seed=1), classes)  # first load: everything taken
    trainer.fit(0, warmup=False)
    local = trainer.state_dict()
    incoming = _global(classes, seed=2)
    trainer.load_global(incoming, classes)
    after = trainer.state_dict()
    bn = batchnorm_keys(after)
    for key in after:
        expected = local[key] if key in bn or key in (W, B) else incoming[key]
        assert torch.equal(after[key], expected), key
    trainer.set_method(SiteMethod("surgical"))
    trainer.load_global(incoming, classes)
    assert all(torch.equal(trainer.state_dict()[key], incoming[key]) for key in incoming)


def test_fedprox_penalty_pulls_towards_the_received_model(site):
    config, data = site
    trainer = SiteTrainer(config, data, "site-test")
    trainer.set_method(SiteMethod("vanilla", proximal_mu=0.5))
    classes = ["Mass", "Atelectasis"]
    trainer.load_global(_global(classes), classes)
    penalty = trainer._proximal_term()
    assert penalty().item() == 0.0
    with torch.no_grad():
        trainer.model.class_layers.out.bias.add_(torch.tensor([1.0, 2.0]))
    assert penalty().item() == pytest.approx(0.5 * 0.5 * (1 + 4))
    with pytest.raises(ValueError, match="proximal_mu must not be negative"):
        SiteMethod(proximal_mu=-1)


def test_a_union_model_is_validated_on_the_site_own_classes(site):
    config, data = site
    union = ["Mass", "Hernia", "Atelectasis"]
    state = _global(union)
    vanilla = SiteTrainer(config, data, "site-test")
    vanilla.set_method(SiteMethod("vanilla"))
    vanilla.load_global(state, union)
    surgical = SiteTrainer(config, data, "site-test")
    surgical.load_global(slice_for_client(state, union, ["Mass", "Atelectasis"]), ["Mass", "Atelectasis"])
    ours, theirs = vanilla.validate(), surgical.validate()
    assert list(ours.per_class_auroc) == ["Mass", "Atelectasis"]
    assert ours.loss == pytest.approx(theirs.loss, abs=1e-6)
    np.testing.assert_allclose(list(ours.per_class_auroc.values()), list(theirs.per_class_auroc.values()))


# --- FedBN+ needs BatchNorm statistics worth freezing --------------------------------------------------------------


def test_fedbn_plus_is_refused_on_a_model_whose_batchnorm_holds_its_defaults(nih_data, tmp_path):
    config = site_config_from_dict(
        {
            "data": {"kind": "nih", "location": str(nih_data.root), "labels": ["Mass", "Hernia"]},
            "image_size": 32,
            "batch_size": 8,
            "max_batches_per_epoch": 1,
            "cache_dir": str(tmp_path),
            "network": SMOKE_DENSENET,
        }
    )
    trainer = SiteTrainer(config, prepare_site_data(config), "site-test")
    assert batchnorm_at_defaults(trainer.model.state_dict())
    trainer.set_method(SiteMethod(backbone_strategy="fedbn_plus"))
    with pytest.raises(IdentityBatchNormError, match=r"site site-test: FedBN\+ .* hold their defaults"):
        trainer.fit(0, warmup=False)
    trainer.set_method(SiteMethod(backbone_strategy="fedbn_plus", identity_batchnorm=True))  # asked for exactly that
    trainer.fit(0, warmup=False)
    assert batchnorm_at_defaults(trainer.model.state_dict())  # frozen: still the defaults
    trainer.set_method(SiteMethod())  # FedAvg: BatchNorm learns statistics ...
    trainer.fit(1, warmup=False)
    assert not batchnorm_at_defaults(trainer.model.state_dict())
    trainer.set_method(SiteMethod(backbone_strategy="fedbn_plus"))  # ... which FedBN+ may then freeze
    trainer.fit(2, warmup=False)


def test_a_fedbn_plus_job_from_default_statistics_is_refused_at_its_start(tmp_path):
    initial = toy_state(0, seed=0)
    initial["backbone.bn.running_mean"].zero_()
    initial["backbone.bn.running_var"].fill_(1.0)
    sites = [FakeSite("site-a", ["Mass"], [0.5]), FakeSite("site-b", ["Edema"], [0.5])]
    with pytest.raises(RuntimeError, match=r"the global model this job starts from: FedBN\+ .* hold their defaults"):
        Harness(sites, tmp_path, initial=(initial, []), num_rounds=1, backbone_strategy="fedbn_plus").run()
    assert all(site.received == [] for site in sites)
    asked = Harness(
        sites,
        tmp_path / "asked",
        initial=(initial, []),
        num_rounds=1,
        backbone_strategy="fedbn_plus",
        identity_batchnorm=True,
    )
    asked.run()
    assert asked.history[1]["aggregation"]["accepted"] == ["site-a", "site-b"]
