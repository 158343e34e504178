"""Whether a stand-in built here has the shipped stand-in's bits, and how far its weights lie if not. Not a test.

    surgical-aggregation pretrain --profile benchmark --cache-dir /tmp/rebuild     # ~26 minutes on 2 CPU cores
    python benchmarks/stand_in_bits.py --built /tmp/rebuild/pretrained/patterns-v2.2-64px-10000i-8e-lr0.001-b64-s0.pt \
        --log pretrain.log --out docs/stand-in/rebuild.json

Training is deterministic on one kind of CPU; another CPU's float kernels (AVX2 against AVX512, another summation
order) change the first step's last bits, and eight epochs of training carry that into every weight. The record says
on which machine the build ran (``grid_run.machine``), its build time and its own shapes' validation AUROC (from the
build's log), the two files' digests, and per tensor whether the weights agree and by how much they differ.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path

import torch

from surgical_aggregation.experiments.grid_run import machine
from surgical_aggregation.experiments.pretraining import Pretraining, shipped_stand_in
from surgical_aggregation.training.profiles import STAND_IN_PRETRAINING


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--built", type=Path, required=True, help="the stand-in 'pretrain' built here")
    parser.add_argument("--log", type=Path, required=True, help="the build's log")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    shipped = shipped_stand_in(Pretraining(64, **STAND_IN_PRETRAINING))
    if shipped is None or shipped.name != args.built.name:
        raise SystemExit(f"{args.built}: not a build of the shipped stand-in ({shipped})")
    log = args.log.read_text()
    (seconds,) = re.findall(r"pretrained backbone in (\d+) s: ", log)
    aurocs = [
        float(value)
        for value in re.findall(r"pretraining epoch \d+/\d+: validation loss [\d.]+, mean AUROC ([\d.]+)", log)
    ]
    built, reference = (torch.load(path, weights_only=True)["state_dict"] for path in (args.built, shipped))
    if set(built) != set(reference):
        raise SystemExit(f"{args.built}: other tensors than the shipped stand-in's")
    learned = [key for key in reference if reference[key].is_floating_point()]
    differences = {key: float((built[key].double() - reference[key].double()).abs().max()) for key in learned}
    record = {
        "machine": machine(),
        "built": args.built.name,
        "seconds": int(seconds),
        "validation_mean_auroc_by_epoch": aurocs,
        "built_sha256": digest(args.built),
        "shipped_sha256": digest(shipped),
        "tensors": len(learned),
        "tensors_that_differ": sum(value > 0 for value in differences.values()),
        "largest_difference": max(differences.values()),
        "first_convolution": {
            "largest_difference": differences["features.conv0.weight"],
            "mean_absolute_weight": float(reference["features.conv0.weight"].abs().mean()),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
