"""Where the attack suite's backdoor lives in a global model, and what an honest site removes of it by refitting its
own head rows on its own images (the fit ``evaluate --refit-rows-out`` makes); an offline look at a suite run's models.

*Where it lives.* The head is linear in what it reads (DenseNet121's 1,024 pooled channels), so models that mix a
backdoored run's model and its clean run's are scored from features read once: each backbone with the other's head,
and each model with the other's row of the target finding (Pneumothorax) alone. Where the clean head or the clean
target row on the backdoored backbone brings the trigger's success back to the clean model's, the backdoor lives in
the head (the target row), not in the features.

*The refit.* Each honest site of the backdoored run (and the same sites of its clean run) refits every head row of its
own classes from nothing, by L2-regularised logistic regression (``training.head_refit``, the fit of ``evaluate --refit-
rows-out``) on the global model's pooled features of its training images, each feature standardised on them; C is the
value of its grid with the lowest loss on its validation images, finding by finding; the other rows and the backbone
stay the global model's. This is the last-layer re-initialisation and fine-tuning that Sha, He, Berrang, Humbert and
Zhang found to remove backdoors (*Fine-Tuning Is All You Need to Mitigate Backdoor Attacks*, 2022), with the backbone
frozen: the site's images never show the trigger, so a row fitted on them alone cannot have learned it; what it costs is
the federation's part in the row. Scored on the suite's test set as the suite scores: the mean AUROC over the site's own
classes, and the trigger's success (the share of the test set's Pneumothorax negatives whose triggered image scores
above the model's own 95th percentile on the clean images).

    python benchmarks/backdoor_refit.py --suite-out <attack_suite.py --out> \
        --runs backdoor_glyph-3sites-1attackers-seed1-400p5r-stand-in clean-3sites-0attackers-seed1-400p5r-stand-in \
        --out docs/attack-suite/refit-three-sites.json
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from attack_suite import TARGET, UNION, Triggered, backdoor_success, test_config
from backdoor_flipping import mean_auroc
from backdoor_pruning import offline_parser, read_or_run, write_table
from suite_site import trigger_of

from surgical_aggregation.core.head import NAMED_HEAD
from surgical_aggregation.core.labels import BUILTIN_VOCABULARY
from surgical_aggregation.evaluation.inference import labelled_splits, scoring_dataset
from surgical_aggregation.evaluation.metrics import sigmoid
from surgical_aggregation.training.checkpoint import Checkpoint, load_checkpoint
from surgical_aggregation.training.config import load_site_config, site_config_from_dict
from surgical_aggregation.training.head_refit import refit_rows
from surgical_aggregation.training.loops import head_inputs, make_loader
from surgical_aggregation.training.site_data import resolve_table

MODELS = {
    "best": "server/simulate_job/app_server/best_FL_global_model.pt",
    "final": "server/simulate_job/app_server/FL_global_model.pt",
}
MARKER = "backdoor-refit"


def _features(checkpoint: Checkpoint, dataset: Any) -> np.ndarray:
    loader = make_loader(dataset, 64, train=False, workers=0)
    return head_inputs(checkpoint.build_model(), loader, torch.device("cpu"))[0].double().numpy()


def _canonical(names: list[str]) -> list[str]:
    return [BUILTIN_VOCABULARY.canonical(name) for name in names]


class TestSet:
    """The suite's test set read by one model: clean and triggered features, the labels of :data:`UNION`."""

    def __init__(self, checkpoint: Checkpoint, test: dict, trigger: str) -> None:
        config = site_config_from_dict(test, "the attack suite's test set")
        dataset, kept = scoring_dataset([checkpoint], resolve_table(config), cache_dir=config.cache_dir)
        self.clean, self.triggered = _features(checkpoint, dataset), _features(checkpoint, Triggered(dataset, trigger))
        self.labels = kept.label_matrix(list(UNION), "error")[0]

    def score(self, weight: np.ndarray, bias: np.ndarray, names: list[str], classes: list[str]) -> dict[str, float]:
        """A head (``weight``, ``bias``, rows ``names``) on these features: the mean AUROC over ``classes`` and the
        trigger's success on the target finding."""
        clean, triggered = sigmoid(self.clean @ weight.T + bias), sigmoid(self.triggered @ weight.T + bias)
        present = [name for name in classes if name in names]
        labels = self.labels[:, [list(UNION).index(name) for name in present]]
        target, column = names.index(TARGET), list(UNION).index(TARGET)
        return {
            "mean_auroc": mean_auroc(labels, clean[:, [names.index(name) for name in present]]),
            "success": backdoor_success(self.labels[:, column], clean[:, target], triggered[:, target]),
        }


def _head(checkpoint: Checkpoint) -> tuple[np.ndarray, np.ndarray]:
    return tuple(checkpoint.state[key].double().numpy().copy() for key in NAMED_HEAD.keys)


def located(backdoored: Checkpoint, clean: Checkpoint, features: Mapping[str, TestSet]) -> dict[str, dict[str, float]]:
    """Each backbone with each head, and each model with the other's target row (``features``: the test set as the
    ``backdoored`` and the ``clean`` model read it): mean AUROC over :data:`UNION` and the trigger's success."""
    names = _canonical(backdoored.class_names)
    if names != _canonical(clean.class_names):
        raise ValueError("the two models' head rows differ: they are not a run and its clean run")
    target = names.index(TARGET)
    heads = {"backdoored": _head(backdoored), "clean": _head(clean)}
    found = {}
    for backbone in ("backdoored", "clean"):
        other = "clean" if backbone == "backdoored" else "backdoored"
        for head in (backbone, other):
            found[f"{backbone} backbone, {head} head"] = features[backbone].score(*heads[head], names, list(UNION))
        weight, bias = (part.copy() for part in heads[backbone])
        weight[target], bias[target] = heads[other][0][target], heads[other][1][target]
        found[f"{backbone} model, {other} target row"] = features[backbone].score(weight, bias, names, list(UNION))
    return found


def refit_site(
    checkpoint: Checkpoint, site_config: Path, features: TestSet, refit_on_both: bool = False
) -> dict[str, Any]:
    """The site's classes' rows refitted on its own images: the global model's and the refitted head's scores;
    ``refit_on_both``: fitted again on training and validation images at the C chosen, as ``evaluate
    --refit-rows-out`` does."""
    splits, _ = labelled_splits(site_config)
    config = load_site_config(site_config)
    read = {}
    for split in ("train", "val"):
        dataset, kept = scoring_dataset([checkpoint], splits[split], cache_dir=config.cache_dir)
        labels, mask = kept.label_matrix()
        read[split] = (_features(checkpoint, dataset), labels, mask, _canonical(kept.classes))
    names, own = _canonical(checkpoint.class_names), read["train"][3]
    weight, bias = _head(checkpoint)
    chosen = {}
    for column, fitted in refit_rows(read["train"][:3], read["val"][:3], refit_on_both).items():
        row = names.index(own[column])
        weight[row], bias[row], chosen[own[column]] = fitted.weights, fitted.bias, fitted.strength
    return {
        "global": features.score(*_head(checkpoint), names, own),
        "refit": features.score(weight, bias, names, own),
        "rows_refitted": len(chosen),
        "c": chosen,
    }


def run(suite_out: Path, runs: list[str], refit_on_both: bool = False) -> dict[str, Any]:
    """The backdoored run (the first of ``runs``) and its clean run: where the backdoor lives, and each honest site's
    refit, for the best and the final model (``refit_on_both``: :func:`refit_site`'s)."""
    records = json.loads((suite_out / "results.json").read_text())
    attacked, reference = runs
    trigger = trigger_of(records[attacked]["attack"])
    test = test_config(suite_out.resolve() / "cache")
    sites = sorted(folder.name.removeprefix("app_") for folder in (suite_out / "jobs" / attacked).glob("app_site-*"))
    honest = [site for site in sites if site not in records[attacked]["attacking_sites"]]
    found: dict[str, Any] = {"runs": runs, "trigger": trigger, "honest_sites": honest}
    if refit_on_both:
        found["refit_on_both"] = True
    for label, path in MODELS.items():
        models = {run: load_checkpoint(suite_out / "workspaces" / run / path) for run in runs}
        read = {run: TestSet(models[run], test, trigger) for run in runs}  # each model reads the test set once
        located_by = {"backdoored": read[attacked], "clean": read[reference]}
        found[label] = {"located": located(models[attacked], models[reference], located_by), "refit": {}}
        for run_name in runs:
            features = read[run_name]
            for site in honest:
                config = suite_out / "jobs" / run_name / f"app_{site}" / "config" / "site_configs" / f"{site}.json"
                found[label]["refit"].setdefault(site, {})[run_name] = refit_site(
                    models[run_name], config, features, refit_on_both
                )
                print(f"{label} {run_name} {site}: {found[label]['refit'][site][run_name]}", flush=True)
    return found


def table(found: dict[str, Any]) -> list[str]:
    """Per model (best, final) and honest site: the global model's and the refitted head's mean AUROC over the site's
    classes and the trigger's success, backdoored run and clean run."""
    attacked, reference = found["runs"]
    lines = [
        "  | model | site | backdoored run: global, refitted (mean AUROC, success) | clean run: global, refitted "
        "| success above the clean run's: global, refitted |",
        "  | --- | --- | --- | --- | --- |",
    ]
    kinds = ("global", "refit")
    for label in MODELS:
        for site, runs in found[label]["refit"].items():
            cells = [
                ", ".join(f"{runs[name][kind]['mean_auroc']:.3f} / {runs[name][kind]['success']:.1%}" for kind in kinds)
                for name in (attacked, reference)
            ]
            above = [100 * (runs[attacked][kind]["success"] - runs[reference][kind]["success"]) for kind in kinds]
            lines.append(f"  | {label} | {site} | {cells[0]} | {cells[1]} | {above[0]:+.1f}, {above[1]:+.1f} points |")
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = offline_parser(__doc__.splitlines()[0], MARKER)
    parser.add_argument("--marker", default=MARKER, help=f"the markers' name (default {MARKER})")
    parser.add_argument(
        "--refit-on-both",
        action="store_true",
        help="fit each row again on training and validation images at the C chosen (evaluate --refit-rows-out's way)",
    )
    args = parser.parse_args(argv)
    found = read_or_run(args, parser, lambda suite_out, runs: run(suite_out, runs, args.refit_on_both))
    for label in MODELS:
        print(label, json.dumps(found[label]["located"], indent=1))
    write_table(table(found), args.write_doc, args.marker)
    return found


if __name__ == "__main__":
    main()
