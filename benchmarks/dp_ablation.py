"""Why DP-SGD federations ranked below chance: one site's validation AUROC, round by round, under parts of DP-SGD.

    python benchmarks/dp_ablation.py --noise 0.8 --rounds 3 --out dp_ablation.json

Not a test. ``site-nih`` of the main job (embedded data, FedBN+ from the offline pretrained stand-in, its recipe:
Adam, one head warm-up epoch then one local epoch a round) trains alone, from the same initial model, in each arm:

  no_dp             plain training
  clipping_only     DP-SGD's per-patient clipping and Poisson sampling, its noise replaced by zeros
  noise_only        DP-SGD's noise with every gradient replaced by zeros (what noise alone does to the model)
  dp_sgd_no_prior   DP-SGD, clipping and noise
  dp_sgd            DP-SGD as a site runs it: the same, its output biases starting at the public prior

and prints the mean AUROC on its validation split before training and after each round. Every arm but ``dp_sgd``
starts from the biases as received (the DP arms with the prior's start taken out): the first four say which part
lowers the ranking, the last two whether the prior's start stops it.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from surgical_aggregation.core.head import slice_for_client
from surgical_aggregation.core.methods import SiteMethod
from surgical_aggregation.experiments.pretraining import InitialModel, Pretraining, pretrained_backbone
from surgical_aggregation.flare.recipe import nih_chexpert_recipe
from surgical_aggregation.training import privacy
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.profiles import DEMO, SCRATCH
from surgical_aggregation.training.site_data import prepare_site_data
from surgical_aggregation.training.trainer import SiteTrainer

ARMS = ("no_dp", "clipping_only", "noise_only", "dp_sgd_no_prior", "dp_sgd")
SITE = "site-nih"


def run_arm(arm: str, noise: float, rounds: int, pretrained: Path) -> list[float]:
    recipe = nih_chexpert_recipe(start=SCRATCH)
    values = json.loads(json.dumps(recipe.site_configs[SITE]))
    if arm != "no_dp":
        values["differential_privacy"] = {"epsilon": 100.0, "noise_multiplier": noise}
    config = site_config_from_dict(values, f"{SITE} ({arm})")
    trainer = SiteTrainer(config, prepare_site_data(config), SITE, logging.getLogger(f"ablation.{arm}"))
    trainer.set_method(SiteMethod("surgical", "fedbn_plus"))
    classes = trainer.class_names
    initial = InitialModel(str(pretrained)).state("densenet121", recipe.controller_args["preprocessing"], 0, classes)
    trainer.load_global(slice_for_client(initial, classes, classes), classes)
    secure_noise = privacy.SecureRandom.noise
    start_at_prior = SiteTrainer._start_biases_at_prior
    if arm == "clipping_only":
        privacy.SecureRandom.noise = lambda self, reference, std: torch.zeros_like(reference)
    elif arm == "noise_only":  # the optimizer adds the noise to the clipped sum: take the sum out again
        privacy.SecureRandom.noise = lambda self, reference, std: secure_noise(self, reference, std) - reference
    if arm != "dp_sgd":
        SiteTrainer._start_biases_at_prior = lambda self: None
    try:
        aurocs = [trainer.validate().mean_auroc]
        for round_number in range(rounds):
            trainer.fit(round_number, warmup=round_number == 0)
            aurocs.append(trainer.validate().mean_auroc)
    finally:
        privacy.SecureRandom.noise = secure_noise
        SiteTrainer._start_biases_at_prior = start_at_prior
    return aurocs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noise", type=float, default=0.8, help="the noise multiplier of the DP arms")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    pretrained = pretrained_backbone(Pretraining.for_profile(DEMO))
    results = {}
    for arm in args.arms:
        started = time.perf_counter()
        results[arm] = run_arm(arm, args.noise, args.rounds, pretrained)
        rounds = ", ".join(f"{value:.3f}" for value in results[arm])
        seconds = time.perf_counter() - started
        print(f"{arm:16s} mean validation AUROC before and after each round: {rounds} ({seconds:.0f} s)")
    args.out.write_text(json.dumps({"noise_multiplier": args.noise, "site": SITE, "aurocs": results}, indent=1))


if __name__ == "__main__":
    main()
