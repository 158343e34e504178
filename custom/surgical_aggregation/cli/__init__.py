"""Command line: ``surgical-aggregation <command>`` (also ``python -m surgical_aggregation``).

* ``prepare``   decode and resize a dataset's images (or embed its reports) once into the cache;
* ``generate``  write the embedded (generated) datasets in the real NIH / CheXpert / MIMIC layouts;
* ``predict``   score a folder or CSV of images with a model: per-class probabilities by class name;
* ``evaluate``  per-class AUROC of a model on a labelled set (the classes both have), table + plot;
* ``export-bundle`` write a model as a MONAI Bundle (metadata with class names, TorchScript, ONNX, inference config);
* ``write-job`` (re)write a FLARE job folder of this bundle (e.g. ``jobs/nih_chexpert``) from its recipe;
* ``blind-secret`` make the consortium's secret for blind mode (``docs/blind.md``);
* ``simulate``  run one of the bundle's jobs in FLARE's simulator, one process per site, then summarise;
* ``check-site`` check a site config against the job it will run, before a federation does;
* ``setup-kit`` add this bundle's local/ files to a startup kit of FLARE's distributed provisioning;
* ``pretrain``  train the offline stand-in for ImageNet weights (DenseNet121 on generated pattern images);
* ``experiment`` run (or resume) a grid of the papers' comparisons and write tables and plots;
* ``poc``       rehearse a deployment locally: prepare, start, submit (wait, download), stop, run.

One module per command (its ``NAME``, ``HELP``, ``add_arguments`` and ``run``: it parses and calls; its docstring is
the command's description), the options several
share in :mod:`.options`. The project's own user errors (a bad config, a missing folder, a
wrong file) print one ``error:`` line and exit 2; anything else is a bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from types import ModuleType

from ..core.errors import UserError
from ..flare.stopping import CommandInterrupted, stopped_cleanly
from . import (
    blind_secret,
    check_site,
    evaluate,
    experiment,
    export_bundle,
    generate,
    poc,
    predict,
    prepare,
    pretrain,
    setup_kit,
    simulate,
    write_job,
)

# every command's module, in the order --help lists them: its NAME and HELP, its docstring (the command's --help
# description), add_arguments(parser) and run(args)
COMMANDS: tuple[ModuleType, ...] = (
    prepare,
    generate,
    predict,
    evaluate,
    export_bundle,
    write_job,
    blind_secret,
    simulate,
    check_site,
    setup_kit,
    pretrain,
    experiment,
    poc,
)
HANDLERS: dict[str, ModuleType] = {command.NAME: command for command in COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (every command and option), as the docs' commands are checked against it."""
    parser = argparse.ArgumentParser(prog="surgical-aggregation", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_arguments(commands.add_parser(command.NAME, help=command.HELP, description=command.__doc__))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        with stopped_cleanly():
            return HANDLERS[args.command].run(args)
    except CommandInterrupted as stop:
        print(f"{args.command}: {stop}", file=sys.stderr)
        return stop.exit_code
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
