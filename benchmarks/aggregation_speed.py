"""Aggregation and slicing time at the consortium's head size: does a 199-class union cost more than a 20-class one?

Not a test. DenseNet121 states (random weights) for the sites of a job, each with its real class list:
  * ``nih_chexpert``: 2 sites, 14 and 13 classes, a 20-class union;
  * ``cxr_consortium``: 7 sites (NIH 14, CheXpert 13, PadChest 189, VinDr-CXR 14, Google 4, RSNA 1, SIIM 1
    classes, read from the real label files), a 199-class union.
It times one round's server work: each site's slice of the global model (``slice_for_client``), then
adding every site's state to the aggregator and finishing it (the backbone's mean and each head row's mean over
the sites holding it). Median and min over ``--repeats``.

    python benchmarks/aggregation_speed.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from surgical_aggregation.core.aggregation import Contribution, SurgicalAggregator
from surgical_aggregation.core.head import slice_for_client
from surgical_aggregation.core.labels import CHEXPERT_LABELS, NIH_LABELS
from surgical_aggregation.data.reference import reference_file
from surgical_aggregation.data.table import PATH_COLUMN, PATIENT_COLUMN
from surgical_aggregation.images.model import NamedDenseNet
from surgical_aggregation.images.public import KEY_COLUMN, PUBLIC_DATASETS, read_public_labels


def consortium_classes() -> dict[str, list[str]]:
    """Each consortium site's classes, from the real label files (torchxrayvision's data folder)."""
    classes = {"site-nih": list(NIH_LABELS), "site-chexpert": list(CHEXPERT_LABELS)}
    sites = {"padchest": "site-padchest", "vindr": "site-vindr", "google-nih": "site-google", "rsna": "site-rsna"}
    sites["siim"] = "site-siim"
    for kind, site in sites.items():
        reference = reference_file(PUBLIC_DATASETS[kind].reference)
        if reference is None:
            raise SystemExit(f"needs {PUBLIC_DATASETS[kind].reference}: pip install --no-deps torchxrayvision==1.5.7")
        parsed = read_public_labels(kind, reference)[1]
        classes[site] = [column for column in parsed.columns if column not in (KEY_COLUMN, PATIENT_COLUMN, PATH_COLUMN)]
    return classes


def one_round(site_classes: dict[str, list[str]], repeats: int) -> dict[str, float]:
    union = sorted({name for names in site_classes.values() for name in names})
    torch.manual_seed(0)
    global_state = NamedDenseNet(union).state_dict()
    local = {site: NamedDenseNet(names).state_dict() for site, names in site_classes.items()}
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        for names in site_classes.values():
            slice_for_client(global_state, union, names)
        aggregator = SurgicalAggregator(global_state, union)
        for site, names in site_classes.items():
            aggregator.add(Contribution(site, local[site], names, 100))
        aggregator.finalize()
        seconds.append(time.perf_counter() - started)
    return {
        "union": len(union),
        "sites": len(site_classes),
        "min_s": min(seconds),
        "median_s": statistics.median(seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="JSON file for the results")
    args = parser.parse_args()
    results = {}
    print(f"{'job':<16}{'sites':>6}{'union':>7}{'median s':>10}{'min s':>8}")
    consortium = consortium_classes()
    jobs = {"nih_chexpert": {site: consortium[site] for site in ("site-nih", "site-chexpert")}}
    jobs["cxr_consortium"] = consortium
    for job, site_classes in jobs.items():
        results[job] = one_round(site_classes, args.repeats)
        row = results[job]
        print(f"{job:<16}{row['sites']:>6}{row['union']:>7}{row['median_s']:>10.3f}{row['min_s']:>8.3f}")
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
