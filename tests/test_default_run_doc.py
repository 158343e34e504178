"""The README's and docs/results.md's default-run figures are the tables ``benchmarks/default_run.py`` wrote from its
summary (docs/default-run/summary.json): a hand edit, or a summary rewritten without its tables, fails here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from surgical_aggregation.core.labels import MIMIC_LABELS
from surgical_aggregation.flare.recipe import nih_chexpert_recipe
from surgical_aggregation.training.profiles import DEMO, STAND_IN_JOB_PATIENTS

REPOSITORY = Path(__file__).resolve().parents[1]


def _default_run():
    spec = importlib.util.spec_from_file_location("default_run", REPOSITORY / "benchmarks" / "default_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pages_tables_are_the_summarys():
    default_run = _default_run()
    summary = json.loads(default_run.SUMMARY.read_text())
    pages = {"README.md": ("seconds", "validation"), "docs/results.md": ("validation", "test")}
    for page, tables in pages.items():
        text = (REPOSITORY / page).read_text()
        # a page that lost a marker would be left as it is by the rewrite: each table's markers must be there
        assert all(mark.format(table) in text for table in tables for mark in default_run.MARK), page
        assert default_run.replace_tables(text, summary) == text, "run: python benchmarks/default_run.py --tables-only"


def test_the_trained_model_beats_the_random_backbones_and_the_stand_ins_probes_on_every_site():
    """The task needs training (a random backbone's linear read-out stays near chance), and the federation's training
    adds to the stand-in's features it starts from (their linear read-out on the same split)."""
    summary = json.loads(_default_run().SUMMARY.read_text())
    for site, values in summary["test"].items():
        assert values["random_probe"] <= 0.65 and values["margin"] > 0.05, site
        assert values["start_margin"] > 0.02, site
    assert summary["external"]["classes"] == 20
    results = " ".join((REPOSITORY / "docs" / "results.md").read_text().split())
    assert (
        f"a MIMIC-CXR label file is scored on the {len(MIMIC_LABELS)} findings it labels, the embedded "
        f"MIMIC-layout set on all {summary['external']['classes']}" in results
    )


def test_the_documented_best_model_is_the_one_the_controller_kept():
    """The tables name the round held in the run's best_FL_global_model.pt (benchmarks/default_run.py reads it from the
    file, and refuses a history whose last best flag names another round)."""
    summary = json.loads(_default_run().SUMMARY.read_text())
    best = summary["models"]["best"]
    assert best["round"] == best["model_file_round"]
    readme = (REPOSITORY / "README.md").read_text()
    assert f"| best (round {best['model_file_round']}, " in readme


def test_the_readmes_reading_of_the_specificity_row_is_the_summarys():
    """The sentence under the README's table quotes the run's specificity figures, and says the model scores findings
    apart only while ranking every finding by one shared score would lose at least 0.05 AUROC at every site."""
    specificity = json.loads(_default_run().SUMMARY.read_text())["specificity"]
    sites = sorted(specificity)
    readme = " ".join((REPOSITORY / "README.md").read_text().split())
    correlations = " and ".join(f"{specificity[site]['logit_correlation']:.2f}" for site in sites)
    losses = " and ".join(f"{specificity[site]['shared_score_auroc_loss']:.3f}" for site in sites)
    assert f"one shared score would lose {losses} AUROC, so the best model scores findings apart" in readme
    assert f"scores findings apart (r {correlations})." in readme  # r: the row's mean correlation of the logits
    assert all(specificity[site]["shared_score_auroc_loss"] >= 0.05 for site in sites)
    # finding-specific where the job is judged: site-nih's logits correlate at most 0.5 (0.56 after one warm-up epoch)
    assert specificity["site-nih"]["logit_correlation"] <= 0.5


def test_the_readme_describes_the_job_the_run_ran():
    """The run's summary records the job it trained, which is the main job's recipe as committed; the README gives that
    job's size and start."""
    summary = json.loads(_default_run().SUMMARY.read_text())
    assert summary["job"] == _default_run().job_settings(nih_chexpert_recipe())
    assert summary["initial_model"] == "the offline stand-in for ImageNet weights; FedBN+ backbone"
    readme = " ".join((REPOSITORY / "README.md").read_text().split())
    assert {site["embedded_patients"] for site in summary["job"]["sites"].values()} == {STAND_IN_JOB_PATIENTS}
    assert f"({STAND_IN_JOB_PATIENTS:,} patients each;" in readme
    results = " ".join((REPOSITORY / "docs" / "results.md").read_text().split())
    assert f"on the embedded generated data ({STAND_IN_JOB_PATIENTS:,} patients a site)" in results
    assert "from the stand-in with FedBN+ at the papers' rates" in readme
    assert f"`--start scratch`: a random DenseNet121, FedAvg, {DEMO.embedded_patients} patients" in readme
