"""The modality seam is complete: a modality only this test knows (``toy_tabular``: numeric features read by a small
MLP) is registered for a block and goes through the bundle's code unchanged: its site-config fields, a site's data,
local training, surgical aggregation by class name, the server's model check, model files, evaluate and predict."""

from __future__ import annotations

import pytest

from surgical_aggregation.core.aggregation import Contribution, SurgicalAggregator
from surgical_aggregation.core.checks.model import model_problems
from surgical_aggregation.core.errors import SiteConfigError
from surgical_aggregation.core.head import NAMED_HEAD, extend_head, numpy_state, slice_for_client
from surgical_aggregation.evaluation.inference import evaluate_on_table, score
from surgical_aggregation.modalities.registry import modality_kinds, registered
from surgical_aggregation.training.checkpoint import (
    ARCHITECTURE_KEY,
    PREPROCESSING_KEY,
    initial_global_state,
    load_checkpoint,
    probe_outputs,
    save_checkpoint,
)
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.site_data import prepare_site_data
from surgical_aggregation.training.trainer import SiteTrainer
from toy_tabular import TABULAR, read_rows, write_rows

SITES = {"site-a": ["Mass", "Nodule"], "site-b": ["Nodule", "Edema"]}


def _config(csv, **fields):
    values = {
        "data": {"kind": "toy_table", "location": str(csv), "split_fractions": [0.6, 0.2, 0.2]},
        "hidden_units": 8,  # the modality's own field, flat beside the general ones
        "batch_size": 16,
        "warmup_epochs": 0,
        "local_epochs": 5,
        "learning_rate": 0.03,
        "device": "cpu",
        "workers": 0,
        **fields,
    }
    return site_config_from_dict(values, where=csv.name)


def test_a_modality_only_a_test_knows_trains_aggregates_and_is_scored_by_the_bundles_code(tmp_path):
    csvs = {
        site: write_rows(tmp_path / f"{site}.csv", classes, 150, seed)
        for seed, (site, classes) in enumerate(SITES.items())
    }
    with registered(TABULAR):
        configs = {site: _config(csv) for site, csv in csvs.items()}
        assert configs["site-a"].to_dict()["hidden_units"] == 8 and "image_size" not in configs["site-a"].to_dict()
        with pytest.raises(SiteConfigError, match=r"site-a\.csv: hidden_units must be positive, got 0"):
            _config(csvs["site-a"], hidden_units=0)
        preprocessing = TABULAR.preprocessing(configs["site-a"])
        assert preprocessing == {"features": 6, "hidden_units": 8}

        # the server's side: a fresh model of the modality, the union head grown by name, the model check
        state = initial_global_state(TABULAR.architecture, preprocessing)
        state, union = extend_head(state, [], ["Edema", "Mass", "Nodule"], NAMED_HEAD, seed=0)
        outputs = probe_outputs(TABULAR.architecture, preprocessing)
        assert model_problems(state, union, outputs) == []

        aggregator = SurgicalAggregator(state, union)
        for site, config in configs.items():
            data = prepare_site_data(config)
            assert data.class_names == SITES[site] and len(data.train) == 90
            trainer = SiteTrainer(config, data, site)
            trainer.load_global(slice_for_client(state, union, data.class_names), data.class_names)
            before = trainer.validate().loss
            trainer.fit(0, warmup=False)
            assert trainer.validate().loss < before  # it learns from its features
            trained = numpy_state(trainer.state_dict())
            aggregator.add(Contribution(site, trained, trainer.head_classes, len(data.train)))
        result = aggregator.finalize()
        assert result.class_names == union and result.accepted == ["site-a", "site-b"]
        assert result.contributors == {"Mass": ["site-a"], "Nodule": ["site-a", "site-b"], "Edema": ["site-b"]}
        assert model_problems(result.state, result.class_names, outputs) == []

        meta = {ARCHITECTURE_KEY: TABULAR.architecture, PREPROCESSING_KEY: preprocessing}
        path = save_checkpoint(tmp_path / "global.pt", result.state, result.class_names, **meta)
        assert load_checkpoint(path).build_model().class_names == union
        report = evaluate_on_table(path, read_rows(csvs["site-b"]), bootstrap=20, device="cpu")
        assert report.n_images == 150 and report.noun == "rows" and report.mean_auroc.estimate > 0.75
        assert report.missing_in_model == []
        scores, left_out = score(path, csvs["site-a"], device="cpu")
        assert list(scores.columns) == ["row_id", "status", *union] and left_out == []
        assert scores[union].notna().all().all()
    assert "toy_table" not in modality_kinds()  # registered for the block only
    with pytest.raises(SiteConfigError, match=r"data\.kind must be one of"):
        _config(csvs["site-a"])
