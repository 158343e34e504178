"""SiteTrainer: global slices loaded by name, warm-up once, FedBN+, foreign models, persistence."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from surgical_aggregation.core import judging
from surgical_aggregation.core.head import NAMED_HEAD, slice_for_client
from surgical_aggregation.core.methods import SiteMethod
from surgical_aggregation.flare.audit import EXCHANGES_DIR, SiteAudit, exchange_file_name, read_audit
from surgical_aggregation.images.model import NamedDenseNet
from surgical_aggregation.images.names import SMOKE_DENSENET
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.site_data import prepare_site_data
from surgical_aggregation.training.trainer import SiteTrainer, evaluation_metrics

W, B = NAMED_HEAD.keys


@pytest.fixture(scope="module")
def trainer(nih_data, tmp_path_factory):
    config = site_config_from_dict(
        {
            "data": {
                "kind": "nih",
                "location": str(nih_data.root),
                "labels": ["Mass", "Effusion", "Atelectasis", "Hernia"],
            },
            "image_size": 32,
            "batch_size": 8,
            "max_batches_per_epoch": 2,
            "warmup_epochs": 1,
            "learning_rate": 1e-3,
            "cache_dir": str(tmp_path_factory.mktemp("cache")),
            "cpu_threads": 2,
            "network": SMOKE_DENSENET,
        }
    )
    return SiteTrainer(config, prepare_site_data(config), "site-test")


def _union_model(seed: int) -> tuple[dict, list[str]]:
    torch.manual_seed(seed)
    classes = ["Fracture", "Pleural Effusion", "Hernia", "Edema", "Atelectasis", "Mass"]
    return NamedDenseNet(classes, network=SMOKE_DENSENET).state_dict(), classes


def test_global_rows_are_loaded_by_name(trainer):
    state, classes = _union_model(1)
    assert trainer.class_names == ["Mass", "Pleural Effusion", "Atelectasis", "Hernia"]
    trainer.load_global(state, classes)
    local = trainer.model.state_dict()
    for row, name in enumerate(trainer.class_names):
        assert torch.equal(local[W][row], state[W][classes.index(name)])
        assert torch.equal(local[B][row], state[B][classes.index(name)])
    assert torch.equal(local["features.conv0.weight"], state["features.conv0.weight"])
    with pytest.raises(ValueError, match=r"no head rows for this site's classes \['Mass'\]"):
        trainer.load_global(*_slice_without_mass(state, classes))


def _slice_without_mass(state, classes):
    kept = [name for name in classes if name != "Mass"]
    return slice_for_client(state, classes, kept), kept


def test_foreign_model_is_evaluated_on_shared_classes_by_name(trainer):
    state, classes = _union_model(2)
    trainer.load_global(state, classes)
    own = trainer.validate()
    shuffled = trainer.class_names[::-1]
    via_state = trainer.evaluate_state(slice_for_client(state, classes, shuffled), shuffled)
    for name in trainer.class_names:
        np.testing.assert_equal(via_state.per_class_auroc[name], own.per_class_auroc[name])
    assert via_state.loss == pytest.approx(own.loss, abs=1e-9)
    partial = ["Hernia", "Fracture", "Mass"]  # Fracture is not this site's: ignored
    evaluation = trainer.evaluate_state(slice_for_client(state, classes, partial), partial)
    assert list(evaluation.per_class_auroc) == ["Mass", "Hernia"]  # the site's order
    np.testing.assert_equal(evaluation.per_class_auroc["Mass"], own.per_class_auroc["Mass"])
    with pytest.raises(ValueError, match="share none"):
        trainer.evaluate_state(slice_for_client(state, classes, ["Fracture"]), ["Fracture"])


def test_warm_up_happens_when_the_server_asks(trainer):
    first = trainer.fit(0, warmup=True)
    assert len(first.warmup_losses) == 1 and len(first.train_losses) == 1
    second = trainer.fit(1, warmup=False)  # the server asks once per site (tests/test_controller.py)
    assert second.warmup_losses == [] and len(second.train_losses) == 1
    assert first.samples == 16  # 2 batches of 8


def test_fedbn_plus_keeps_batchnorm_fixed_during_local_training(trainer):
    # FedBN+ refuses BatchNorm at its defaults: learn statistics first (the module's fixture may be fresh, as when
    # pytest-xdist hands this test to a worker that ran no other test of the module)
    trainer.set_method(SiteMethod())
    trainer.fit(1, warmup=False)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.set_method(SiteMethod(backbone_strategy="fedbn_plus"))
    trainer.fit(2, warmup=False)
    after = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    bn = [k for k in after if ".norm" in k]
    assert len(bn) == 21 * 5  # the smoke network's 21 BatchNorm layers, 5 entries each
    assert all(torch.equal(before[k], after[k]) for k in bn)
    assert not torch.equal(before["features.conv0.weight"], after["features.conv0.weight"])
    trainer.set_method(SiteMethod())
    trainer.fit(3, warmup=False)
    assert not torch.equal(
        after["features.norm0.running_mean"], trainer.model.state_dict()["features.norm0.running_mean"]
    )


def test_local_model_survives_a_process_restart(trainer, tmp_path):
    trainer.save(tmp_path / "local.pt")
    fresh = SiteTrainer(trainer.config, trainer.data, "site-test")
    assert fresh.restore(tmp_path / "local.pt")
    assert fresh.epochs_done == trainer.epochs_done
    for key, value in trainer.model.state_dict().items():
        assert torch.equal(fresh.model.state_dict()[key].cpu(), value.cpu())
    assert not fresh.restore(tmp_path / "missing.pt")


def test_metrics_and_exchange_records(trainer, tmp_path):
    metrics = evaluation_metrics(trainer.validate(), "val")
    assert set(metrics) >= {"val_loss", "val_mean_auroc"}
    assert all(key.startswith("val_") for key in metrics)
    audit = SiteAudit(tmp_path, "head")
    audit.record("train", 4, "sent", trainer.class_names, trainer.state_dict(), metrics)
    saved = torch.load(tmp_path / EXCHANGES_DIR / exchange_file_name("train", 4, "sent"), weights_only=True)
    assert saved["class_names"] == trainer.class_names and set(saved["state"]) == {W, B}
    assert torch.equal(saved["state"][W], trainer.state_dict()[W])
    [entry] = read_audit(tmp_path)
    assert (entry["task"], entry["round"], entry["direction"]) == ("train", 4, "sent")
    assert entry["class_names"] == trainer.class_names and entry["head_shapes"][W] == [4, 32]
    assert entry["metrics"] == sorted(metrics) and entry["entries"] == len(trainer.state_dict())
    SiteAudit(tmp_path / "off", "off").record("train", 0, "sent", trainer.class_names, trainer.state_dict())
    assert not (tmp_path / "off" / EXCHANGES_DIR).exists() and len(read_audit(tmp_path / "off")) == 1


def test_epochs_are_reproducible_across_restarts_and_differ_from_each_other(trainer):
    def first_batch(epochs_done: int) -> torch.Tensor:
        trainer.epochs_done = epochs_done
        trainer._reseed()
        return next(iter(trainer.train_loader))["image"]

    assert torch.equal(first_batch(5), first_batch(5))  # what a restarted process would see
    assert not torch.equal(first_batch(5), first_batch(6))


def test_a_candidate_whose_batchnorm_variances_were_inflated_reads_far_from_the_site_images(trainer):
    """The site's paired BatchNorm figure (``val_batchnorm_minus_own``): 0 to the digit for its own model sent back,
    past the two-site bound for the same model with every running variance multiplied by 10 (the suite's
    ``bn_inflate``), and past it for one layer's running means moved (an attacker who read the docs and left the
    variances alone)."""
    state, classes = _union_model(3)
    trainer.load_global(state, classes)
    own = trainer.validate()
    assert own.batchnorm_divergences is not None and own.batchnorm_divergences.shape == (
        sum(key.endswith(".running_var") for key in state),
    )
    same = trainer.evaluate_state(state, classes)
    assert same.compared_with(own)["batchnorm"] == pytest.approx(0.0, abs=1e-9)
    inflated = {key: value * 10 if key.endswith(".running_var") else value for key, value in state.items()}
    assert trainer.evaluate_state(inflated, classes).compared_with(own)["batchnorm"] > judging.BATCHNORM_APART
    last = [key for key in state if key.endswith(".running_mean")][-1]
    spread = state[last.replace("running_mean", "running_var")].sqrt()
    moved = {**state, last: state[last] + 3 * spread}
    assert trainer.evaluate_state(moved, classes).compared_with(own)["batchnorm"] > judging.BATCHNORM_APART
