"""What several commands share: path and number option types, the model and site-config options, and how a
command prints as it goes."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..core.errors import SiteConfigError
from ..data.storage import default_cache_root
from ..images.names import CO_OCCURRENCES, ON_ERROR_POLICIES, SHARED_ROWS
from ..images.settings import ACCEPT_NON_CHEST
from ..training.profiles import SCRATCH, STAND_IN


def user_path(text: str) -> Path:
    """A path option; ``~`` is the user's home even where the shell does not expand it (``--out=~/x``, a quoted
    value, a launcher that passes arguments as given)."""
    return Path(text).expanduser()


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


POC_DEFAULT_JOB = Path("jobs/nih_chexpert")


def add_cache_dir(parser: argparse.ArgumentParser) -> None:
    """``--cache-dir``: where decoded images, embeddings, generated data and the stand-in backbone are kept."""
    parser.add_argument("--cache-dir", type=user_path, help=f"cache root (default {default_cache_root()})")


def add_co_occurrence(parser: argparse.ArgumentParser) -> None:
    """``--co-occurrence``: how generated images draw the findings their layout does not label."""
    parser.add_argument(
        "--co-occurrence",
        choices=CO_OCCURRENCES,
        default=SHARED_ROWS,
        help="embedded data: draw each image's findings its layout does not label given the 7 findings NIH and "
        "CheXpert share (shared, the default), or from PadChest's rows, which label both vocabularies (padchest)",
    )


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image-size", type=positive, help="override the size stored with the model")
    add_cache_dir(parser)
    parser.add_argument("--on-error", choices=ON_ERROR_POLICIES, default="skip", help="unreadable images")
    parser.add_argument(
        "--accept-non-chest",
        action="store_true",
        help="read DICOMs whose Modality or BodyPartExamined says they are no chest radiograph (refused by default)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")


def given_preprocessing(args: argparse.Namespace) -> dict[str, int | bool]:
    """What ``--image-size`` gives a model file that does not record its image size, and ``--accept-non-chest``."""
    given: dict[str, int | bool] = {} if args.image_size is None else {"image_size": args.image_size}
    return given | ({ACCEPT_NON_CHEST: True} if args.accept_non_chest else {})


def output_file(path: Path, option: str) -> Path:
    """A file to write: refused when it is a folder (one line naming it), its folder made when missing."""
    if path.is_dir():
        raise SiteConfigError(f"{option} {path.resolve()} is a folder; give the file to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def add_site_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--site-config",
        action="append",
        default=[],
        metavar="SITE=FILE",
        help="use this site config file (e.g. real data) instead of the job's default for SITE; repeatable",
    )


def add_start_option(parser: argparse.ArgumentParser) -> None:
    """``--start``: where an image job's backbone starts (``flare.recipe.nih_chexpert_recipe``)."""
    parser.add_argument(
        "--start",
        metavar="{stand-in,scratch,PATH}",
        help=f"the image jobs (nih_chexpert, cxr_consortium): {STAND_IN} (the default: FedBN+ from the offline "
        f"stand-in for ImageNet weights the bundle ships), {SCRATCH} (a random DenseNet121, FedAvg; nih_chexpert then "
        "on 400 patients a site: minutes, a smoke run) or a local ImageNet DenseNet121 checkpoint's path as the server "
        "sees it (FedBN+)",
    )


def start_option(args: argparse.Namespace, job: str, server_here: bool) -> dict[str, str]:
    """The recipe's ``start`` argument from ``--start`` (none given: the recipe's default); a path is the server's,
    so where the server runs here (``simulate``) it must exist and is made absolute."""
    from ..flare.protocol import CXR_CONSORTIUM, NIH_CHEXPERT

    if args.start is None:
        return {}
    if job not in (NIH_CHEXPERT, CXR_CONSORTIUM):
        raise SiteConfigError(f"--start applies to the {NIH_CHEXPERT} and {CXR_CONSORTIUM} jobs; {job} has no images")
    if args.start in (STAND_IN, SCRATCH) or not server_here:
        return {"start": args.start}
    path = user_path(args.start).resolve()
    if not path.is_file():
        raise SiteConfigError(f"--start {args.start}: no such checkpoint file ({path})")
    return {"start": str(path)}


def site_configs(entries: Sequence[str], job_aliases: Mapping[str, str] | None = None) -> dict[str, dict]:
    """``--site-config SITE=FILE`` entries: site -> its config (loaded and checked for a job with ``job_aliases``)."""
    from ..training.config import load_site_config

    sites = {}
    for entry in entries:
        site, separator, file = entry.partition("=")
        if not separator or not site or not file:
            raise SiteConfigError(f"--site-config takes SITE=FILE, got {entry!r}")
        sites[site] = load_site_config(file, job_aliases).to_dict()
    return sites


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is when a line is logged (it may be replaced, e.g. by a test)."""

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:
        pass


def printer(name: str) -> logging.Logger:
    """A logger that prints its messages as plain lines on stdout (what a command reports as it goes)."""
    printer = logging.getLogger(f"surgical_aggregation.cli.{name}")
    if not printer.handlers:
        handler = _StdoutHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        printer.addHandler(handler)
        printer.setLevel(logging.INFO)
        printer.propagate = False
    return printer
