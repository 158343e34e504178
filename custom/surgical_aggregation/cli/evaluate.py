"""Evaluate a saved model on labelled data (images, or reports for a report model): per-class AUROC by class name, mean
AUROC with a bootstrap 95% CI; writes per_class_auroc.csv/.png and summary.txt. With --thresholds-out, each class's
threshold is chosen on the validation split (Youden's J), the test split is evaluated at it (accuracy, sensitivity,
specificity), and a copy of the model carrying the thresholds is written for 'predict --calls'. With --recalibrate-out,
each class the validation split labels is recalibrated in the large to it (one shift of its logits, so that its mean
probability is the split's prevalence: a federation's model carries the consortium's base rates), the test split's
loss is shown before and after, and a copy of the model with the shifts in its head biases is written. With
--refit-rows-out, the head row of each class the site labels is refitted from nothing on its own images (a logistic
regression on the model's features of the training split, its regularisation chosen on the validation split, then
fitted on both): the rows no longer carry what other sites taught them (a trigger the rows read, say); the test split's
AUROC is shown before and after, and a copy of the model with those rows is written."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core.errors import SiteConfigError
from ..data.names import UNCERTAINTY_POLICIES
from ..modalities import DATA_KINDS
from .options import add_model_options, given_preprocessing, output_file, positive, user_path

NAME = "evaluate"
# the options writing a model: their argument's name, and the splits they fit on
WRITTEN = {
    "--thresholds-out": ("thresholds_out", "val"),
    "--recalibrate-out": ("recalibrate_out", "val"),
    "--refit-rows-out": ("refit_rows_out", "train and val"),
}
REFIT_SPLIT = "test, head rows refitted on train and val"
HELP = "per-class AUROC of a model on a labelled set (only the classes the set has)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, type=user_path)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--site-config", type=user_path, help="use a site's data exactly as its config defines it")
    source.add_argument("--kind", choices=DATA_KINDS, help="what the labelled set is, and its layout (with --data)")
    parser.add_argument("--data", type=user_path, help="dataset folder (or CSV file for --kind csv)")
    parser.add_argument("--uncertainty", choices=UNCERTAINTY_POLICIES)
    parser.add_argument(
        "--split",
        choices=("all", "train", "val", "test"),
        default=None,
        help="which patient-level split to evaluate on (default test; 'all' for an external set); --thresholds-out "
        "and --recalibrate-out fit on val and evaluate test, --refit-rows-out fits on train and val",
    )
    parser.add_argument("--out", required=True, type=user_path, help="folder for the table, plot and summary")
    parser.add_argument("--bootstrap", type=positive, default=1000, help="bootstrap resamples for the CI")
    written = parser.add_mutually_exclusive_group()
    written.add_argument(
        "--thresholds-out",
        type=user_path,
        metavar="MODEL_FILE",
        help="choose per-class thresholds on the validation split, evaluate the test split at them, and write a copy "
        "of the model carrying them here",
    )
    written.add_argument(
        "--recalibrate-out",
        type=user_path,
        metavar="MODEL_FILE",
        help="recalibrate each class in the large on the validation split (one intercept: the site's own prevalence; "
        "the ranking, so the AUROC, unchanged), show the test split's loss before and after, and write a copy of the "
        "model carrying the shifts here",
    )
    written.add_argument(
        "--refit-rows-out",
        type=user_path,
        metavar="MODEL_FILE",
        help="refit the head row of each class the site labels from nothing on its own images (logistic regression on "
        "the model's features of the training split, C chosen on the validation split, then fitted on both), show "
        "the test split's AUROC before and after, and write a copy of the model with those rows here",
    )
    add_model_options(parser)


def run(args: argparse.Namespace) -> int:
    from ..evaluation.inference import (
        evaluate_and_choose_thresholds,
        evaluate_and_recalibrate,
        evaluate_and_refit_rows,
        evaluate_on_table,
        labelled_splits,
        save_recalibrated,
        save_refit_rows,
        save_thresholds,
        write_evaluation,
    )

    fitting = next((option for option, (name, _) in WRITTEN.items() if getattr(args, name) is not None), None)
    if fitting and args.split is not None:
        raise SiteConfigError(
            f"--split applies to a plain evaluation; {fitting} fits on {WRITTEN[fitting][1]} and evaluates test"
        )
    if fitting and Path(getattr(args, WRITTEN[fitting][0])).resolve() == Path(args.model).resolve():
        raise SiteConfigError(f"{fitting} {args.model} is the model read: write the new model to another file")
    splits, title = labelled_splits(args.site_config, args.kind, args.data, args.uncertainty)
    options = {
        "preprocessing": given_preprocessing(args),
        "cache_dir": args.cache_dir,
        "on_error": args.on_error,
        "device": args.device,
        "bootstrap": args.bootstrap,
    }
    shifts = rows = None
    if args.thresholds_out is not None:
        target = output_file(args.thresholds_out, "--thresholds-out")
        report = evaluate_and_choose_thresholds(args.model, splits, **options)
        title = title.format(split="test, thresholds from val")
    elif args.recalibrate_out is not None:
        target = output_file(args.recalibrate_out, "--recalibrate-out")
        report, shifts = evaluate_and_recalibrate(args.model, splits, **options)
        title = title.format(split="test, recalibrated on val")
    elif args.refit_rows_out is not None:
        target = output_file(args.refit_rows_out, "--refit-rows-out")
        report, rows = evaluate_and_refit_rows(args.model, splits, **options)
        title = title.format(split=REFIT_SPLIT)
    else:
        split = args.split or "test"
        report = evaluate_on_table(args.model, splits[split], **options)
        title = title.format(split=split)
    print(f"{title}: {report.n_images} {report.noun}")
    print(report.text())
    for path in write_evaluation(report, args.out, title):
        print(f"wrote {path}")
    if args.thresholds_out is not None:
        saved = save_thresholds(
            args.model, report, title.replace("test, thresholds from val", "validation split"), target
        )
        print(f"wrote {saved}: the model with its thresholds (predict --calls)")
    if shifts is not None:
        fitted_on = title.replace("test, recalibrated on val", "validation split")
        saved = save_recalibrated(args.model, shifts, fitted_on, target)
        print(f"wrote {saved}: the model recalibrated to {fitted_on} ({len(shifts)} of its classes)")
    if rows is not None:
        fitted_on = title.replace(REFIT_SPLIT, "training and validation splits")
        saved = save_refit_rows(args.model, rows, fitted_on, target)
        print(f"wrote {saved}: the model with {len(rows)} head rows refitted on {fitted_on}")
    return 0
