"""Clean federations drawn at random, through FLARE's simulator: how often the server's rules stop or exclude an
honest site (the false-alarm rate the decision rules are designed for), and the statistics they judge.

Not a test. Every federation is honest. Each is drawn from its seed: K sites in {2, 3, 4, 7}; label schemes either
drawn from the seven public datasets the bundle reads (NIH, CheXpert, PadChest, VinDr-CXR, Google's NIH labels,
RSNA, SIIM; a scheme drawn twice is two sites of that layout with their own data) or dealt from NIH's 14 findings
with a label heterogeneity psi (``experiments.grids.assign_label_sets``); each site's size drawn log-uniformly from
50 to 800 patients (a PadChest site at least 200: its 189 findings), at most :data:`MOST_PATIENTS` in a federation;
3 or 5 rounds (``--rounds``: another length), each run whole; its own training seed. The ``cxr_consortium``
job runs as the README runs it (``surgical-aggregation simulate --name cxr_consortium``, with ``--start scratch``
where the sweep's is) among them.

For each: the exit code, why it stopped, the sites excluded in any round, and every site's paired validation figures
of every global model (``round_history.json``), from which the tables of ``docs/server-checks.md`` are drawn.

    python benchmarks/clean_sweep.py --out results/clean_sweep --seeds $(seq 0 29) --consortium
    python benchmarks/clean_sweep.py --out $OUT/sweep --work /tmp/sweep --seeds $(seq 100 139) --consortium \
        --workers 12 --stop-starting-after 330     # many federations at once on a lent GPU machine (16 cores)
    python benchmarks/clean_sweep.py --out results/clean_sweep --table-only --write-doc docs/server-checks.md
    python benchmarks/clean_sweep.py --out results/clean_sweep --table-only --plot closest.png  # each rule's margin
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
from hostile_site import direction_check, run_simulator
from scipy.stats import beta, norm

from surgical_aggregation.core.checks.update import (
    OPPOSED_FIRST_ROUND,
    OPPOSITION_LIMIT,
    consensus_is_no_ones,
    persistently_opposed,
)
from surgical_aggregation.core.judging import TESTS, Harm, auroc_harm_of, harm_of, round_level
from surgical_aggregation.core.labels import NIH_LABELS
from surgical_aggregation.core.robust import MIN_SHARED_ROWS, OPPOSED_BACKBONE
from surgical_aggregation.experiments.grid_run import code_version, machine
from surgical_aggregation.experiments.grids import assign_label_sets
from surgical_aggregation.experiments.summary import rewrite_marked_block
from surgical_aggregation.flare.recipe import (
    CONSORTIUM_PATIENTS,
    CONSORTIUM_SITES,
    DEFAULT_START,
    DEMO,
    SurgicalAggregationRecipe,
    start_settings,
    write_job,
)
from surgical_aggregation.flare.results import HISTORY_FILE
from surgical_aggregation.training.profiles import JOB_STARTS, SCRATCH

SITE_COUNTS = (2, 3, 4, 7)
PSI_UNIQUE = (0, 2, 6, 10, 12)  # labels of NIH's 14 held by one site each (psi = unique / 14)
SMALLEST, LARGEST = 50, 800
PADCHEST_SMALLEST = 200
MOST_PATIENTS = 2000  # a federation's patients in all, so that one runs in minutes on 2 CPU cores
ROUNDS = (3, 5)
IMAGE_SIZE = 64
CONSORTIUM = "cxr_consortium"
PACKAGE = "surgical_aggregation"
MARKER = "clean-sweep"


@dataclass
class Federation:
    name: str
    seed: int
    scheme: str  # public | psi | the consortium job
    rounds: int
    sites: dict[str, dict[str, Any]]  # site -> {kind, patients, labels (psi) or None}
    psi: str | None = None
    start: str = SCRATCH  # where the backbone starts: from scratch, or the stand-in at the papers' fine-tuning rates


def draw(seed: int) -> Federation:
    """The federation of ``seed``."""
    rng = np.random.default_rng(seed)
    count = int(rng.choice(SITE_COUNTS))
    scheme = str(rng.choice(["public", "psi"]))
    rounds = int(rng.choice(ROUNDS))
    sizes = [float(np.exp(rng.uniform(math.log(SMALLEST), math.log(LARGEST)))) for _ in range(count)]
    psi = None
    if scheme == "public":
        kinds = [str(kind) for kind in rng.choice(list(CONSORTIUM_SITES.values()), count)]
        labels = [None] * count
    else:
        unique = int(rng.choice(PSI_UNIQUE))
        psi = str(Fraction(unique, 14))
        kinds = ["nih"] * count
        labels = assign_label_sets(NIH_LABELS, count, Fraction(unique, 14), seed)
    sizes = [
        max(size, PADCHEST_SMALLEST) if kind == "padchest" else size for size, kind in zip(sizes, kinds, strict=True)
    ]
    total = sum(sizes)
    if total > MOST_PATIENTS:  # scaled down, none below the smallest
        sizes = [max(SMALLEST, size * MOST_PATIENTS / total) for size in sizes]
    sites = {}
    for index, (kind, size, names) in enumerate(zip(kinds, sizes, labels, strict=True)):
        sites[f"site-{index + 1}-{kind}"] = {"kind": kind, "patients": round(size), "labels": names}
    return Federation(f"sweep-{seed:03d}", seed, scheme, rounds, sites, psi)


def site_configs(federation: Federation, cache: Path) -> dict[str, dict[str, Any]]:
    configs = {}
    for index, (site, drawn) in enumerate(sorted(federation.sites.items())):
        data = {"kind": drawn["kind"]}
        if drawn["labels"] is not None:
            data["labels"] = list(drawn["labels"])
        embedded = {"patients": drawn["patients"], "image_size": IMAGE_SIZE, "seed": federation.seed * 100 + index}
        config = DEMO.site_config(data, embedded=embedded, **start_settings(federation.start)[0])
        configs[site] = {
            **config,
            "image_size": IMAGE_SIZE,
            "seed": federation.seed,
            "record_exchanges": "off",
            "cache_dir": str(cache),
        }
    return configs


def write_federation_job(federation: Federation, folder: Path, cache: Path, settings: dict) -> Path:
    _, persistor, started = start_settings(federation.start)
    controller = {
        "num_rounds": federation.rounds,
        "patience": federation.rounds,
        "min_clients": len(federation.sites),
        **started,
        **settings,
    }
    recipe = SurgicalAggregationRecipe(
        federation.name,
        site_configs(federation, cache),
        controller=controller,
        persistor={**persistor, "seed": federation.seed},
    )
    return write_job(recipe, folder, force=True)


def run_consortium(workspace: Path, start: str = SCRATCH) -> tuple[int, str, Path]:
    """The README's command, as written (its workspace a fresh folder; a ``start`` other than the job's default adds
    ``--start``); (exit code, output, its server app)."""
    shutil.rmtree(workspace, ignore_errors=True)
    script = Path(sys.executable).parent / "surgical-aggregation"
    command = [str(script)] if script.is_file() else [sys.executable, "-m", PACKAGE]
    command += ["simulate", "--name", CONSORTIUM, *([] if start == DEFAULT_START else ["--start", start])]
    result = subprocess.run(
        [*command, "--workspace", str(workspace)], capture_output=True, text=True, timeout=5400, env=dict(os.environ)
    )
    return result.returncode, result.stdout + result.stderr, server_app(workspace, CONSORTIUM)


def server_app(workspace: Path, name: str) -> Path:
    """The server's app folder of a federation's workspace (the consortium job's one level further down)."""
    return (workspace / CONSORTIUM if name == CONSORTIUM else workspace) / "server" / "simulate_job" / "app_server"


def validation_sizes(log: str) -> dict[str, int]:
    """site -> its validation images, as each site's log line says when its data are ready (what it declares at the
    handshake: the floor of its standard errors)."""
    return {site: int(count) for site, count in re.findall(r"(\S+) data ready: [^\n]*?(\d+) validation", log)}


def outcome(app: Path, code: int, log: str) -> dict[str, Any]:
    history = json.loads((app / HISTORY_FILE).read_text()) if (app / HISTORY_FILE).is_file() else []
    rounds = [entry["aggregation"] for entry in history if "aggregation" in entry]
    directions = {str(index): entry.get("directions", {}) for index, entry in enumerate(rounds)}
    validations = {
        str(entry["round"]): {site: metrics for site, metrics in entry["validation"].get("sites", {}).items()}
        for entry in history
        if "validation" in entry
    }
    stopped = re.search(r"the job cannot go on: ([^\n]*)", log)
    return {
        "exit_code": code,
        "stopped": stopped.group(1) if stopped else None,
        "excluded": {str(entry_round): entry.get("excluded", {}) for entry_round, entry in enumerate(rounds)},
        "rejected": sorted({site for entry in rounds for site in entry.get("rejected", {})}),
        "rejections": {str(entry_round): entry.get("rejected", {}) for entry_round, entry in enumerate(rounds)},
        "direction_check": direction_check(app),
        "validations": validations,
        "validation_sizes": validation_sizes(log),
        # the initial model's bar, by round until a model passed it: the judging sites' judged change of loss
        "bars": {
            str(entry["round"]): entry["validation"]["bar"]["judged_change"]
            for entry in history
            if "bar" in entry.get("validation", {})
        },
        "directions": directions,
        # each site judged before: its running opposition (the CUSUM of its cosines) after the round, by round
        "opposition": {str(index): entry.get("opposition", {}) for index, entry in enumerate(rounds)},
        # how near two honest sites' backbone updates came (duplicates: core.robust.DUPLICATE_DISTANCE), and each
        # site's shared head rows (three or more holders) against their consensus (a cosine), each round
        "closest_updates": {str(index): entry.get("closest_updates") for index, entry in enumerate(rounds)},
        "row_agreement": {str(index): entry.get("row_agreement", {}) for index, entry in enumerate(rounds)},
        "shared_rows": {str(index): entry.get("shared_rows", {}) for index, entry in enumerate(rounds)},
        "row_turns": {str(index): entry.get("row_turns", {}) for index, entry in enumerate(rounds)},
        "two_sites": {str(index): entry.get("two_sites", {}) for index, entry in enumerate(rounds)},
        "update_sizes": {str(index): entry.get("update_sizes", {}) for index, entry in enumerate(rounds)},
        "screening": [entry.get("screening") for entry in history if entry.get("screening")],
        "published": (app / "best_FL_global_model.pt").is_file(),
        # the rounds its history flags as the best so far; the server's best model is the last (None: no model was)
        "best_rounds": (bests := [entry["round"] for entry in history if (entry.get("validation") or {}).get("best")]),
        "best_round": max(bests, default=None),
    }


def ends_early(result: dict, patience: int) -> int | None:
    """The round after which a job with ``patience`` would have ended, replayed on a run's record (``best_rounds``):
    its ``patience``-th judged round in a row that made no new best, as the controller counts them: a round the
    sites validated no model of (none in ``validations``) does not count (None: it runs every round of the record).
    The choice of the best does not read the patience, so up to that round the job's rounds are the run's own."""
    without, judged = 0, result.get("validations")
    for number in range(result["federation"]["rounds"]):
        if judged is not None and str(number) not in judged:
            continue
        without = 0 if number in result["best_rounds"] else without + 1
        if without >= patience:
            return number
    return None


# seeds whose federations set a rule (in-sample for it): the loss margins (100-119), the leave-one-out margins
# (200-204), the untrained first round and the majority for an exclusion (0-9, the consortium job's first run), the
# update bound's scale with a site's sample count (139), the warm-up rows rule (157-169: its five rows from 157-161's
# records, its warm-up round from 162-169's), the two-site bounds on opposite updates after the warm-up round (the
# two-site federations among 300-331: chosen with their records in view; withdrawn at stop 96), the harm test's
# recalibrated half (384: the clean federation it stopped), the initial model's bar without a veto for a site whose
# own training did not lower its loss (529: the clean federation it stopped), the bar on recalibrated losses where the
# model ranks a site's images no worse (626: the clean federation it stopped)
CALIBRATION_SEEDS = frozenset(
    [*range(0, 10), *range(100, 120), 139, *range(157, 170), *range(200, 205), *range(300, 332), 384, 529, 626]
)


# the draws from the stand-in whose refused honest sites chose the direction check in the first round only for jobs
# from pretrained weights (stop 101), with the consortium job's run from the stand-in: in-sample for that rule
FIRST_ROUND_CHOSEN_ON = frozenset([575, 578])


def out_of_sample(name: str, result: dict) -> bool:
    """Whether no rule that judged this run was set on its federation: its seed (the consortium job: its run of this
    sweep, not the first), and under the direction check in the first round only, the federations that chose it."""
    if result.get("direction_check") == OPPOSED_FIRST_ROUND and (
        name == CONSORTIUM or result["federation"]["seed"] in FIRST_ROUND_CHOSEN_ON
    ):
        return False
    return name == CONSORTIUM or result["federation"]["seed"] not in CALIBRATION_SEEDS


def table(results: dict[str, dict]) -> list[str]:
    lines = [
        "| federation | sites | scheme | patients a site | rounds | ran on | exit code | stopped | excluded "
        "| rejected |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, result in sorted(results.items()):
        sizes = [drawn["patients"] for drawn in result["federation"]["sites"].values()]
        scheme = result["federation"]["scheme"]
        if result["federation"].get("psi"):
            scheme = f"psi {result['federation']['psi']}"
        excluded = sorted({site for sites in result["excluded"].values() for site in sites})
        label = name if out_of_sample(name, result) else f"{name} (calibration)"
        lines.append(
            f"| {label} | {len(sizes)} | {scheme} | {min(sizes)}-{max(sizes)} | {result['federation']['rounds']} "
            f"| {result.get('machine', '?')} | {result['exit_code']} | {(result['stopped'] or '—')[:60]} "
            f"| {', '.join(excluded) or '—'} | {rejected_rounds(result) or '—'} |"
        )
    for title, chosen in (
        ("federations", results),
        ("never used to set a rule", {name: r for name, r in results.items() if out_of_sample(name, r)}),
    ):
        stops = sum(1 for result in chosen.values() if result["exit_code"] != 0)
        excluded = sum(1 for result in chosen.values() if any(result["excluded"].values()))
        rejected = sum(1 for result in chosen.values() if result["rejected"])
        total = len(chosen)
        at_most = {count: bound_text(upper_bound(count, total)) for count in (stops, excluded, rejected)}
        lines.append(
            f"| **{total} {title}** | | | | | | **{stops} stopped** (at most {at_most[stops]}) | "
            f"| **{excluded} with an exclusion** (at most {at_most[excluded]}) "
            f"| **{rejected} with a result rejected** (at most {at_most[rejected]}) |"
        )
    return lines


def rejected_rounds(result: dict) -> str:
    """The honest sites whose results the server's checks refused, with the rounds: every one a false alarm."""
    rounds: dict[str, list[str]] = {}
    for round_number, sites in sorted(result.get("rejections", {}).items(), key=lambda item: int(item[0])):
        for site in sites:
            rounds.setdefault(site, []).append(round_number)
    if not rounds and result["rejected"]:  # a result written before the rounds were kept
        return ", ".join(result["rejected"])
    return "; ".join(f"{site} (rounds {', '.join(numbers)})" for site, numbers in rounds.items())


def replayed_opposition(directions: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """The running opposition the first-round direction check would give each site, replayed on a run's recorded
    cosines (round -> site -> cosine): a site is judged in the first round that has its cosine and a consensus that is
    someone's, and each later such round takes its CUSUM (``persistently_opposed``); round -> site -> its running
    opposition after it. Exact up to the first update the rule would refuse, after which the run would differ, and
    as long as every result had a cosine (a zero update has none, yet counts among a round's results)."""
    running: dict[str, float] = {}
    replayed = {}
    for number in sorted(directions, key=int):
        cosines = directions[number]
        if consensus_is_no_ones([site for site, cosine in cosines.items() if cosine <= 0], len(cosines)):
            continue
        after, _ = persistently_opposed(cosines, running)
        running.update(after)
        running.update({site: 0.0 for site in cosines if site not in running})  # judged now
        replayed[number] = after
    return replayed


# the rules that stop a job or refuse an honest site, and what a run's record shows of how near it came to each
# (closest_approaches): its title, the rule's threshold, and whether the rule acts at or below it or above it
APPROACHES = {
    "direction": ("3+ sites, direction: lowest cosine", 0.0, "below"),
    "warmup_rows": (f"3+ sites, warm-up rows ({MIN_SHARED_ROWS}+): lowest mean cosine", 0.0, "below"),
    "opposition": ("3+ sites, running opposition: highest", OPPOSITION_LIMIT, "above"),
    "two_site_backbone": ("2 sites, round 0: backbone cosine", OPPOSED_BACKBONE, "below"),
    "two_site_rows": (f"2 sites, round 0: shared rows ({MIN_SHARED_ROWS}+) mean cosine", 0.0, "below"),
    "harm": ("harm test: highest z less the z a flag needs", 0.0, "above"),
    "bar": ("initial model's bar: first judged change", 0.0, "above"),
}


def closest_approaches(result: dict) -> dict[str, float | None]:
    """How near a run came to each rule of :data:`APPROACHES` (None: the rule judged nothing in it), from the rounds
    its record keeps (a round that stopped the job keeps no validation: the table shows the stop): the lowest cosine
    of a site's backbone update with the round's consensus in each round that judged its direction (under the
    first-round check, each site's first round with three or more cosines and a consensus that is someone's); with the
    direction check on, the lowest mean cosine of a site's shared head rows (five or more) in the warm-up round (round
    0) of three or more sites, and a round 0 of two sites' backbone cosine and shared rows' mean cosine (five or more
    rows); the highest running opposition; and the harm test's highest z (the z of its p: the lower of the loss test's
    two halves) over each round's sites but those left out in an earlier round, less the z Holm's first step needs at
    the round's level (``round_level``, half of it a test; the loss test alone in round 0, from untrained heads), each
    site's standard error floored by its validation size as the server floors it (``validation_sizes``; a record
    without them: as the site reported it). With three or more sites one flag alone is kept on record, not acted on.
    And the initial model's bar in the first round that read it: the judging sites' judged change of loss against
    the initial model (its model passes at 0 or below; a later round's may pass instead; None: not recorded).
    A record that does not name its direction check (before it was recorded) reads as judging no direction."""
    rule = result.get("direction_check")
    direction, judged = [], set()
    for number in sorted(result.get("directions", {}), key=int):
        cosines = result["directions"][number]
        opposed = [site for site, cosine in cosines.items() if cosine <= 0]
        if not rule or len(cosines) < 3 or consensus_is_no_ones(opposed, len(cosines)):
            continue
        for site, cosine in cosines.items():
            if rule != OPPOSED_FIRST_ROUND or site not in judged:
                direction.append(cosine)
        judged |= set(cosines)
    shared = result.get("shared_rows", {}).get("0", {}) if rule else {}
    warmup = [one.get("mean_cosine") for one in shared.values() if one.get("rows", 0) >= MIN_SHARED_ROWS]
    warmup = [value for value in warmup if value is not None] if len(shared) >= 3 else []
    pair = (result.get("two_sites", {}).get("0") or {}) if rule else {}
    rows = pair.get("shared_rows_mean_cosine") if (pair.get("shared_rows") or 0) >= MIN_SHARED_ROWS else None
    rounds = approaches_by_round(result)
    return {
        "direction": min(direction, default=None),
        "warmup_rows": min(warmup, default=None),
        "opposition": max(rounds["opposition"].values(), default=None),
        "two_site_backbone": pair.get("backbone_cosine"),
        "two_site_rows": rows,
        "harm": max(rounds["harm"].values(), default=None),
        "bar": bars[min(bars, key=int)] if (bars := result.get("bars")) else None,
    }


def approaches_by_round(result: dict) -> dict[str, dict[int, float]]:
    """The two rules a run meets again every round, round by round (round -> value; a round that judged nothing is
    left out): the highest running opposition after it (``opposition``), and the harm test's highest z less the z
    Holm's first step needs at the round's level (``harm``), as :func:`closest_approaches` reads them."""
    opposition = {int(number): max(sites.values()) for number, sites in result.get("opposition", {}).items() if sites}
    harm, sizes, left_out = {}, result.get("validation_sizes", {}), set()
    level = round_level(result["federation"]["rounds"])
    for number in range(result["federation"]["rounds"]):
        figures = result.get("validations", {}).get(str(number), {})
        figures = {site: one for site, one in figures.items() if site not in left_out}
        for test in (harm_of, auroc_harm_of) if number > 0 else (harm_of,):
            tests = [test(metrics, sizes.get(site)) for site, metrics in figures.items()]
            tests = [found for found in tests if found is not None]
            if tests:
                needed = norm.isf(level / len(TESTS) / len(tests))
                margin = float(max(map(_deciding_z, tests)) - needed)
                harm[number] = max(harm.get(number, margin), margin)
        left_out |= set(result.get("excluded", {}).get(str(number), []))
    return {"opposition": dict(sorted(opposition.items())), "harm": harm}


def _deciding_z(harm: Harm) -> float:
    """The z of a harm test's p: the loss test's is the larger p of its two halves, so the smaller z."""
    return harm.z if harm.recalibrated is None else min(harm.z, harm.recalibrated.z)


def site_count_colours(plt: Any) -> dict[int, Any]:
    """The colour of each number of sites in the sweeps' plots."""
    palette = plt.get_cmap("viridis")
    return {count: palette(index / (len(SITE_COUNTS) - 1)) for index, count in enumerate(SITE_COUNTS)}


def plot_approaches(results: dict[str, dict], path: Path) -> Path:
    """One panel a rule of :data:`APPROACHES`: each federation's closest approach to it (in the order of their names,
    coloured by their sites), the rule's threshold dashed red; a point on the side the rule acts on is a false alarm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 4, figsize=(14, 6.4))
    colours = site_count_colours(plt)
    ordered = sorted(results.items())
    approaches = [closest_approaches(result) for _, result in ordered]
    panels = list(axes.flat)
    for axis in panels[len(APPROACHES) :]:
        axis.axis("off")
    for axis, (key, (title, threshold, side)) in zip(panels, APPROACHES.items(), strict=False):
        judged = 0
        for index, ((_, result), approach) in enumerate(zip(ordered, approaches, strict=True)):
            if approach[key] is not None:
                judged += 1
                axis.scatter(index, approach[key], color=colours.get(len(result["federation"]["sites"])), s=16)
        axis.axhline(threshold, color="red", linestyle="--", linewidth=1)
        plural = "" if judged == 1 else "s"
        axis.set_title(f"{title}\n({judged} federation{plural}; the rule acts {side} the red line)", fontsize=8)
        axis.set_xlim(-1, len(ordered))
        axis.tick_params(labelsize=7)
    for axis in panels[len(panels) // 2 : len(APPROACHES)]:
        axis.set_xlabel(f"federation ({ordered[0][0]} ... {ordered[-1][0]}, by name)", fontsize=7)
    handles = [plt.Line2D([], [], marker="o", linestyle="", color=colour, label=f"{count} sites")
               for count, colour in colours.items()]  # fmt: skip
    panels[-1].legend(handles=handles, fontsize=8, loc="center")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_by_round(results: dict[str, dict], path: Path) -> Path:
    """The rules a run meets every round (:func:`approaches_by_round`), round by round: one line a federation,
    coloured by its sites (a round that judged nothing breaks it), each rule's threshold dashed red; a run longer
    than its draw (``--rounds``) has its drawn rounds hollow, the rounds after filled. A long job that drifts towards
    a rule shows it here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    colours = site_count_colours(plt)
    rounds = max((result["federation"]["rounds"] for result in results.values()), default=1)
    by_round = {name: approaches_by_round(result) for name, result in sorted(results.items())}
    for axis, key in zip(axes, ("harm", "opposition"), strict=True):
        title, threshold, side = APPROACHES[key]
        drawn_counts = set()
        for name, result in sorted(results.items()):
            line = by_round[name][key]
            if not line:
                continue
            count = len(result["federation"]["sites"])
            drawn_counts.add(count)
            seed = result["federation"].get("seed", -1)  # the consortium job's is -1: no draw
            drawn = draw(seed).rounds if seed >= 0 else result["federation"]["rounds"]
            numbers = list(range(result["federation"]["rounds"]))
            values = [line.get(number, math.nan) for number in numbers]
            axis.plot(numbers, values, linewidth=1, color=colours.get(count))
            hollow = [number for number in line if number < drawn]
            filled = [number for number in line if number >= drawn]
            for chosen, face in ((hollow, "white"), (filled, colours.get(count))):
                axis.scatter(chosen, [line[number] for number in chosen], s=12, edgecolors=colours.get(count),
                             facecolors=face, zorder=3)  # fmt: skip
        axis.axhline(threshold, color="red", linestyle="--", linewidth=1)
        plural = "" if len(results) == 1 else "s"
        axis.set_title(
            f"{title}, by round\n({len(results)} federation{plural}; the rule acts {side} the red line)", fontsize=8
        )
        axis.set_xlabel("round (hollow: the rounds of the federation's drawn length)", fontsize=8)
        axis.set_xticks(range(rounds))
        axis.tick_params(labelsize=7)
        handles = [plt.Line2D([], [], marker="o", color=colours[count], label=f"{count} sites")
                   for count in sorted(drawn_counts)]  # fmt: skip
        if handles:
            axis.legend(handles=handles, fontsize=7, loc="lower right" if side == "above" else "upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def upper_bound(events: int, trials: int, confidence: float = 0.95) -> float:
    """The exact (Clopper-Pearson) one-sided upper confidence bound of a rate seen ``events`` times in ``trials``:
    what the sweep says the false-alarm rate is at most."""
    if trials == 0:
        return 1.0
    if events >= trials:
        return 1.0
    return float(beta.ppf(confidence, events + 1, trials - events))


def bound_text(bound: float) -> str:
    """An upper bound as the docs write it: rounded up, never down, to a tenth of a percent ("3.4 %")."""
    return f"{math.ceil(round(1000 * bound, 6)) / 10:.1f} %"


def positive_count(text: str) -> int:
    """An argument that counts rounds: 1 or more."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: at least 1")
    return value


def main(argv: list[str] | None = None) -> dict[str, dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="*", default=list(range(30)))
    parser.add_argument("--consortium", action="store_true", help="also run the cxr_consortium job as the README does")
    parser.add_argument("--controller", type=json.loads, default={}, help="controller settings over the defaults")
    parser.add_argument(
        "--start",
        choices=JOB_STARTS,
        default=SCRATCH,
        help="where every federation's backbone starts (default scratch; stand-in: FedBN+ at the papers' rates)",
    )
    parser.add_argument(
        "--rounds",
        type=positive_count,
        help=f"every drawn federation runs this many rounds, each of them (no early end), not its drawn 3 or 5: "
        f"{DEMO.rounds} is the main job's length (nih_chexpert ends early after {DEMO.patience} rounds without "
        "improvement, and real data that keep improving run every round)",
    )
    parser.add_argument("--table-only", action="store_true")
    parser.add_argument("--write-doc", type=Path)
    parser.add_argument("--plot", type=Path, help="draw each federation's closest approach to each rule (a PNG)")
    parser.add_argument(
        "--plot-rounds", type=Path, help="draw the harm test and the running opposition round by round (a PNG)"
    )
    parser.add_argument(
        "--reread",
        action="store_true",
        help="read each stored run's outcome again from its workspace in --work and its log in --out (where both are "
        "kept), keeping its exit code, seconds, machine and commit: runs recorded before a figure was kept",
    )
    parser.add_argument("--marker", default=MARKER, help=f"the page's marked block to write (default {MARKER})")
    parser.add_argument("--work", type=Path, help="jobs, workspaces and caches (default: --out)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="federations run at once; each site is a process of about 1.5 GB (a 7-site federation from the stand-in "
        "held 10 GB): three at once on 24 GB had one killed by the kernel's out-of-memory killer (exit 247)",
    )
    parser.add_argument(
        "--stop-starting-after", type=float, default=math.inf, help="seconds after which no federation is started"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or args.out
    store = args.out / "results.json"
    results = json.loads(store.read_text()) if store.is_file() else {}
    if not args.table_only:

        def length(seed: int) -> int:  # the rounds a drawn federation runs: one length a store
            return args.rounds or draw(seed).rounds

        plans = [replace(draw(seed), start=args.start, rounds=length(seed)) for seed in args.seeds]
        mixed = [
            name
            for name, result in results.items()
            if result["federation"].get("start", SCRATCH) != args.start
            or (name != CONSORTIUM and result["federation"]["rounds"] != length(result["federation"]["seed"]))
        ]
        if mixed:  # a stored run is skipped by name: one store, one start and length
            raise SystemExit(f"{store} holds runs of another start or length ({mixed[:3]}): another --out")
        if args.consortium:
            plans.append(Federation(CONSORTIUM, -1, "the consortium job", 3, {}, start=args.start))
        began, lock, ran_on, version = time.perf_counter(), threading.Lock(), machine(), code_version()

        def run(federation: Federation) -> None:
            if time.perf_counter() - began > args.stop_starting_after:
                return
            started = time.perf_counter()
            if federation.name == CONSORTIUM:
                code, log, app = run_consortium(work / "workspaces" / CONSORTIUM, federation.start)
                federation.sites = {site: {"kind": kind, "patients": CONSORTIUM_PATIENTS.get(kind, 100), "labels": None}
                                    for site, kind in CONSORTIUM_SITES.items()}  # fmt: skip
            else:
                folder = work / "jobs" / federation.name
                cache = work / "cache" / federation.name  # its own: federations run at once write no shared index
                job = write_federation_job(federation, folder, cache, args.controller)
                workspace = work / "workspaces" / federation.name
                code, log = run_simulator(job, workspace, timeout=5400)
                app = server_app(workspace, federation.name)
            (args.out / f"{federation.name}.log").write_text(log)
            result = {"federation": asdict(federation), **outcome(app, code, log)}
            with lock:
                seconds = round(time.perf_counter() - started, 1)
                results[federation.name] = {**result, "seconds": seconds, "machine": ran_on, "commit": version}
                print(f"{federation.name}: exit {code}, {results[federation.name]['seconds']} s", flush=True)
                store.write_text(json.dumps(results, indent=2) + "\n")

        with ThreadPoolExecutor(max_workers=max(args.workers, 1)) as pool:
            for done in [pool.submit(run, plan) for plan in plans if plan.name not in results]:
                done.result()
    if args.reread:
        for name, result in results.items():
            app, log = server_app(work / "workspaces" / name, name), args.out / f"{name}.log"
            if app.is_dir() and log.is_file():
                result.update(outcome(app, result["exit_code"], log.read_text()))
                print(f"{name}: read again from {app}", flush=True)
        store.write_text(json.dumps(results, indent=2) + "\n")
    lines = table(results)
    print("\n".join(lines))
    if args.write_doc:
        text = args.write_doc.read_text()
        args.write_doc.write_text(
            rewrite_marked_block(text, f"<!-- {args.marker} -->", f"<!-- /{args.marker} -->", "\n".join(lines))
        )
    if args.plot:
        plot_approaches(results, args.plot)
    if args.plot_rounds:
        plot_by_round(results, args.plot_rounds)
    return results


if __name__ == "__main__":
    main()
