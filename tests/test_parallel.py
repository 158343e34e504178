"""Several processes at one site (``gpus: N``): on a CPU over gloo, two processes train exactly the model one
process trains on the same batches (BatchNorm frozen, as under FedBN+), the helpers leave when the group
closes, and the rows of a batch are dealt without gaps or overlaps."""

from __future__ import annotations

import pytest
import torch

from surgical_aggregation.core.methods import SiteMethod
from surgical_aggregation.images.model import NamedDenseNet
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.parallel import RankGroup, RowShard
from surgical_aggregation.training.site_data import prepare_site_data
from surgical_aggregation.training.trainer import SiteTrainer

pytestmark = pytest.mark.slow
LABELS = ["Mass", "Effusion", "Atelectasis", "Hernia"]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_a_batchs_rows_are_dealt_to_the_ranks_without_gaps_or_overlaps(world):
    for count in range(0, 11):
        slices = [RowShard(rank, world).rows(count) for rank in range(world)]
        rows = [row for part in slices for row in range(count)[part]]
        assert rows == list(range(count))
        sizes = [len(range(count)[part]) for part in slices]
        assert max(sizes) - min(sizes) <= 1


def _trainer(nih_data, cache, gpus: int) -> SiteTrainer:
    config = site_config_from_dict(
        {
            "data": {"kind": "nih", "location": str(nih_data.root), "labels": LABELS},
            "image_size": 32,
            "batch_size": 8,
            "max_batches_per_epoch": 3,
            "warmup_epochs": 1,
            "local_epochs": 1,
            # SGD: an update linear in the gradient, so the comparison measures the split of the batches and
            # not Adam's first step, which turns round-off in near-zero gradients into +-learning_rate
            "optimizer": "sgd",
            "learning_rate": 0.05,
            "warmup_learning_rate": 0.05,
            "device": "cpu",
            "workers": 0,
            "cpu_threads": 1,
            "cache_dir": str(cache),
            "gpus": gpus,
        }
    )
    return SiteTrainer(config, prepare_site_data(config), "site-test")


def test_two_processes_train_the_model_one_process_trains_on_the_same_batches(nih_data, tmp_path):
    torch.manual_seed(5)
    start = NamedDenseNet(["Mass", "Pleural Effusion", "Atelectasis", "Hernia"]).state_dict()
    trained = {}
    for gpus in (1, 2):
        trainer = _trainer(nih_data, tmp_path / "cache", gpus)
        # BatchNorm frozen at its defaults on purpose: what is measured is the split of the batch across processes
        trainer.set_method(SiteMethod(backbone_strategy="fedbn_plus", identity_batchnorm=True))
        trainer.load_global(start, trainer.class_names)
        report = trainer.fit(0, warmup=True)  # head warm-up (backbone frozen), then a training epoch
        helpers = [] if trainer.group is None else list(trainer.group.helpers)
        trained[gpus] = (trainer.state_dict(), report)
        trainer.close()
        assert [helper.wait(timeout=60) for helper in helpers] == [0] * (gpus - 1)  # they left when closed

    (single, single_report), (double, double_report) = trained[1], trained[2]
    assert single_report.samples == double_report.samples == 24  # 3 batches of 8, 4 rows each per process
    assert double_report.warmup_losses == pytest.approx(single_report.warmup_losses, abs=1e-6)
    assert double_report.train_losses == pytest.approx(single_report.train_losses, abs=1e-6)
    moved = max(float((single[key].float() - start[key].float()).abs().max()) for key in start)
    assert moved > 1e-3  # training changed the model, so the comparison below means something
    difference = max(float((single[key].float() - double[key].float()).abs().max()) for key in single)
    assert difference < 1e-5


def test_a_helper_that_cannot_start_is_an_error_at_rank_0_not_a_hang(tmp_path):
    config = {"data": {"kind": "nih", "location": str(tmp_path / "no-such-folder")}, "device": "cpu"}
    spec = {"site": "site-test", "config": config, "aliases": {}}
    with pytest.raises(RuntimeError, match=r"training helper rank 1 \(process \d+\) exited with code 1 before joining"):
        RankGroup.start(2, torch.device("cpu"), spec)


def test_with_batchnorm_trained_two_cpu_processes_train_on_their_own_rows_statistics(nih_data, tmp_path):
    trainer = _trainer(nih_data, tmp_path / "cache", 2)
    trainer.set_method(SiteMethod(backbone_strategy="fedavg"))  # BatchNorm trains: per-rank statistics on a CPU
    before = {key: value.clone() for key, value in trainer.state_dict().items()}
    report = trainer.fit(0, warmup=False)
    after = trainer.state_dict()
    trainer.close()
    assert report.samples == 24 and all(torch.isfinite(torch.tensor(report.train_losses)))
    running_mean = "features.norm0.running_mean"
    assert not torch.equal(before[running_mean], after[running_mean])  # BatchNorm's statistics moved
