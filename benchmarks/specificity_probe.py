"""How finding-specific one site's model becomes, epoch by epoch, from the stand-in. Not a test.

    python benchmarks/specificity_probe.py --epochs 8                            # about 5 minutes on 2 CPU cores
    python benchmarks/specificity_probe.py --epochs 8 --pattern-strength 1 2     # + 40 minutes to build that stand-in
    python benchmarks/specificity_probe.py --epochs 8 --pretraining 20000 8      # + 80 minutes to build that stand-in
    python benchmarks/specificity_probe.py --epochs 8 --pretraining-shapes 128   # + 40 minutes to build that stand-in
    python benchmarks/specificity_probe.py --epochs 8 --shapes-per-image 3       # + 30 minutes to build that stand-in

The main job's site-nih alone (its embedded data, split, rates and FedBN+), trained from the offline stand-in
outside FLARE: the head warm-up, then one epoch at a time. After each epoch, on its validation split: the loss, the
mean AUROC, and how finding-specific the model is (``metrics.score_specificity``: the mean pairwise correlation of
its logits, and the AUROC lost by ranking every finding by one shared score). Then, for the last model, what the
shared part of its logits follows: the correlation of the mean logit with the number of findings each image shows
(its glyphs, labelled or not: ``shown_findings.csv``), and the logit correlation among images showing the same
number. The levers it takes (``--pattern-strength``: the stand-in's shapes' brightness; ``--pretraining``: its
images and epochs; ``--pretraining-shapes``: how many shapes it tells apart; ``--shapes-per-image``: every image
showing as many, so that counting them teaches nothing; ``--no-augment``; ``--epochs``) are
those issue 49 tried for the main job's logit correlation; ``--rebuilt`` (the same recipe built on this machine, not
the bundle's copy) measures how far two builds of one recipe lie apart, the noise the levers are read against.
``--out`` writes every figure as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

from surgical_aggregation.core.head import extend_head
from surgical_aggregation.core.methods import SiteMethod
from surgical_aggregation.data.table import PATH_COLUMN
from surgical_aggregation.evaluation.metrics import score_specificity
from surgical_aggregation.experiments.grid_run import machine
from surgical_aggregation.experiments.pretraining import Pretraining, pretrained_backbone
from surgical_aggregation.flare.recipe import nih_chexpert_recipe
from surgical_aggregation.images.synthetic import PATTERN_STRENGTH, SHOWN_FILE, read_shown
from surgical_aggregation.images.synthetic_pixels import PATTERN_COUNT
from surgical_aggregation.training.checkpoint import initial_global_state
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.loops import Evaluation
from surgical_aggregation.training.profiles import STAND_IN_PRETRAINING
from surgical_aggregation.training.site_data import prepare_site_data, resolve_table, split_table
from surgical_aggregation.training.trainer import SiteTrainer

SITE = "site-nih"


def logits_of(probabilities: np.ndarray, eps: float = 1e-7) -> np.ndarray:
    clipped = np.clip(np.asarray(probabilities, dtype=np.float64), eps, 1 - eps)
    return np.log(clipped) - np.log1p(-clipped)


def shared_part(evaluation: Evaluation, shown_counts: np.ndarray) -> dict:
    """What the logits' shared part follows: the number of findings each image shows."""
    by_count = {}
    for count in range(int(shown_counts.max()) + 1):
        chosen = shown_counts == count
        if chosen.sum() >= 30:  # fewer images give no stable correlation of 14 logits
            specific = score_specificity(evaluation.labels[chosen], evaluation.scores[chosen], evaluation.mask[chosen])
            by_count[str(count)] = {"images": int(chosen.sum()), "logit_correlation": specific.logit_correlation}
    mean_logit = logits_of(evaluation.scores).mean(axis=1)
    return {
        "mean_logit_vs_shown_count": float(np.corrcoef(mean_logit, shown_counts)[0, 1]),
        "logit_correlation_by_shown_count": by_count,
    }


def shown_counts(paths: list[str]) -> np.ndarray:
    """How many findings each generated image shows (its glyphs, labelled or not), from its dataset's record."""
    root = next(folder for folder in Path(paths[0]).parents if (folder / SHOWN_FILE).is_file())
    shown = read_shown(root)
    shown.index = [str(root / relative) for relative in shown[PATH_COLUMN]]
    return (shown.drop(columns=PATH_COLUMN).reindex(paths).to_numpy() > 0).sum(axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8, help="epochs after the head warm-up's (default 8)")
    parser.add_argument(
        "--warmup-epochs", type=int, default=None, help="epochs of the head warm-up (default: the job's site config's)"
    )
    parser.add_argument("--no-augment", action="store_true", help="train without the training-time augmentation")
    parser.add_argument(
        "--pattern-strength",
        type=float,
        nargs=2,
        default=[PATTERN_STRENGTH, PATTERN_STRENGTH],
        metavar=("LOW", "HIGH"),
        help=f"the stand-in's shapes' brightness, times a finding's (default {PATTERN_STRENGTH:g}: the job's)",
    )
    parser.add_argument(
        "--pretraining",
        type=int,
        nargs=2,
        default=[STAND_IN_PRETRAINING["images"], STAND_IN_PRETRAINING["epochs"]],
        metavar=("IMAGES", "EPOCHS"),
        help="the stand-in's pretraining: its generated images and epochs (default: the job's; another builds its own)",
    )
    parser.add_argument(
        "--pretraining-shapes",
        type=int,
        default=PATTERN_COUNT,
        metavar="SHAPES",
        help=f"how many shapes the stand-in tells apart (default {PATTERN_COUNT}: the job's; another builds its own)",
    )
    parser.add_argument(
        "--shapes-per-image",
        type=int,
        default=0,
        metavar="N",
        help="every stand-in image shows exactly N shapes (default 0: each drawn on its own, about 3; the job's)",
    )
    parser.add_argument(
        "--rebuilt",
        action="store_true",
        help="the stand-in this machine built (in --cache), not the bundle's copy: how far two builds' models differ",
    )
    parser.add_argument("--cache", type=Path, default=None, help="cache root (embedded data, the stand-in weights)")
    parser.add_argument("--out", type=Path, default=None, help="write every figure here as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    log = logging.getLogger("specificity_probe")

    job = nih_chexpert_recipe()
    values = {**job.site_configs[SITE], "augment": not args.no_augment}
    if args.warmup_epochs is not None:
        values["warmup_epochs"] = args.warmup_epochs
    if args.cache is not None:
        values["cache_dir"] = str(args.cache)
    config = site_config_from_dict(values, SITE)
    image_size = config.settings.image_size
    images, pretraining_epochs = args.pretraining
    pretraining = Pretraining(
        image_size,
        images=images,
        epochs=pretraining_epochs,
        pattern_strength=tuple(args.pattern_strength),
        shapes=args.pretraining_shapes,
        shapes_per_image=args.shapes_per_image,
    )
    weights = pretrained_backbone(pretraining, args.cache, log, shipped=not args.rebuilt)  # as the job's, or rebuilt
    data = prepare_site_data(config, log)
    trainer = SiteTrainer(config, data, SITE, log)
    classes = sorted(data.class_names)
    state = initial_global_state(job.persistor_args["architecture"], trainer.preprocessing, 0, str(weights))
    trainer.load_global(extend_head(state, [], classes)[0], classes)
    trainer.set_method(SiteMethod("surgical", job.controller_args["backbone_strategy"]))

    started = time.perf_counter()
    epochs = []
    # the warm-up's epochs run in one call, as in a federation's first round; each later call is one epoch
    for epoch in range(min(config.warmup_epochs, 1) + args.epochs):
        warmup = epoch == 0 and config.warmup_epochs > 0
        trainer.fit(epoch, warmup=warmup)
        evaluation = trainer.validate()
        specific = score_specificity(evaluation.labels, evaluation.scores, evaluation.mask)
        epochs.append(
            {
                "epoch": epoch,
                "warmup": warmup,
                "validation_loss": evaluation.loss,
                "mean_auroc": evaluation.mean_auroc,
                "logit_correlation": specific.logit_correlation,
                "shared_score_auroc_loss": specific.shared_score_auroc_loss,
                "seconds": round(time.perf_counter() - started),
            }
        )
        print(json.dumps({key: round(v, 4) if isinstance(v, float) else v for key, v in epochs[-1].items()}))
    summary = {
        "machine": machine(),  # another CPU's kernels give another model (docs/benchmark: two builds of one recipe)
        "stand_in": weights.name,
        "augment": not args.no_augment,
        "warmup_epochs": config.warmup_epochs,
        "epochs": epochs,
    }
    counts = shown_counts([str(path) for path in split_table(resolve_table(config), config)["val"].frame[PATH_COLUMN]])
    if len(counts) != len(evaluation.scores):
        raise RuntimeError(f"{len(counts)} validation images in the table, {len(evaluation.scores)} evaluated")
    summary["last_model"] = shared_part(evaluation, counts)
    print(json.dumps(summary["last_model"], indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
