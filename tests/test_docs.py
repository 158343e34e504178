"""The documentation's runnable snippet: the main job through its recipe in FLARE's SimEnv, tracked with MLflow,
run as written (with tiny sites), and the MLflow store read back."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

import surgical_aggregation.flare.recipe as recipes
from surgical_aggregation.core.labels import CHEXPERT_LABELS, NIH_LABELS
from surgical_aggregation.training.checkpoint import load_checkpoint

from helpers import load_benchmark, tiny_recipe

pytestmark = pytest.mark.slow
REPOSITORY = Path(__file__).resolve().parents[1]
TESTED = "<!-- tested by tests/test_docs.py"


def snippet_under_test(page: Path) -> str:
    """The python block that follows the page's "tested by tests/test_docs.py" marker."""
    text = page.read_text()
    after = text[text.index(TESTED) :]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def test_the_recipe_snippet_runs_the_main_job_in_simenv_and_mlflow_reads_it_back(tmp_path, monkeypatch):
    snippet = snippet_under_test(REPOSITORY / "docs" / "library.md")
    assert "/tmp/sa-recipe" in snippet and "nih_chexpert_recipe(" in snippet
    bundle_recipe = recipes.nih_chexpert_recipe
    monkeypatch.setattr(
        recipes,
        "nih_chexpert_recipe",
        lambda **options: tiny_recipe(bundle_recipe, tmp_path / "cache", rounds=2, **options),
    )
    exec(compile(snippet.replace("/tmp/sa-recipe", str(tmp_path / "ws")), "docs/library.md", "exec"), {})

    app = tmp_path / "ws" / "nih_chexpert" / "server" / "simulate_job" / "app_server"
    model = load_checkpoint(app / "FL_global_model.pt")
    assert set(model.class_names) == set(NIH_LABELS) | set(CHEXPERT_LABELS)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{app.parent / 'mlflow.db'}")  # FLARE's receiver's default store
    experiment = client.get_experiment_by_name("nih_chexpert")
    runs = client.search_runs([experiment.experiment_id])
    by_site = {run.info.run_name: run for run in runs}
    assert len(runs) == 2 and all(any(site in name for site in ("site-nih", "site-chexpert")) for name in by_site)
    for run in runs:
        for metric in ("global_model/val_loss", "local_model/val_loss", "train/loss"):
            history = client.get_metric_history(run.info.run_id, metric)
            assert sorted(point.step for point in history) == [0, 1], (run.info.run_name, metric)
            assert all(math.isfinite(point.value) for point in history)
        assert client.get_metric_history(run.info.run_id, "train/epoch_loss")  # per epoch, warm-up included


def test_the_attack_suite_table_is_the_one_its_results_give():
    """docs/server-checks.md's attack table, as ``benchmarks/attack_suite.py --table-only --write-doc`` writes it from
    docs/attack-suite/results.json."""
    suite = load_benchmark("attack_suite")
    results = json.loads((REPOSITORY / "docs" / "attack-suite" / "results.json").read_text())
    page = (REPOSITORY / "docs" / "server-checks.md").read_text()
    block = page.split(f"<!-- {suite.MARKER} -->\n", 1)[1].split(f"\n<!-- /{suite.MARKER} -->", 1)[0]
    assert block == "\n".join(suite.table(results))
    verdicts = [line.rsplit("|", 2)[1].strip() for line in block.splitlines()[2:]]
    assert verdicts.count("false alarm") == 0 and verdicts.count("clean") == 9
    # the README's hostile-site paragraph counts the same verdicts
    attacks = len(verdicts) - verdicts.count("clean")
    readme = " ".join((REPOSITORY / "README.md").read_text().split())
    assert (
        f"{attacks} attacks by sites that know these rules, {verdicts.count('holds')} hold, "
        f"{verdicts.count('fails closed')} stop the job, and none breaks through" in readme
    )
    assert verdicts.count("breaks through") == 0 and verdicts.count("fails open") == 0
    assert f"its {verdicts.count('clean')} clean runs raised no alarm" in readme
