"""An offline look at flipping the head's updates on dormant channels against the attack suite's backdoor: FLAIN
(Ding, Yang, Huang, *FLAIN: Mitigating Backdoor Attacks in Federated Learning via Flipping Weight Updates of
Low-Activation Input Neurons*, ICMR 2025), beside the pruning of fine-pruning (Liu, Dolan-Gavitt, Garg, RAID 2018)
read the same way; not a defence of the bundle.

FLAIN, after training, takes the first fully connected layer after the convolutions, the mean of each of its inputs
over an auxiliary set of clean images, and for the inputs whose mean is at most k turns their columns' update since
the initial model back (``initial - (final - initial)``); k rises until the auxiliary accuracy falls by more than a
tolerance. Here that layer is the head (its 1,024 inputs are DenseNet121's pooled last channels) and its initial rows
are the job's (``initial_head_rows``, head seed 0). The suite's test patients are split in two by patient: the
auxiliary half gives the channels' means and the stopping rule (its mean AUROC may fall by at most ``--tolerance``);
the other half scores, as the suite does, each model's mean AUROC and the backdoor's success (the share of its
triggered Pneumothorax negatives above the model's own 95th percentile on the clean images). Pruning (the same
columns set to 0) is scored beside it. The head is linear on its inputs, so each variant is scored from the pooled
features read once (clean and triggered) rather than by running the network again.

    python benchmarks/backdoor_flipping.py --suite-out /work/results/suite72-400p5r \
        --runs backdoor-3sites-1attackers-seed1-400p5r clean-3sites-0attackers-seed1-400p5r \
        --out docs/attack-suite/flipping.json
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from attack_suite import TARGET, UNION, Triggered, backdoor_success
from backdoor_pruning import offline_parser, run_offline

from surgical_aggregation.core.head import NAMED_HEAD, initial_head_rows
from surgical_aggregation.core.labels import BUILTIN_VOCABULARY
from surgical_aggregation.evaluation.inference import scoring_dataset
from surgical_aggregation.evaluation.metrics import auroc
from surgical_aggregation.training.checkpoint import load_checkpoint
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.loops import head_inputs, make_loader
from surgical_aggregation.training.site_data import resolve_table

RATES = (*(round(0.05 * step, 2) for step in range(20)), 0.97, 0.99)  # shares of the channels treated
TOLERANCE = 0.005  # the auxiliary half's mean AUROC may fall by this much
MARKER = "backdoor-flipping"


def mean_auroc(labels: np.ndarray, probabilities: np.ndarray) -> float:
    values = [auroc(labels[:, column], probabilities[:, column]) for column in range(labels.shape[1])]
    return float(np.nanmean(values))


def treated_scores(model_file: Path, test: dict, rates: tuple[float, ...], tolerance: float) -> dict:
    """Per rate and treatment (``prune``, ``flip``): the auxiliary and scoring halves' mean AUROC and the scoring
    half's backdoor success; and the rate FLAIN's rule stops at for each treatment."""
    checkpoint = load_checkpoint(model_file)
    config = site_config_from_dict(test, "the attack suite's test set")
    dataset, kept = scoring_dataset([checkpoint], resolve_table(config), cache_dir=config.cache_dir)
    model = checkpoint.build_model()
    cpu = torch.device("cpu")
    clean, _, _ = head_inputs(model, make_loader(dataset, 64, train=False, workers=0), cpu)
    triggered, _, _ = head_inputs(model, make_loader(Triggered(dataset), 64, train=False, workers=0), cpu)
    names = [BUILTIN_VOCABULARY.canonical(name) for name in checkpoint.class_names]
    labels, _ = kept.label_matrix(list(UNION), "error")
    present = [name for name in UNION if name in names]
    columns = [names.index(name) for name in present]
    labels = labels[:, [list(UNION).index(name) for name in present]]
    patients = kept.frame["patient_id"].astype(str).to_numpy()
    auxiliary = np.isin(patients, sorted(set(patients))[::2])  # every other patient, in name order
    scoring = ~auxiliary
    dormant_first = np.argsort(clean[auxiliary].mean(0).numpy(), kind="stable")
    weight = checkpoint.state[NAMED_HEAD.weight_key].float()
    bias = checkpoint.state[NAMED_HEAD.bias_key].float()
    initial = torch.from_numpy(initial_head_rows(checkpoint.class_names, weight.shape[1], 0)[0])
    target = names.index(TARGET)
    target_labels = labels[:, present.index(TARGET)]
    rows: dict[str, list[dict[str, float]]] = {"prune": [], "flip": []}
    for treatment, treated in (("prune", torch.zeros_like(weight)), ("flip", 2 * initial - weight)):
        for rate in rates:
            changed = weight.clone()
            chosen = dormant_first[: int(rate * len(dormant_first))]
            changed[:, chosen] = treated[:, chosen]
            clean_probabilities = torch.sigmoid(clean @ changed.T + bias).numpy()
            triggered_probabilities = torch.sigmoid(triggered @ changed.T + bias).numpy()
            row = {
                "rate": rate,
                "auxiliary_auroc": mean_auroc(labels[auxiliary], clean_probabilities[auxiliary][:, columns]),
                "mean_auroc": mean_auroc(labels[scoring], clean_probabilities[scoring][:, columns]),
                "backdoor_success": backdoor_success(
                    target_labels[scoring],
                    clean_probabilities[scoring, target],
                    triggered_probabilities[scoring, target],
                ),
            }
            rows[treatment].append(row)
            print(f"{model_file.parts[-5]}: {treatment} {rate:.0%}: {row}", flush=True)
    return {"rows": rows, "stops": {treatment: stopping_rate(found, tolerance) for treatment, found in rows.items()}}


def stopping_rate(rows: list[dict[str, float]], tolerance: float) -> float:
    """FLAIN's rule: raise the rate until the auxiliary AUROC falls by more than ``tolerance``; the rate before."""
    chosen = rows[0]["rate"]
    for row in rows:
        if rows[0]["auxiliary_auroc"] - row["auxiliary_auroc"] > tolerance:
            break
        chosen = row["rate"]
    return chosen


def table(results: dict[str, dict]) -> list[str]:
    """Untouched, then per treatment at the rate FLAIN's rule stops at for each model: the backdoored model's (the
    first of ``results``) and the clean model's (the second) mean AUROC and backdoor success on the scoring half."""
    attacked, clean = results.values()
    lines = [
        "  | treatment | backdoored model: channels, mean AUROC, success | clean model: channels, mean AUROC, success "
        "| success above the clean model's |",
        "  | --- | --- | --- | --- |",
    ]
    for treatment in ("none", "prune", "flip"):
        picked = [
            found["rows"]["prune"][0]
            if treatment == "none"
            else next(row for row in found["rows"][treatment] if row["rate"] == found["stops"][treatment])
            for found in (attacked, clean)
        ]
        cells = [f"{row['rate']:.0%}, {row['mean_auroc']:.3f}, {row['backdoor_success']:.1%}" for row in picked]
        above = 100 * (picked[0]["backdoor_success"] - picked[1]["backdoor_success"])
        lines.append(f"  | {treatment} | {cells[0]} | {cells[1]} | {above:+.1f} points |")
    return lines


def main(argv: list[str] | None = None) -> dict[str, dict]:
    parser = offline_parser(__doc__.splitlines()[0], MARKER)
    parser.add_argument("--tolerance", type=float, default=TOLERANCE)
    args = parser.parse_args(argv)
    return run_offline(args, lambda model, test: treated_scores(model, test, RATES, args.tolerance), table, MARKER)


if __name__ == "__main__":
    main()
