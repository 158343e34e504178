"""Every head row projected onto the directions in which clean images' features vary: an offline look at a suite
run's models against a backdoor whose trigger the start's features represent, not a defence of the bundle.

The head is linear in what it reads (DenseNet121's 1,024 pooled channels). Pruning the channels clean images leave
dormant (``backdoor_pruning.py``, after Liu, Dolan-Gavitt and Garg's fine-pruning) asks whether the trigger lives in
channels; this asks the same of directions: a trigger the clean images never show may move the features along
directions in which they barely vary, which a row fitted to clean images has no use for. For the best and the final
model of a backdoored run and its clean run: the principal directions of the features of the test set's clean images
(no labels, no trigger; a defence would read each site's validation images), then each head row ``w`` replaced by its
projection ``P_k w`` on the ``k`` leading directions and its bias ``b`` by ``b + (w - P_k w) . mean`` (the mean clean
image scores as before), and the test set scored as the suite scores it: the mean AUROC over its classes and the
trigger's success (the share of the Pneumothorax negatives whose triggered image scores above the model's own 95th
percentile on the clean images).

    python benchmarks/backdoor_projection.py --suite-out <attack_suite.py --out> \
        --runs backdoor_glyph-3sites-1attackers-seed1-400p5r-stand-in clean-3sites-0attackers-seed1-400p5r-stand-in \
        --out docs/attack-suite/projection.json
    python benchmarks/backdoor_projection.py --out docs/attack-suite/projection.json --table-only \
        --write-doc docs/server-checks.md
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from attack_suite import UNION, test_config
from backdoor_pruning import offline_parser, read_or_run, write_table
from backdoor_refit import MODELS, TestSet, _canonical, _head
from suite_site import trigger_of

from surgical_aggregation.training.checkpoint import load_checkpoint

DIRECTIONS = (0, 8, 16, 32, 64, 128, 256)  # k leading directions kept (0: the model as it is)
MARKER = "backdoor-projection"


def projected_heads(
    weight: np.ndarray, bias: np.ndarray, clean: np.ndarray, directions: tuple[int, ...]
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """k -> the head (``weight``, ``bias``) with every row projected on the k leading principal directions of the
    features ``clean`` (images x channels), the bias keeping the mean image's scores; k = 0: the head as it is."""
    mean = clean.mean(axis=0)
    _, vectors = np.linalg.eigh(np.cov(clean - mean, rowvar=False))
    leading = vectors[:, ::-1]  # eigh sorts ascending
    heads = {}
    for count in directions:
        if count == 0:
            heads[count] = (weight, bias)
            continue
        basis = leading[:, :count]
        kept = weight @ basis @ basis.T
        heads[count] = (kept, bias + (weight - kept) @ mean)
    return heads


def run(suite_out: Path, runs: list[str], directions: tuple[int, ...] = DIRECTIONS) -> dict[str, Any]:
    """Per model (best, final) and run (the backdoored one, then its clean one): each projection's scores."""
    records = json.loads((suite_out / "results.json").read_text())
    trigger = trigger_of(records[runs[0]]["attack"])
    test = test_config(suite_out.resolve() / "cache")
    found: dict[str, Any] = {"runs": runs, "trigger": trigger}
    for label, path in MODELS.items():
        found[label] = {}
        for run_name in runs:
            checkpoint = load_checkpoint(suite_out / "workspaces" / run_name / path)
            read = TestSet(checkpoint, test, trigger)
            names = _canonical(checkpoint.class_names)
            heads = projected_heads(*_head(checkpoint), read.clean, directions)
            scored = {str(count): read.score(*head, names, list(UNION)) for count, head in heads.items()}
            found[label][run_name] = scored
            print(f"{label} {run_name}: {found[label][run_name]}", flush=True)
    return found


def table(found: dict[str, Any]) -> list[str]:
    """Per model and number of directions kept: each run's mean AUROC and trigger success, and the difference."""
    attacked, reference = found["runs"]
    lines = [
        "  | model | directions kept | backdoored model: mean AUROC, success | clean model: mean AUROC, success "
        "| success above the clean model's |",
        "  | --- | --- | --- | --- | --- |",
    ]
    for label in MODELS:
        for count, hit in found[label][attacked].items():
            base = found[label][reference][count]
            kept = "all (as it is)" if count == "0" else count
            lines.append(
                f"  | {label} | {kept} | {hit['mean_auroc']:.3f}, {hit['success']:.1%} "
                f"| {base['mean_auroc']:.3f}, {base['success']:.1%} "
                f"| {100 * (hit['success'] - base['success']):+.1f} points |"
            )
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = offline_parser(__doc__.splitlines()[0], MARKER)
    parser.add_argument("--marker", default=MARKER, help=f"the markers' name (default {MARKER})")
    args = parser.parse_args(argv)
    found = read_or_run(args, parser, run)
    write_table(table(found), args.write_doc, args.marker)
    return found


if __name__ == "__main__":
    main()
