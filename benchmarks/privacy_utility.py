"""Utility against privacy: the main job with DP-SGD at every site, at epsilon 1, 3 and 8 per site and without.

    python benchmarks/privacy_utility.py --out docs/privacy-utility [--cache DIR]

The main job (``jobs/nih_chexpert``: its sites, rounds, seed and embedded data) with FedBN+ from the offline
pretrained stand-in (``surgical-aggregation pretrain``), because DP-SGD needs BatchNorm that does not learn from
batch statistics; "none" is the same federation without DP-SGD. Each site's budget is spread over the job's
rounds (``planned_rounds``), delta 1e-5, per-image clipping at 1.0. For each: the best global model's mean AUROC
on each site's own classes and test split (with a bootstrap 95% CI), the epsilon each site spent, and the wall
time of the federation. Writes ``summary.md`` (the table) and ``utility.png`` (mean test AUROC and time against
epsilon) in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from surgical_aggregation.evaluation.inference import evaluate_on_table
from surgical_aggregation.experiments.pretraining import Pretraining, pretrained_backbone
from surgical_aggregation.flare.recipe import nih_chexpert_recipe
from surgical_aggregation.flare.simulation import simulate
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.profiles import DEMO
from surgical_aggregation.training.site_data import resolve_table, split_table

EPSILONS = (1.0, 3.0, 8.0, None)  # None: the same federation without DP-SGD
DELTA = 1e-5
BOOTSTRAP = 1000


def federation(epsilon: float | None, pretrained: Path):
    base = nih_chexpert_recipe()
    rounds = base.controller_args["num_rounds"]
    sites = {}
    for site, values in base.site_configs.items():
        values = json.loads(json.dumps(values))
        if epsilon is not None:
            values["differential_privacy"] = {"epsilon": epsilon, "delta": DELTA, "planned_rounds": rounds}
        sites[site] = values
    return nih_chexpert_recipe(
        sites, controller={"backbone_strategy": "fedbn_plus"}, persistor={"pretrained_weights": str(pretrained)}
    )


def run(epsilon: float | None, root: Path, pretrained: Path) -> dict:
    recipe = federation(epsilon, pretrained)
    started = time.perf_counter()
    result = simulate(recipe, root, log_file=root / "simulator.log")
    seconds = time.perf_counter() - started
    history = json.loads(result.history.read_text())
    spent = {}
    for entry in history:
        for site, report in entry.get("aggregation", {}).get("privacy", {}).items():
            spent[site] = report["epsilon"]
    sites = {}
    for site, values in recipe.site_configs.items():
        config = site_config_from_dict(values, f"{recipe.name} {site}")
        test = split_table(resolve_table(config), config)["test"]
        report = evaluate_on_table(result.best_global_model, test, bootstrap=BOOTSTRAP, device="cpu")
        sites[site] = {"mean_auroc": report.mean_auroc.estimate, "low": report.mean_auroc.low,
                       "high": report.mean_auroc.high}  # fmt: skip
    return {"epsilon": epsilon, "seconds": seconds, "spent": spent, "sites": sites}


def write(results: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    sites = sorted(results[0]["sites"])
    command = "python benchmarks/privacy_utility.py --out docs/privacy-utility"
    lines = [
        "# Utility against privacy: DP-SGD at every site",
        "",
        f"Made by `{command}` on a 2-core CPU machine, embedded data, one seed (the job's). The main job with",
        "FedBN+ from the offline pretrained stand-in (DP-SGD needs BatchNorm that does not learn from batch",
        "statistics); every site's budget spread over the job's rounds (`planned_rounds`), delta 1e-5, clipping",
        'at 1.0; "none" is the same federation without DP-SGD. Mean AUROC of the best global model on each',
        "site's own classes and test split (95% bootstrap CI); time is the federation's wall time, and its ratio",
        "to the federation without DP-SGD.",
        "",
        "![mean test AUROC and time against epsilon](utility.png)",
        "",
        "| epsilon per site | "
        + " | ".join(f"{site} mean AUROC" for site in sites)
        + " | epsilon spent | time (s) | time / none |",
        "| --- | " + " | ".join("---" for _ in sites) + " | --- | --- | --- |",
    ]
    baseline = next((result["seconds"] for result in results if result["epsilon"] is None), None)
    for result in results:
        label = "none" if result["epsilon"] is None else f"{result['epsilon']:g}"
        cells = [
            f"{result['sites'][site]['mean_auroc']:.3f} ({result['sites'][site]['low']:.3f}-"
            f"{result['sites'][site]['high']:.3f})"
            for site in sites
        ]
        spent = ", ".join(f"{site} {value:.2f}" for site, value in sorted(result["spent"].items())) or "-"
        ratio = f"{result['seconds'] / baseline:.1f}" if baseline else "-"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {spent} | {result['seconds']:.0f} | {ratio} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")

    labels = ["none" if result["epsilon"] is None else f"{result['epsilon']:g}" for result in results]
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    for site in sites:
        means = [result["sites"][site]["mean_auroc"] for result in results]
        lows = [result["sites"][site]["mean_auroc"] - result["sites"][site]["low"] for result in results]
        highs = [result["sites"][site]["high"] - result["sites"][site]["mean_auroc"] for result in results]
        left.errorbar(labels, means, yerr=[lows, highs], marker="o", capsize=3, label=site)
    left.set_xlabel("epsilon per site")
    left.set_ylabel("mean test AUROC, own classes")
    left.legend()
    right.bar(labels, [result["seconds"] for result in results], color="grey")
    right.set_xlabel("epsilon per site")
    right.set_ylabel("federation wall time (s)")
    figure.suptitle("DP-SGD at every site: utility and cost")
    figure.tight_layout()
    figure.savefig(out / "utility.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cache", type=Path, default=None, help="cache root (embedded data, the stand-in weights)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/privacy-utility"), help="the federations' folder")
    parser.add_argument("--rewrite", action="store_true", help="only rewrite the table and plot from results.json")
    args = parser.parse_args()
    if args.rewrite:
        write(json.loads((args.out / "results.json").read_text()), args.out)
        return
    if args.cache is not None:
        os.environ["SURGICAL_AGGREGATION_CACHE"] = str(args.cache)
    pretrained = pretrained_backbone(DEMO, Pretraining.for_profile(DEMO), args.cache)
    results = []
    for epsilon in EPSILONS:
        name = "none" if epsilon is None else f"eps{epsilon:g}"
        results.append(run(epsilon, args.work / name, pretrained))
        print(json.dumps(results[-1]), flush=True)
    write(results, args.out)


if __name__ == "__main__":
    main()
