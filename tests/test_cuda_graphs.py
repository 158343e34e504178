"""On a GPU the site trainer replays its training step as a CUDA graph (``training.loops.GraphedStep``): the same
training as launching every kernel, round after round (the optimizer restarted in place, the capture's warm-up steps
undone). Runs where CUDA is (the device machine); skipped elsewhere."""

from __future__ import annotations

import pytest
import torch

from surgical_aggregation.core.head import extend_head
from surgical_aggregation.core.methods import SiteMethod
from surgical_aggregation.training.checkpoint import initial_global_state
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.site_data import prepare_site_data
from surgical_aggregation.training.trainer import SiteTrainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def _trainer(tmp_path, graphs: str, backbone: str) -> SiteTrainer:
    config = site_config_from_dict(
        {
            "data": {"kind": "nih", "split_fractions": [0.6, 0.2, 0.2]},
            "embedded": {"patients": 60, "image_size": 32},
            "image_size": 32,
            "batch_size": 8,
            "warmup_epochs": 1,
            "amp": False,  # full precision: the two paths then run the same kernels
            "cuda_graphs": graphs,
            "workers": 0,
            "cache_dir": str(tmp_path),
        }
    )
    trainer = SiteTrainer(config, prepare_site_data(config), f"site-{graphs}")
    trainer.set_method(SiteMethod(backbone_strategy=backbone, identity_batchnorm=True))
    return trainer


@pytest.mark.parametrize("backbone", ["fedavg", "fedbn_plus"])
def test_the_graphed_step_trains_as_the_eager_one_round_after_round(tmp_path, backbone):
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    graphed, eager = _trainer(tmp_path, "auto", backbone), _trainer(tmp_path, "off", backbone)
    state = initial_global_state("densenet121", graphed.preprocessing, seed=3)
    state, classes = extend_head(state, [], graphed.class_names)
    for round_number in range(3):
        for trainer in (graphed, eager):
            trainer.load_global(state, classes)
            report = trainer.fit(round_number, warmup=round_number == 0)
        assert graphed._graphed is not None and eager._graphed is None
        ours, theirs = graphed.state_dict(), eager.state_dict()
        for key in theirs:
            torch.testing.assert_close(ours[key].float(), theirs[key].float(), atol=2e-4, rtol=1e-3, msg=key)
        state = {key: value.clone() for key, value in ours.items()}
    assert report.samples > 0
