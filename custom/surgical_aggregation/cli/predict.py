"""Score a folder (recursively) or a CSV of images, or a CSV of report texts, with a saved model (its file says which
it reads). Every input gets a row: its status ('ok', or why it could not be read) and one probability column per
class name."""

from __future__ import annotations

import argparse

from .options import add_model_options, given_preprocessing, output_file, user_path

NAME = "predict"
HELP = "score images (or reports) with a model: one probability column per class name"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, type=user_path, help="e.g. .../app_server/best_FL_global_model.pt")
    parser.add_argument(
        "--input",
        "--images",
        dest="source",
        required=True,
        type=user_path,
        help="a folder of images, a CSV with an image column, or (report models) a CSV with a text column",
    )
    parser.add_argument(
        "--column",
        "--image-column",
        dest="column",
        help="the CSV's image path column (default: path) or report text column (default: report)",
    )
    parser.add_argument("--out", required=True, type=user_path, help="CSV file to write")
    parser.add_argument(
        "--calls",
        action="store_true",
        help="add a 0/1 column per class, positive at or above the threshold saved with the model (see evaluate "
        "--thresholds-out)",
    )
    add_model_options(parser)


def run(args: argparse.Namespace) -> int:
    from ..evaluation.inference import STATUS_COLUMN, score

    out = output_file(args.out, "--out")
    scores, failures = score(
        args.model,
        args.source,
        args.column,
        given_preprocessing(args),
        args.cache_dir,
        args.on_error,
        device=args.device,
        calls=args.calls,
    )
    scores.to_csv(out, index=False)
    classes = [column for column in scores.columns[2:] if not column.endswith(")")]
    print(f"scored {len(scores) - len(failures)} of {len(scores)} input(s) for {len(classes)} classes -> {out}")
    for path, reason in failures:
        print(f"  not scored {path}: {reason} ({STATUS_COLUMN} column of the output)")
    return 0
