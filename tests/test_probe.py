"""The embedded task needs training: a linear read-out of a randomly initialised DenseNet121's features does not solve
the main job's sites (their own data, as the job generates it); without the clutter, the same probe does much better."""

from __future__ import annotations

import pytest

from surgical_aggregation.evaluation.probe import RANDOM_PROBE_CEILING, linear_probe
from surgical_aggregation.flare.recipe import nih_chexpert_recipe
from surgical_aggregation.images import synthetic, synthetic_pixels
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.profiles import SCRATCH

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("site", ["site-nih", "site-chexpert"])
def test_a_random_backbone_does_not_solve_the_main_jobs_sites_at_the_scratch_size(site):
    """At ``--start scratch``'s 400 patients a site (minutes here); the default run's summary holds the probe on the
    default job's 1,500 (tests/test_default_run_doc.py)."""
    config = site_config_from_dict(nih_chexpert_recipe(start=SCRATCH).site_configs[site], site)
    report = linear_probe(config)
    assert report.test_images > 100 and sum(v == v for v in report.per_class_auroc.values()) >= 10
    assert report.mean_auroc <= RANDOM_PROBE_CEILING, report.per_class_auroc


def test_without_the_clutter_the_same_probe_solves_much_of_it(tmp_path, monkeypatch):
    """The probe is not broken: on images without the clutter and with the former glyph strength (the embedded data
    before this benchmark), the same random backbone's features give it far more."""
    monkeypatch.setattr(synthetic_pixels, "CLUTTER_SHAPES", 0)
    monkeypatch.setattr(synthetic_pixels, "FINDING_AMPLITUDE", (0.3, 0.6))
    dataset = synthetic.generate_nih(tmp_path / "plain", n_patients=150, image_size=64)
    values = {**nih_chexpert_recipe(start=SCRATCH).site_configs["site-nih"], "cache_dir": str(tmp_path / "cache")}
    values["data"] = {**values["data"], "location": str(dataset.root)}
    report = linear_probe(site_config_from_dict(values, "plain images"))
    assert report.mean_auroc > RANDOM_PROBE_CEILING + 0.05, report.per_class_auroc
