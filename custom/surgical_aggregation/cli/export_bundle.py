"""Export a saved global model (e.g. published_global_model.pt, or the server's best_FL_global_model.pt) as a MONAI
Bundle that 'python -m monai.bundle run' and MONAI Deploy load: configs/metadata.json (outputs: per-class
probabilities, channel_def = the class names; how many sites labelled each class; aliases; thresholds),
configs/inference.json (a folder of images, or a CSV of reports, to predict's CSV), models/model.pt, model.ts and
model.onnx (where the onnx extra is installed), docs/README.md. Next to a server's model, its union_classes.csv and
round_history.json are read."""

from __future__ import annotations

import argparse

from .options import positive, user_path

NAME = "export-bundle"
HELP = "write a model as a MONAI Bundle: metadata with the class names, model.pt/.ts/.onnx, inference config"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=user_path, help="the model file")
    parser.add_argument("--out", required=True, type=user_path, help="the bundle's folder (new, or empty)")
    parser.add_argument(
        "--union-table",
        type=user_path,
        help="the server's union_classes.csv (default: next to the model)",
    )
    parser.add_argument(
        "--history", type=user_path, help="the server's round_history.json (default: next to the model)"
    )
    parser.add_argument("--label-aliases", type=user_path, help="the job's alias file, reported with the class names")
    onnx = parser.add_mutually_exclusive_group()
    onnx.add_argument("--onnx", dest="onnx", action="store_true", default=None, help="require model.onnx")
    onnx.add_argument("--no-onnx", dest="onnx", action="store_false", help="leave model.onnx out")
    parser.add_argument(
        "--min-sites",
        type=positive,
        default=1,
        help="leave out the classes fewer than this many sites label (needs the union table; default 1: none)",
    )
    parser.add_argument("--version", default="1.0.0", help="the bundle's version (default 1.0.0)")
    parser.add_argument("--authors", help="metadata's authors (default: the federation's sites)")
    parser.add_argument("--copyright", help="metadata's copyright holder (default: the sites)")
    parser.add_argument("--overwrite", action="store_true", help="replace the folder when it exists")


def run(args: argparse.Namespace) -> int:
    from ..core.labels import job_vocabulary, label_aliases
    from ..deployment.bundle import export_bundle, read_history, read_union_counts

    named = {"authors": args.authors, "copyright": args.copyright}
    exported = export_bundle(
        args.model,
        args.out,
        sites_labelling=None if args.union_table is None else read_union_counts(args.union_table),
        history=None if args.history is None else read_history(args.history),
        vocabulary=job_vocabulary(label_aliases(args.label_aliases)),
        onnx=args.onnx,
        min_sites=args.min_sites,
        version=args.version,
        overwrite=args.overwrite,
        **{key: value for key, value in named.items() if value is not None},
    )
    print("\n".join(exported.summary()))
    print(f"run it: cd {args.out} && python -m monai.bundle run --config_file configs/inference.json ...")
    return 0
