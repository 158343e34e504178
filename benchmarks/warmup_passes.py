"""The warm-up rows rule as stop 113 left it (every shared row, one pass) against today's (rows whose holders split
set aside, judged in passes), on synthetic rows: a NumPy experiment with the rule's own functions (``core.robust``),
not a run of the bundle.

The attack suite's seven sites (three CheXpert sites, four NIH sites; 7 findings all hold, 6 only the CheXpert sites,
7 only the NIH sites, so each NIH-only row has four holders) send warm-up updates of their head rows: each finding has
one direction (a random 8-vector, drawn per federation), an honest site moves its row along it plus its own noise, a
label flipper (the last one or two NIH sites) against it at ``scale`` times an honest site's size. Flippers either
train apart (their own noise, as honest sites do) or collude: they agree on one flipped update and each adds a little
noise (5 % of an honest site's) so as not to be counted as copies, which pulls the geometric median of the rows they
are half the holders of to them. Both rules read the same rows against the same consensus (the geometric median, the
default). For each setting, 100 federations: the flippers each rule rejects, the honest sites it rejects, and the
federations in which it rejects every flipper and no honest site.

    python benchmarks/warmup_passes.py --out docs/attack-suite/warmup-passes.json --write-doc docs/server-checks.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from backdoor_pruning import write_table

from surgical_aggregation.core.robust import (
    geometric_median,
    opposed_at_warmup,
    peeled_opposed_at_warmup,
    shared_rows_against_consensus,
)

MARKER = "warmup-passes"
RULES = ("stop 113", "today")
DIMENSION = 8  # of a row's update (the real rows: 1,024 weights and a bias)
SHARED, CHEXPERT_ONLY, NIH_ONLY = 7, 6, 7  # findings all seven sites hold, and each dataset's own
SITES = [*(f"site-chexpert-{index}" for index in (1, 2, 3)), *(f"site-nih-{index}" for index in (1, 2, 3, 4))]
FEDERATIONS = 100
COLLUDING_NOISE = 0.05  # a colluding flipper's own noise, as a share of an honest site's
SETTINGS = [
    (flippers, mode, scale, noise)
    for flippers in (1, 2)
    for mode in ("apart", "colluding")
    for scale in (1.0, 1.6, 2.0)
    for noise in (0.3, 0.6)
    if not (flippers == 1 and mode == "colluding")  # one flipper has no one to collude with
]


def federation(seed: int, flippers: int, mode: str, scale: float, noise: float) -> dict[str, dict[str, np.ndarray]]:
    """site -> finding -> its warm-up update of that row, for one synthetic federation (the module's docstring)."""
    rng = np.random.default_rng(seed)
    directions = {
        **{f"shared-{row}": rng.normal(size=DIMENSION) for row in range(SHARED)},
        **{f"chexpert-{row}": rng.normal(size=DIMENSION) for row in range(CHEXPERT_ONLY)},
        **{f"nih-{row}": rng.normal(size=DIMENSION) for row in range(NIH_ONLY)},
    }
    hostile = SITES[len(SITES) - flippers :]
    agreed = {name: rng.normal(size=DIMENSION) for name in directions}  # the colluders' common noise
    updates = {}
    for site in SITES:
        kind = site.split("-")[1]
        names = [name for name in directions if name.startswith(("shared", kind))]
        if site not in hostile:
            updates[site] = {name: directions[name] + noise * rng.normal(size=DIMENSION) for name in names}
        elif mode == "apart":
            updates[site] = {name: -scale * directions[name] + noise * rng.normal(size=DIMENSION) for name in names}
        else:
            updates[site] = {
                name: -scale * directions[name] + noise * (agreed[name] + COLLUDING_NOISE * rng.normal(size=DIMENSION))
                for name in names
            }
    return updates


def judged(flippers: int, mode: str, scale: float, noise: float, federations: int = FEDERATIONS) -> dict:
    """What each rule rejects over ``federations`` federations of one setting (seeds 0 to federations - 1)."""
    hostile = set(SITES[len(SITES) - flippers :])
    counts = {rule: {"flippers": 0, "honest": 0, "right": 0} for rule in RULES}
    for seed in range(federations):
        updates = federation(seed, flippers, mode, scale, noise)
        every_row = shared_rows_against_consensus(updates, geometric_median, set_split_rows_aside=False)
        before = set(opposed_at_warmup(every_row, SITES))
        today = set(peeled_opposed_at_warmup(updates, geometric_median, SITES)[0])
        for rule, rejected in zip(RULES, (before, today), strict=True):
            counts[rule]["flippers"] += len(rejected & hostile)
            counts[rule]["honest"] += len(rejected - hostile)
            counts[rule]["right"] += rejected == hostile
    return {
        "flippers": flippers,
        "mode": mode,
        "scale": scale,
        "noise": noise,
        "federations": federations,
        **counts,
    }


def table(records: list[dict]) -> list[str]:
    rules = " and ".join(f"{rule}'s" for rule in RULES)
    lines = [
        f"| flippers | flippers' rows | flippers' size | honest noise | flippers rejected ({rules}) | honest sites "
        f"rejected ({rules}) | federations with every flipper and no honest site rejected ({rules}) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for record in records:
        flippers, honest = record["flippers"] * record["federations"], (7 - record["flippers"]) * record["federations"]
        before, today = (record[rule] for rule in RULES)
        lines.append(
            f"| {record['flippers']} | {record['mode']} | {record['scale']:g} | {record['noise']:g} | "
            f"{before['flippers']}, {today['flippers']} of {flippers} | {before['honest']}, {today['honest']} of "
            f"{honest} | {before['right']}, {today['right']} of {record['federations']} |"
        )
    return lines


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON file of the results")
    parser.add_argument("--table-only", action="store_true", help="only draw the table of --out")
    parser.add_argument("--write-doc", type=Path, help=f"rewrite the table between <!-- {MARKER} --> markers")
    args = parser.parse_args(argv)
    if args.table_only:
        records = json.loads(args.out.read_text())
    else:
        records = []
        for setting in SETTINGS:
            records.append(judged(*setting))
            print(json.dumps(records[-1]), flush=True)
        args.out.write_text(json.dumps(records, indent=2) + "\n")
    write_table(table(records), args.write_doc, MARKER)
    return records


if __name__ == "__main__":
    main()
