"""Utility against privacy: the main job with DP-SGD at every site, at epsilon 1, 3 and 8 per patient and without.

    python benchmarks/privacy_utility.py --out docs/privacy-utility [--seeds 0 1 2] [--cache DIR]

The main job (``jobs/nih_chexpert``: its sites, rounds and embedded data) with FedBN+ from the offline pretrained
stand-in (``surgical-aggregation pretrain``), because DP-SGD needs BatchNorm that does not learn from batch
statistics; "none" is the same recipe without DP-SGD. Each site's budget is spread over the job's rounds
(``planned_rounds``), delta 1e-5, per-patient clipping at 1.0. Every epsilon runs once per seed (the sites' and the
initial model's ``seed``; the splits stay the job's); the DP-SGD noise and sampling are drawn from a secure source in
every run, independent of the seed. For each run: the best global model's mean AUROC on each site's own classes
and test split, the epsilon each site spent, and the federation's wall time. Writes ``results.json`` (every run),
``summary.md`` (means across seeds with their 95% t-interval) and ``utility.png`` in ``--out``. Each finished
federation is also kept in ``--work``'s ``results.json``; a run of the command skips those already there (delete
it to start afresh).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from surgical_aggregation.evaluation.inference import evaluate_on_table
from surgical_aggregation.experiments.grid_run import machine
from surgical_aggregation.experiments.pretraining import Pretraining, pretrained_backbone
from surgical_aggregation.experiments.summary import t_interval
from surgical_aggregation.flare.recipe import nih_chexpert_recipe
from surgical_aggregation.flare.simulation import simulate
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.profiles import DEMO, SCRATCH
from surgical_aggregation.training.site_data import resolve_table, split_table

EPSILONS = (1.0, 3.0, 8.0, None)  # None: the same federation without DP-SGD
DELTA = 1e-5


def federation(epsilon: float | None, seed: int, pretrained: Path):
    base = nih_chexpert_recipe(start=SCRATCH)
    rounds = base.controller_args["num_rounds"]
    sites = {}
    for site, values in base.site_configs.items():
        values = json.loads(json.dumps(values))
        values["seed"] = seed
        if epsilon is not None:
            values["differential_privacy"] = {
                "epsilon": epsilon, "delta": DELTA, "planned_rounds": rounds, "unit": "patient"
            }  # fmt: skip
        sites[site] = values
    return nih_chexpert_recipe(
        sites,
        controller={"backbone_strategy": "fedbn_plus"},
        persistor={"pretrained_weights": str(pretrained), "seed": seed},
    )


def run(epsilon: float | None, seed: int, root: Path, pretrained: Path) -> dict:
    recipe = federation(epsilon, seed, pretrained)
    started = time.perf_counter()
    result = simulate(recipe, root, log_file=root / "simulator.log")
    seconds = time.perf_counter() - started
    history = json.loads(result.history.read_text())
    spent = {}
    for entry in history:
        for site, report in entry.get("aggregation", {}).get("privacy", {}).items():
            spent[site] = report["epsilon"]
    sites, intervals = test_scores(recipe, result.best_global_model)
    return {"epsilon": epsilon, "seed": seed, "seconds": seconds, "spent": spent, "mean_auroc": sites,
            "test_interval": intervals, "stand_in": pretrained.stem, "machine": machine()}  # fmt: skip


def test_scores(recipe, model: Path) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Each site's mean AUROC of ``model`` on its test split, and its 95% bootstrap interval over the split's images
    (what one test split's sampling leaves uncertain; the table's interval is across seeds)."""
    sites, intervals = {}, {}
    for site, values in recipe.site_configs.items():
        config = site_config_from_dict(values, f"{recipe.name} {site}")
        test = split_table(resolve_table(config), config)["test"]
        report = evaluate_on_table(model, test, bootstrap=200, device="cpu")
        sites[site] = report.mean_auroc.estimate
        intervals[site] = [report.mean_auroc.low, report.mean_auroc.high]
    return sites, intervals


def chance_verdict(cell: dict) -> str:
    """ "below" when every seed's test interval (or, without them, the seeds' interval) lies under 0.5; "above" when
    the seeds' interval lies over 0.5 and not every seed's test interval holds it; "chance" otherwise (a seeds'
    interval under 0.5 is not "below": the seeds share one test split, whose sampling it leaves out)."""
    tests = cell["test_intervals"]
    if all(high < 0.5 for _, high in tests) if tests else cell["high"] < 0.5:
        return "below"
    if cell["low"] > 0.5 and not (tests and all(low <= 0.5 <= high for low, high in tests)):
        return "above"
    return "chance"


def _label(epsilon: float | None) -> str:
    return "none" if epsilon is None else f"{epsilon:g}"


def summarize(results: list[dict]) -> list[dict]:
    """Per epsilon (in EPSILONS' order): each site's mean AUROC over seeds with its 95% t-interval, the most epsilon
    any run of a site spent, and the mean wall time."""
    rows = []
    for epsilon in EPSILONS:
        runs = [result for result in results if result["epsilon"] == epsilon]
        if not runs:
            continue
        sites = {}
        for site in sorted(runs[0]["mean_auroc"]):
            values = np.array([result["mean_auroc"][site] for result in runs])
            low, high = t_interval(values)
            tests = [result["test_interval"][site] for result in runs if "test_interval" in result]
            sites[site] = {"mean": float(values.mean()), "low": low, "high": high, "seeds": values.tolist(),
                           "test_intervals": tests}  # fmt: skip
        spent = {site: max(result["spent"].get(site, 0.0) for result in runs) for site in sorted(runs[0]["spent"])}
        seconds = float(np.mean([result["seconds"] for result in runs]))
        rows.append({"epsilon": epsilon, "seeds": [r["seed"] for r in runs], "sites": sites, "spent": spent,
                     "seconds": seconds})  # fmt: skip
    return rows


# results from before the stand-in was recorded: all of them came from the first one (24 4x4 patterns)
UNRECORDED_STAND_IN = "the first stand-in (24 4x4 patterns, before commit 949faf6; its runs did not record it)"
UNRECORDED_MACHINE = "a machine its runs did not record"


def write(results: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = summarize(results)
    sites = sorted(rows[0]["sites"])
    seeds = " ".join(str(seed) for seed in rows[0]["seeds"])
    command = f"python benchmarks/privacy_utility.py --out docs/privacy-utility --seeds {seeds}"
    stand_ins = sorted({result.get("stand_in", UNRECORDED_STAND_IN) for result in results})
    machines = sorted({result.get("machine", UNRECORDED_MACHINE) for result in results})
    lines = [
        "# Utility against privacy: DP-SGD at every site",
        "",
        f"Made by `{command}` on {' and '.join(machines)}, embedded data (the falsifiable benchmark of",
        "docs/benchmark needs a GPU for DP-SGD over the full network, and is not used here). The main job with",
        "FedBN+ from the offline pretrained stand-in (DP-SGD needs BatchNorm that does not learn from batch",
        "statistics); every site's budget spread over the job's rounds (`planned_rounds`), delta 1e-5, **per",
        "patient** (Poisson sampling of patients, one image of each sampled patient per step), clipping at 1.0.",
        '"none" is the same recipe without DP-SGD (FedBN+ from the stand-in, 400 patients a site: not the README\'s',
        "default run, which trains 1,500 at the papers' rates). Each epsilon ran once per seed (model initialisation",
        "and shuffling; the patient splits are the job's), with DP-SGD noise and sampling drawn from a secure source",
        "that no seed reaches. Mean AUROC of the best global model on each site's own classes and test split:",
        "the mean over seeds, its 95% t-interval across seeds, and each seed's value; time is the mean wall time",
        "of a federation, and its ratio to the one without DP-SGD. Every DP site starts its classes' output biases",
        "at the logit of a public prior prevalence (`prior_prevalence`, 0.05): without it the DP federations ranked",
        "below chance while their validation loss fell (this benchmark at commit 5b35c5c, whose results were not",
        "kept; `dp_ablation.json` beside this page measures the prior's part at one site). Why the prior matters is a",
        'reading no run measured: under noise only the gradient\'s "lower every output" part may come through, and',
        "through the weights on non-negative features it lowers the positives' outputs most (provisioning/README.md).",
        "",
        f"Stand-in: {', '.join(stand_ins)}.",
        "",
        "![mean test AUROC and time against epsilon](utility.png)",
        "",
        "| epsilon per patient | "
        + " | ".join(f"{site} mean AUROC (seeds)" for site in sites)
        + " | most epsilon spent | time (s) | time / none |",
        "| --- | " + " | ".join("---" for _ in sites) + " | --- | --- | --- |",
    ]
    baseline = next((row["seconds"] for row in rows if row["epsilon"] is None), None)
    for row in rows:
        cells = [
            f"{row['sites'][site]['mean']:.3f} ({row['sites'][site]['low']:.3f}-{row['sites'][site]['high']:.3f}; "
            + ", ".join(f"{value:.3f}" for value in row["sites"][site]["seeds"])
            + ")"
            for site in sites
        ]
        spent = ", ".join(f"{site} {value:.2f}" for site, value in row["spent"].items()) or "-"
        ratio = f"{row['seconds'] / baseline:.1f}" if baseline else "-"
        lines.append(
            f"| {_label(row['epsilon'])} | " + " | ".join(cells) + f" | {spent} | {row['seconds']:.0f} | {ratio} |"
        )
    verdicts = {(row["epsilon"], site): chance_verdict(row["sites"][site]) for row in rows for site in sites}
    chance = [f"{site} at epsilon {_label(epsilon)}" for (epsilon, site), verdict in verdicts.items()
              if epsilon is not None and verdict == "chance"]  # fmt: skip
    below = [f"{site} at epsilon {_label(epsilon)}" for (epsilon, site), verdict in verdicts.items()
             if epsilon is not None and verdict == "below"]  # fmt: skip
    if chance:
        lines += [
            "",
            "**No better than chance**: " + ", ".join(chance) + " (nothing puts it above 0.5: the seeds' 95% "
            "interval holds 0.5 or lies under it, or every seed's 95% bootstrap interval over the test split's "
            "images holds 0.5; the seeds share one test split, so their interval leaves out its sampling, and below "
            "chance is said only where every seed's bootstrap interval lies under 0.5).",
        ]
    if below:
        lines += [
            "",
            "**Read with care: below chance.** " + ", ".join(below) + ": every seed's bootstrap interval over the "
            "test split lies under 0.5. Under DP-SGD this federation's global model ranks the images against their "
            "labels. A model below chance is not what noise costs (noise alone leaves 0.5): these rows do not "
            "measure privacy's price.",
        ]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")

    labels = [_label(row["epsilon"]) for row in rows]
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    for offset, site in zip((-0.08, 0.08), sites, strict=False):
        positions = np.arange(len(rows)) + offset
        means = np.array([row["sites"][site]["mean"] for row in rows])
        lows = means - np.array([row["sites"][site]["low"] for row in rows])
        highs = np.array([row["sites"][site]["high"] for row in rows]) - means
        line = left.errorbar(positions, means, yerr=[lows, highs], marker="o", capsize=3, label=site)
        for position, row in zip(positions, rows, strict=True):
            seeds = row["sites"][site]["seeds"]
            left.scatter([position] * len(seeds), seeds, s=10, color=line[0].get_color(), alpha=0.5)
    left.set_xticks(range(len(rows)), labels)
    left.set_xlabel("epsilon per patient")
    left.set_ylabel("mean test AUROC, own classes")
    left.legend()
    right.bar(labels, [row["seconds"] for row in rows], color="grey")
    right.set_xlabel("epsilon per patient")
    right.set_ylabel("federation wall time (s)")
    figure.suptitle("DP-SGD at every site: utility (mean and 95% CI over seeds, dots: seeds) and cost")
    figure.tight_layout()
    figure.savefig(out / "utility.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cache", type=Path, default=None, help="cache root (embedded data, the stand-in weights)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/privacy-utility"), help="the federations' folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one federation per epsilon and seed")
    parser.add_argument("--rewrite", action="store_true", help="only rewrite the table and plot from results.json")
    args = parser.parse_args()
    if args.rewrite:
        write(json.loads((args.out / "results.json").read_text()), args.out)
        return
    if args.cache is not None:
        os.environ["SURGICAL_AGGREGATION_CACHE"] = str(args.cache)
    pretrained = pretrained_backbone(Pretraining.for_profile(DEMO), args.cache)
    done = args.work / "results.json"  # each finished federation, so that a stopped run goes on where it was
    earlier = json.loads(done.read_text()) if done.is_file() else []
    # a federation from another stand-in (an earlier pretraining) is another experiment: run again
    finished = {(r["epsilon"], r["seed"]): r for r in earlier if r.get("stand_in") == pretrained.stem}
    for seed in args.seeds:
        for epsilon in EPSILONS:
            if (epsilon, seed) in finished:
                continue
            finished[(epsilon, seed)] = run(epsilon, seed, args.work / f"{_label(epsilon)}-seed{seed}", pretrained)
            print(json.dumps(finished[(epsilon, seed)]), flush=True)
            done.write_text(json.dumps(list(finished.values()), indent=1))
    write([finished[(epsilon, seed)] for seed in args.seeds for epsilon in EPSILONS], args.out)


if __name__ == "__main__":
    main()
