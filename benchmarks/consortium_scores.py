"""Why the seven-site consortium job's trained models, from scratch, rank findings below chance on its sites'
validation images. Not a test.

    surgical-aggregation simulate --name cxr_consortium --start scratch --workspace /tmp/ws
    python benchmarks/consortium_scores.py --workspace /tmp/ws/cxr_consortium --out scores.json

(docs/cxr-consortium/scratch/scores.json is that record).

For the job's best and final global models, on each site's validation split as the site reads it (its own site
config from the workspace): the mean AUROC over its classes, and what the scores follow. The head reads DenseNet121's
pooled features, which are non-negative (ReLU) and larger in images that show more glyphs; a head that learns its
classes' low prevalence through its weights before its biases scores every class lower the more the image shows. So,
per site: the correlation of the mean logit with the summed features, of the summed features with the number of
glyphs each image shows (``shown_findings.csv``, labelled or not), and of the mean logit with that number; and the
head's mean weight (its rows start symmetric about 0).

Then the usual remedy, each class's bias started at the log-odds of a prior prevalence (Lin et al., *Focal Loss for
Dense Object Detection*, 2017, with 1 %; here 5 %), tried on each site alone: its own site config from the job's random
start (the recipe's seed), its head rows as the job adds them, their biases as they are or at that prior; the site's
validation AUROC before training, after the head warm-up (the federation's round 0) and after each of two more epochs.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path

import numpy as np
import torch
from specificity_probe import logits_of, shown_counts

from surgical_aggregation.core.head import NAMED_HEAD
from surgical_aggregation.core.methods import SiteMethod
from surgical_aggregation.data.table import PATH_COLUMN
from surgical_aggregation.experiments.pretraining import InitialModel
from surgical_aggregation.flare.simulation import FederationResult
from surgical_aggregation.images.names import ARCHITECTURE
from surgical_aggregation.training.checkpoint import load_checkpoint
from surgical_aggregation.training.config import SiteConfig, site_config_from_dict
from surgical_aggregation.training.loops import head_inputs
from surgical_aggregation.training.site_data import SiteData, prepare_site_data, resolve_table, split_table
from surgical_aggregation.training.trainer import SiteTrainer

PRIOR_PREVALENCE = 0.05  # the remedy's starting probability of every class
ALONE_EPOCHS = 3  # the warm-up, then two epochs


def site_config_file(workspace: Path, site: str) -> Path:
    return workspace / site / "simulate_job" / f"app_{site}" / "config" / "site_configs" / f"{site}.json"


def site_figures(
    federation: FederationResult, config: SiteConfig, data: SiteData, site: str, log: logging.Logger
) -> dict[str, dict[str, float]]:
    """Each model's figures on ``site``'s validation split."""
    frame = split_table(resolve_table(config), config)["val"].frame
    glyphs = shown_counts([str(path) for path in frame[PATH_COLUMN]]).astype(float)
    figures = {}
    models = {"best": federation.best_global_model, "final": federation.final_global_model}
    for name, path in models.items():
        checkpoint = load_checkpoint(path)
        trainer = SiteTrainer(config, data, site, log)
        trainer.set_method(SiteMethod("surgical", checkpoint.meta.get("backbone_strategy", "fedavg")))
        trainer.load_global(checkpoint.state, checkpoint.class_names)
        evaluation = trainer.validate()
        features = head_inputs(trainer.model, trainer.val_loader, trainer.device)[0].numpy().sum(axis=1)
        mean_logit = logits_of(evaluation.scores).mean(axis=1)
        weight = checkpoint.state[NAMED_HEAD.weight_key].float()
        figures[name] = {
            "mean_auroc": evaluation.mean_auroc,
            "mean_logit_vs_features": float(np.corrcoef(mean_logit, features)[0, 1]),
            "features_vs_glyphs": float(np.corrcoef(features, glyphs)[0, 1]),
            "mean_logit_vs_glyphs": float(np.corrcoef(mean_logit, glyphs)[0, 1]),
            "head_weight_mean": float(weight.mean()),
            "head_weight_sd": float(weight.std()),
        }
        log.info("%s, %s model: %s", site, name, json.dumps({k: round(v, 4) for k, v in figures[name].items()}))
    return figures


def alone(config: SiteConfig, data: SiteData, site: str, prior: float | None, log: logging.Logger) -> list[float]:
    """``site`` trained alone from the job's random start, its head's biases as started or at ``prior``'s log-odds:
    its validation AUROC before training and after each epoch (the first is the head warm-up)."""
    trainer = SiteTrainer(config, data, site, log)
    classes = sorted(data.class_names)
    state = InitialModel().state(ARCHITECTURE, trainer.preprocessing, config.seed, classes)
    if prior is not None:
        state[NAMED_HEAD.bias_key] = torch.full_like(state[NAMED_HEAD.bias_key], math.log(prior / (1 - prior)))
    trainer.set_method(SiteMethod("surgical", "fedavg"))
    trainer.load_global(state, classes)
    aurocs = [trainer.validate().mean_auroc]
    for epoch in range(ALONE_EPOCHS):
        trainer.fit(epoch, warmup=epoch == 0)
        aurocs.append(trainer.validate().mean_auroc)
    log.info("%s alone, biases %s: AUROC %s", site, prior or "as started", " ".join(f"{a:.3f}" for a in aurocs))
    return aurocs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", type=Path, required=True, help="the job's workspace (<root>/cxr_consortium)")
    parser.add_argument("--out", type=Path, required=True, help="write every figure here as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    log = logging.getLogger("consortium_scores")
    sites = sorted(path.name for path in args.workspace.glob("site-*") if path.is_dir())
    if not sites:
        raise SystemExit(f"{args.workspace}: no site folder (site-*): run the consortium job there first")
    federation = FederationResult(args.workspace)
    history = json.loads(federation.history.read_text())
    record = {
        "rounds": {str(entry["round"]): entry["validation"]["mean_val_auroc"] for entry in history},
        "sites": {},
        "prior_prevalence": PRIOR_PREVALENCE,
        "alone": {},
    }
    for site in sites:  # each site's data read once, for both parts
        config = site_config_from_dict(json.loads(site_config_file(args.workspace, site).read_text()), site)
        data = prepare_site_data(config, log)
        record["sites"][site] = site_figures(federation, config, data, site, log)
        record["alone"][site] = {
            "as_started": alone(config, data, site, None, log),
            "prior": alone(config, data, site, PRIOR_PREVALENCE, log),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
