"""The specificity gate's model under changed training settings: one grid run per lever. Not a test.

    python benchmarks/gate_levers.py --set learning_rate=2e-4 --out results/levers/lr2e-4 -- \
        --grid psi --only psi12of14 --methods centralized_full --variant full --seeds 0 --controls missing

Issue 49's gate counts a full-network comparison only where ``centralized_full`` (every label known) scores findings
apart (its logits' mean pairwise correlation at most 0.3); from the stand-in it stays near 0.48 at the benchmark
profile's rates (docs/benchmark). Each ``--set FIELD=VALUE`` (VALUE read as JSON) replaces one of the benchmark
profile's settings for this process's grid only: a site-config field (``learning_rate``, ``warmup_epochs``,
``local_epochs``, ``weight_decay``, ...) or the profile's own ``rounds`` and ``patience``. The profile is renamed after
the levers, and the grid's plan.json records it, so a lever's run is never taken for the shipped profile's. The rest
of the command line is the ``experiment`` command's, with ``--profile benchmark`` and ``--engine inprocess`` added
(one process, so the changed profile is the one that runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from surgical_aggregation.cli import main as cli_main
from surgical_aggregation.training import profiles

PROFILE = "benchmark"


def changed_profile(base: profiles.Profile, levers: list[str]) -> profiles.Profile:
    """``base`` with each FIELD=VALUE applied: the profile's own field where it has one, else a site-config field."""
    own = {field.name for field in dataclasses.fields(profiles.Profile)} - {"name", "description", "training"}
    top: dict = {}
    training = dict(base.training)
    for lever in levers:
        name, separator, text = lever.partition("=")
        if not separator:
            raise SystemExit(f"--set {lever!r}: expected FIELD=VALUE")
        value = json.loads(text)
        (top if name in own else training)[name] = value
    label = ", ".join(levers)
    return dataclasses.replace(base, name=f"{base.name} ({label})", training=training, **top)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="levers", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--out", required=True, help="the grid's results folder")
    args, rest = parser.parse_known_args()
    rest = [item for item in rest if item != "--"]
    profiles.PROFILES[PROFILE] = changed_profile(profiles.PROFILES[PROFILE], args.levers)
    print(f"profile: {profiles.PROFILES[PROFILE].name}", flush=True)
    return cli_main(["experiment", "--profile", PROFILE, "--engine", "inprocess", "--out", args.out, *rest])


if __name__ == "__main__":
    sys.exit(main())
