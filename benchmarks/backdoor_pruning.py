"""A first look at pruning against the attack suite's backdoor: the pruning half of fine-pruning (Liu, Dolan-Gavitt,
Garg, *Fine-Pruning: Defending Against Backdooring Attacks on Deep Neural Networks*, RAID 2018), not a defence of the
bundle.

For a suite run's best global model, the mean of each of the 1,024 features its head reads (DenseNet121's pooled last
channels) over the test set's clean images, then the head's columns of the least active share of them set to 0 (those
channels pruned), and the test set scored again as the suite scores it: the mean AUROC over the test set's classes and
the backdoor's success (the share of triggered Pneumothorax negatives above the model's own 95th percentile). The
activations are read on the test images themselves, without labels or triggers (a defence would read each site's own
validation images): a first look at whether the trigger lives in channels clean images leave dormant.

    python benchmarks/backdoor_pruning.py --suite-out /work/results/suite72-400p5r \
        --runs backdoor-3sites-1attackers-seed1-400p5r clean-3sites-0attackers-seed1-400p5r \
        --out docs/attack-suite/pruning.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from attack_suite import scores, test_config

from surgical_aggregation.core.head import NAMED_HEAD
from surgical_aggregation.evaluation.inference import scoring_dataset
from surgical_aggregation.experiments.summary import rewrite_marked_block
from surgical_aggregation.training.checkpoint import load_checkpoint, save_checkpoint
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.loops import head_inputs, make_loader
from surgical_aggregation.training.site_data import resolve_table

RATES = (0.0, 0.5, 0.8, 0.9, 0.95)  # shares of the channels pruned
MODEL = "server/simulate_job/app_server/best_FL_global_model.pt"
MARKER = "backdoor-pruning"


def pruned_scores(model_file: Path, test: dict, rates: tuple[float, ...]) -> list[dict[str, float]]:
    """Per pruning rate: the mean test AUROC over the classes with both outcomes, and the backdoor's success."""
    checkpoint = load_checkpoint(model_file)
    config = site_config_from_dict(test, "the attack suite's test set")
    dataset, _ = scoring_dataset([checkpoint], resolve_table(config), cache_dir=config.cache_dir)
    loader = make_loader(dataset, 64, train=False, workers=0)
    features, _, _ = head_inputs(checkpoint.build_model(), loader, torch.device("cpu"))
    dormant_first = np.argsort(features.mean(0).numpy(), kind="stable")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for rate in rates:
            state = dict(checkpoint.state)
            weight = state[NAMED_HEAD.weight_key].clone()
            weight[:, dormant_first[: int(rate * len(dormant_first))]] = 0
            state[NAMED_HEAD.weight_key] = weight
            pruned = save_checkpoint(
                Path(folder) / f"pruned-{rate}.pt", state, checkpoint.class_names, **checkpoint.meta
            )
            found = scores(pruned, test)
            aurocs = [value for value in found["per_class_auroc"].values() if not np.isnan(value)]
            rows.append(
                {"rate": rate, "mean_auroc": float(np.mean(aurocs)), "backdoor_success": found["backdoor_success"]}
            )
            print(f"{model_file.parts[-5]}: pruned {rate:.0%}: {rows[-1]}", flush=True)
    return rows


def table(results: dict[str, list[dict[str, float]]]) -> list[str]:
    """Per pruning rate, the attacked run's (the first of ``results``) and the clean run's (the second) mean test
    AUROC and backdoor success, and how far the attacked model's success lies above the clean model's."""
    attacked, clean = results.values()
    lines = [
        "  | channels pruned | backdoored model: mean AUROC | its backdoor success | clean model: mean AUROC "
        "| its backdoor success | success above the clean model's |",
        "  | --- | --- | --- | --- | --- | --- |",
    ]
    for hit, base in zip(attacked, clean, strict=True):
        above = 100 * (hit["backdoor_success"] - base["backdoor_success"])
        lines.append(
            f"  | {hit['rate']:.0%} | {hit['mean_auroc']:.3f} | {hit['backdoor_success']:.1%} "
            f"| {base['mean_auroc']:.3f} | {base['backdoor_success']:.1%} | {above:+.1f} points |"
        )
    return lines


def offline_parser(description: str, marker: str) -> argparse.ArgumentParser:
    """The arguments every offline look at a suite run's models takes: the suite's folder, a backdoor run and its
    clean run, the results file, and where to write its table."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--suite-out", type=Path, help="an attack_suite.py --out folder")
    parser.add_argument("--runs", nargs="+", help="a backdoor run and its clean run (their workspaces' folders)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file of the results")
    parser.add_argument("--table-only", action="store_true", help="only draw the table of --out")
    parser.add_argument("--write-doc", type=Path, help=f"rewrite the table between <!-- {marker} --> markers")
    return parser


def read_or_run(
    args: argparse.Namespace, parser: argparse.ArgumentParser, compute: Callable[[Path, list[str]], dict]
) -> dict:
    """``--table-only``: the record of ``--out``; else ``compute(suite_out, runs)`` on a backdoor run and its clean
    run (``--runs``), written to ``--out``."""
    if args.table_only:
        return json.loads(args.out.read_text())
    if not args.runs or len(args.runs) != 2:
        parser.error("--runs names a backdoor run and its clean run")
    found = compute(args.suite_out, args.runs)
    args.out.write_text(json.dumps(found, indent=2) + "\n")
    return found


def run_offline(
    args: argparse.Namespace, score: Callable[[Path, dict], Any], table_of: Callable[[dict], list[str]], marker: str
) -> dict:
    """Score each run's best model (``score(model_file, test)``) into ``--out``, or read it back with
    ``--table-only``; print its table and write it between ``marker``'s markers of ``--write-doc``."""
    if args.table_only:
        results = json.loads(args.out.read_text())
    else:
        test = test_config(args.suite_out.resolve() / "cache")
        results = {run: score(args.suite_out / "workspaces" / run / MODEL, test) for run in args.runs}
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    write_table(table_of(results), args.write_doc, marker)
    return results


def write_table(lines: list[str], page: Path | None, marker: str) -> None:
    """Print a table's ``lines`` and, with a ``page``, write them between its ``marker``'s markers."""
    print("\n".join(lines))
    if page:
        start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
        page.write_text(rewrite_marked_block(page.read_text(), start, end, "\n".join(lines)))


def main(argv: list[str] | None = None) -> dict[str, list[dict[str, float]]]:
    parser = offline_parser(__doc__.splitlines()[0], MARKER)
    parser.add_argument("--rates", type=float, nargs="+", default=list(RATES))
    args = parser.parse_args(argv)
    return run_offline(args, lambda model, test: pruned_scores(model, test, tuple(args.rates)), table, MARKER)


if __name__ == "__main__":
    main()
