"""How finding-specific the main job's best model is, by embedded patients a site and fine-tuning rates. Not a test.

    python benchmarks/stand_in_transfer.py --workspace /tmp/ws-stand-in --patients 1500   # 13 minutes on 2 CPU cores

The main job (``jobs/nih_chexpert``: its two sites, embedded data and rounds, from the offline stand-in with FedBN+;
the stand-in the bundle ships) with ``--patients`` a site and
the given rates (default: the job's). Prints, for each site, its test split's mean AUROC of the best global model and
how finding-specific that model is on the site's validation split (the mean pairwise correlation of its logits, and
the AUROC lost by ranking every finding by one shared score): what chose ``STAND_IN_JOB_PATIENTS`` (issue 49).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from surgical_aggregation.evaluation.inference import evaluate_models, model_specificity
from surgical_aggregation.experiments.pretraining import stand_in_backbone
from surgical_aggregation.flare.recipe import nih_chexpert_recipe
from surgical_aggregation.flare.simulation import simulate
from surgical_aggregation.flare.stopping import stopped_cleanly
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.profiles import PAPERS_FINE_TUNING, STAND_IN_JOB_PATIENTS
from surgical_aggregation.training.site_data import resolve_table, split_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", type=Path, required=True)
    parser.add_argument("--cache", type=Path, default=None, help="cache root (embedded data, the stand-in weights)")
    parser.add_argument(
        "--patients", type=int, default=STAND_IN_JOB_PATIENTS, help="embedded patients a site (default: the job's)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="redraws the embedded data, the patient split and the training (default 0)"
    )
    parser.add_argument("--learning-rate", type=float, default=PAPERS_FINE_TUNING["learning_rate"])
    parser.add_argument("--warmup-learning-rate", type=float, default=PAPERS_FINE_TUNING["warmup_learning_rate"])
    args = parser.parse_args()
    rates = {"learning_rate": args.learning_rate, "warmup_learning_rate": args.warmup_learning_rate}
    job = nih_chexpert_recipe()
    weights = stand_in_backbone(job.persistor_args["preprocessing"], args.cache)  # the job's, built outside FLARE
    sites = {
        site: {
            **values,
            **rates,
            "seed": args.seed,
            "data": {**values["data"], "split_seed": args.seed},
            "embedded": {**values["embedded"], "patients": args.patients, "seed": args.seed},
        }
        for site, values in job.site_configs.items()
    }
    recipe = nih_chexpert_recipe(sites, persistor={"pretrained_weights": str(weights), "seed": args.seed})
    started = time.perf_counter()
    with stopped_cleanly():  # stopped, it ends the simulator's processes it started
        result = simulate(recipe, args.workspace, args.workspace / "simulator.log")
    summary: dict = {
        "stand_in": weights.stem,
        "patients": args.patients,
        "seed": args.seed,
        **rates,
        "seconds": round(time.perf_counter() - started),
    }
    for site, values in recipe.site_configs.items():
        config = site_config_from_dict(values, site)
        splits = split_table(resolve_table(config), config)
        specific = model_specificity(result.best_global_model, splits["val"], cache_dir=config.cache_dir)
        report = evaluate_models([result.best_global_model], splits["test"], cache_dir=config.cache_dir)
        summary[site] = {
            "test_mean_auroc": report.mean_auroc.estimate,
            "logit_correlation": specific.logit_correlation,
            "shared_score_auroc_loss": specific.shared_score_auroc_loss,
        }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
