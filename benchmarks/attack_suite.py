"""Hostile sites that know the rules, through FLARE's simulator: what each attack does to the honest sites' models.

Not a test. Each attacker is a site of the job whose client script (the bundle's own, wrapped) alters what it sends;
it has read ``docs/server-checks.md`` and stays inside every bound it describes, using the bundle's own functions
to measure its update as the server will (``core.checks.update_sizes``):

  sign_flip      its honest update negated and scaled, part by part (backbone weights, each head row), to 90 % of
                 the most the server accepts: the cap in round 0 (no typical update exists yet), then the cap or
                 ``update_bound`` times its own honest size (its estimate of the typical update); BatchNorm
                 statistics honest (a flipped variance would be refused)
  ipm            its honest update negated, at its honest size (inner-product manipulation: inside any clipping)
  bn_shift       an honest update, plus 90 % of the BatchNorm statistics' budget spent on one layer's running means
  label_flip     trained honestly on its labels flipped (1 <-> 0): its update looks like any other
  label_flip_quiet  label_flip, reporting no validation figure (so its own validation neither judges nor objects)
  inflated       a free-rider that declares and reports 10^9 training samples, under ``weighting: samples``
  squatting      declares every NIH class it does not label and trains their rows on no positive (every image a
                 negative), honestly otherwise: the rows it gets back tell it which of them the other site labels,
                 and its rows pull those classes' means towards "never"
  lying          sign_flip, and every validation it reports says loss 0 (standard error 0.001), AUROC 1
  colluding      two sign_flip sites of four
  sybil          three sign_flip sites of five (one party, three kits)

Federations (120 patients a site, 64 px, 3 rounds): two sites (the default job, ``site-chexpert`` the attacker),
and four or five NIH-layout sites cut from one embedded dataset (the last sites the attackers). ``clean`` runs
every federation with honest sites only, over ``--seeds``; each attack runs
with the first seed. For each run: the mean AUROC over NIH's classes (every honest site's) of the best model and of
the last one on one external test set (300 embedded MIMIC-layout patients), against the clean runs' lowest; the
exit code; who was rejected, clipped or capped; the disagreement, when the job stopped on one.
An attack **holds** when the honest sites' best and last AUROC are at or above the lowest clean run's; it **fails
closed** when the job stopped non-zero, published nothing and named a site or the disagreement; otherwise it
**breaks through**.

    python benchmarks/attack_suite.py --out results/attack_suite          # about 25 minutes on 2 CPU cores
    python benchmarks/attack_suite.py --out results/attack_suite --table-only --write-doc docs/server-checks.md
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hostile_site import run_simulator

from surgical_aggregation.core.checks import loss_rise
from surgical_aggregation.core.labels import NIH_LABELS
from surgical_aggregation.evaluation.inference import evaluate_models
from surgical_aggregation.experiments.summary import rewrite_marked_block
from surgical_aggregation.flare.recipe import DEMO, SurgicalAggregationRecipe, nih_chexpert_recipe, write_job
from surgical_aggregation.flare.results import HISTORY_FILE
from surgical_aggregation.flare.state import REJECTED_SITES, own_models
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.site_data import resolve_table

PATIENTS, IMAGE_SIZE, ROUNDS = 120, 64, 3
TEST_PATIENTS = 300  # the external test set every honest site is scored on (embedded MIMIC layout, NIH's classes)
CLEAN = "clean"
# attack -> {sites in the federation: how many of them attack}
ATTACKS: dict[str, dict[int, int]] = {
    "sign_flip": {2: 1, 4: 1},
    "ipm": {2: 1, 4: 1},
    "bn_shift": {2: 1},
    "label_flip": {2: 1, 4: 1},
    "label_flip_quiet": {2: 1, 4: 1},
    "inflated": {2: 1},
    "squatting": {2: 1},
    "lying": {2: 1},
    "colluding": {4: 2},
    "sybil": {5: 3},
}
BEHAVIOUR = {"colluding": "sign_flip", "sybil": "sign_flip"}  # what each attacking site of a group does
MARKER = "attack-suite"

# The attacking site's custom/client.py: the bundle's site script with ClientSession wrapped.
ATTACKER_CLIENT = '''"""An attacking site of benchmarks/attack_suite.py (a benchmark double, not part of the product):
the bundle's site script, whose results are altered ({attack!r}) inside every bound docs/server-checks.md states."""

import numpy as np

from surgical_aggregation.core.checks import (
    DEFAULT_UPDATE_BOUND, ROWS, STATISTICS, UPDATE_CAPS, WEIGHTS, clipped_state, row_part, update_sizes,
)
from surgical_aggregation.core.head import NAMED_HEAD
from surgical_aggregation.core.labels import NIH_LABELS
from surgical_aggregation.flare import client
from surgical_aggregation.flare.protocol import META_CLASS_NAMES, META_NUM_SAMPLES

ATTACK = {attack!r}
INSIDE = 0.9  # the share of each bound it uses
INFLATED = 10**9
QUIET = ("val_", "local_val_")  # the metrics a quiet attacker leaves out


def most_accepted(group, honest_size, round_number):
    """90 % of the most the server accepts: the cap, and from round 1 update_bound times the typical update (its
    own honest size the estimate); in round 0 no typical update exists yet."""
    bound = UPDATE_CAPS[group] if round_number == 0 else min(UPDATE_CAPS[group], DEFAULT_UPDATE_BOUND * honest_size)
    return INSIDE * bound


def altered(received, received_classes, sent, sent_classes, round_number):
    keys = [key for key in sent if key not in NAMED_HEAD.keys]
    sizes = update_sizes(sent, sent_classes, received, received_classes, keys)
    if ATTACK in ("sign_flip", "lying", "ipm"):
        factors = {{}}
        parts = [(WEIGHTS, WEIGHTS, sizes.groups.get(WEIGHTS, 0.0))]
        parts += [(row_part(name), ROWS, size) for name, size in sizes.rows.items()]
        for part, group, size in parts:
            if size > 0:
                factors[part] = -1.0 if ATTACK == "ipm" else -most_accepted(group, size, round_number) / size
        return clipped_state(sent, sent_classes, received, received_classes, factors, keys)
    if ATTACK == "bn_shift":
        statistics = [key for key in keys if key.endswith((".running_mean", ".running_var"))]
        norm = float(np.sqrt(sum(np.sum(np.square(received[key], dtype=np.float64)) for key in statistics)))
        target = most_accepted(STATISTICS, sizes.groups.get(STATISTICS, 0.0), round_number) * norm
        layer = sorted(key for key in statistics if key.endswith(".running_mean"))[0]
        shifted = dict(sent)
        shift = np.full(received[layer].shape, target / np.sqrt(received[layer].size))
        shifted[layer] = (received[layer] + shift).astype(received[layer].dtype)
        return shifted
    return sent


_train, _describe, _init = client.ClientSession.train, client.ClientSession.describe, client.ClientSession.__init__


def train(self, received):
    answer = _train(self, received)
    if ATTACK == "inflated":
        answer.params = {{key: np.array(value, copy=True) for key, value in received.params.items()}}
        answer.meta[META_NUM_SAMPLES] = INFLATED
    elif answer.params:
        received_classes = received.meta.get(META_CLASS_NAMES) or self.class_names
        sent_classes, round_number = answer.meta[META_CLASS_NAMES], received.current_round or 0
        answer.params = altered(received.params, received_classes, answer.params, sent_classes, round_number)
    if ATTACK == "label_flip_quiet":
        answer.metrics = {{name: value for name, value in answer.metrics.items() if not name.startswith(QUIET)}}
    if ATTACK == "lying":
        for prefix in ("val", "local_val"):
            lie = {{"_loss": 0.0, "_loss_se": 0.001, "_mean_auroc": 1.0}}
            answer.metrics.update({{prefix + name: value for name, value in lie.items()}})
    return answer


def validate(self, received):
    answer = _validate(self, received)
    if ATTACK == "lying":
        answer.metrics.update({{"val_loss": 0.0, "val_loss_se": 0.001, "val_mean_auroc": 1.0}})
    if ATTACK == "label_flip_quiet":
        answer.metrics = {{name: value for name, value in answer.metrics.items() if not name.startswith(QUIET)}}
    return answer


def describe(self, with_label_counts=False):
    answer = _describe(self, with_label_counts)
    if ATTACK == "inflated":  # the training-set size the server reads at the handshake
        answer.meta[META_NUM_SAMPLES] = INFLATED
        answer.metrics["num_train"] = INFLATED
    return answer


def init(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    if ATTACK in ("label_flip", "label_flip_quiet"):
        for name in self.table.classes:
            self.table.frame[name] = 1.0 - self.table.frame[name]
    if ATTACK == "squatting":  # NIH's classes it lacks, declared, every image a negative
        for name in NIH_LABELS:
            if name not in self.table.classes:
                self.table.classes.append(name)
                self.table.frame[name] = 0.0


_validate = client.ClientSession.validate
client.ClientSession.train, client.ClientSession.validate = train, validate
client.ClientSession.describe, client.ClientSession.__init__ = describe, init
client.main()
'''


@dataclass(frozen=True)
class Case:
    attack: str  # an attack of ATTACKS, or CLEAN
    sites: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.attack}-{self.sites}sites-seed{self.seed}"

    @property
    def attackers(self) -> int:
        return 0 if self.attack == CLEAN else ATTACKS[self.attack][self.sites]


def site_configs(sites: int, seed: int) -> dict[str, dict[str, Any]]:
    """Two sites: the default job's; more: NIH-layout sites, each a part of one embedded dataset."""
    if sites == 2:
        configs = nih_chexpert_recipe().site_configs
        configs = {site: {**config, "embedded": {"patients": PATIENTS}} for site, config in configs.items()}
    else:
        configs = {
            f"site-{index + 1}": DEMO.site_config(
                {"kind": "nih", "partition_count": sites, "partition_index": index},
                embedded={"patients": PATIENTS * sites},
            )
            for index in range(sites)
        }
    return {
        site: {**config, "image_size": IMAGE_SIZE, "seed": seed, "record_exchanges": "off",
               "embedded": {**config["embedded"], "image_size": IMAGE_SIZE}}
        for site, config in configs.items()
    }  # fmt: skip


def attackers_of(case: Case, configs: dict[str, dict]) -> list[str]:
    return sorted(configs)[len(configs) - case.attackers :] if case.sites > 2 else ["site-chexpert"][: case.attackers]


def write_case_job(case: Case, folder: Path, cache: Path) -> tuple[Path, list[str]]:
    """The case's job folder, and its attacking sites."""
    configs = {
        site: {**config, "cache_dir": str(cache)} for site, config in site_configs(case.sites, case.seed).items()
    }
    controller = {"num_rounds": ROUNDS, "patience": ROUNDS, "min_clients": 1, "reject_opposed_updates": True}
    if case.attack == "inflated":
        controller["weighting"] = "samples"
    recipe = SurgicalAggregationRecipe(
        f"attack-{case.sites}", configs, controller=controller, persistor={"seed": case.seed}
    )
    job = write_job(recipe, folder, force=True)
    attackers = attackers_of(case, configs)
    for site in attackers:
        behaviour = BEHAVIOUR.get(case.attack, case.attack)
        (job / f"app_{site}" / "custom" / "client.py").write_text(ATTACKER_CLIENT.format(attack=behaviour))
    return job, attackers


def test_config(cache: Path) -> dict[str, Any]:
    """The test set: embedded MIMIC-layout images of other patients, labelled with NIH's classes (every honest
    site's: site-nih's, or the NIH-layout sites'), all of its rows."""
    config = DEMO.site_config(
        {"kind": "mimic", "labels": list(NIH_LABELS)}, embedded={"patients": TEST_PATIENTS, "image_size": IMAGE_SIZE}
    )
    return {**config, "image_size": IMAGE_SIZE, "cache_dir": str(cache)}


def honest_test_auroc(model: Path, test: dict[str, Any]) -> float:
    """The model's mean AUROC over NIH's classes on the test set (NaN when the job left no such model)."""
    if not model.is_file():
        return math.nan
    config = site_config_from_dict(test, "the attack suite's test set")
    report = evaluate_models([model], resolve_table(config), cache_dir=config.cache_dir, bootstrap=20)
    return report.mean_auroc.estimate


def largest_harm(history: list[dict[str, Any]], honest: set[str]) -> float:
    """The largest rise, in standard errors, of an honest site's validation loss of a global model above its own
    model of the round that made it (the harm rule of ``flare.state.harmed_sites``, which stops a job above
    ``HARM_SIGMAS``), over every round; NaN when none was measured."""
    rises = []
    for entry in history:
        validation = entry.get("validation", {})
        own = own_models(history, entry["round"])
        for site, metrics in {**validation.get(REJECTED_SITES, {}), **validation.get("sites", {})}.items():
            rise = loss_rise(metrics, own.get(site, {})) if site in honest else None
            if rise is not None and rise[1] > 0:
                rises.append(rise[0] / rise[1])
    return max(rises, default=math.nan)


def outcome(workspace: Path, code: int, log: str, test: dict[str, Any], attackers: list[str]) -> dict[str, Any]:
    server = workspace / "server" / "simulate_job" / "app_server"
    history = json.loads((server / HISTORY_FILE).read_text()) if (server / HISTORY_FILE).is_file() else []
    rounds = [entry["aggregation"] for entry in history if "aggregation" in entry]
    rejected = sorted({site for entry in rounds for site in entry.get("rejected", {})})
    clipped = sorted({site for entry in rounds for site in entry.get("clipped", {})})
    capped = sorted({site for entry in rounds for site in entry.get("capped_weights", {})})
    disagreement = re.search(r"the sites disagree about [^:]*", log)
    published = any(workspace.glob("site-*/*/app_site-*/published_global_model.pt"))
    honest = {site.name for site in workspace.glob("site-*")} - set(attackers)
    return {
        "exit_code": code,
        "attackers": attackers,
        "rejected": rejected,
        "clipped": clipped,
        "capped": capped,
        "disagreement": disagreement.group(0) if disagreement else None,
        "published": published,
        "largest_harm": largest_harm(history, honest),
        "best_auroc": honest_test_auroc(server / "best_FL_global_model.pt", test),
        "last_auroc": honest_test_auroc(server / "FL_global_model.pt", test),
    }


def verdict(result: dict[str, Any], clean_floor: tuple[float, float]) -> str:
    best_floor, last_floor = clean_floor
    if result["exit_code"] != 0:
        named = result["disagreement"] or result["rejected"]
        return "fails closed" if named and not result["published"] else "fails open"
    if result["best_auroc"] >= best_floor and result["last_auroc"] >= last_floor:
        return "holds"
    return "breaks through"


def table(results: dict[str, dict]) -> list[str]:
    clean = [result for result in results.values() if result["attack"] == CLEAN]
    floors = {}
    for sites in sorted({result["sites"] for result in clean}):
        runs = [result for result in clean if result["sites"] == sites]
        floors[sites] = (min(r["best_auroc"] for r in runs), min(r["last_auroc"] for r in runs))
    lines = [
        "| attack | sites (attackers) | seed | honest sites' test AUROC: best | last | clean runs' lowest (best, last) "
        "| largest harm (SE) | exit code | rejected | clipped | capped | stopped on a disagreement | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for result in sorted(results.values(), key=lambda r: (r["attack"] != CLEAN, r["attack"], r["sites"], r["seed"])):
        floor = floors.get(result["sites"], (math.nan, math.nan))
        said = "—" if result["attack"] == CLEAN else verdict(result, floor)
        if result["attack"] == CLEAN:
            said = "clean" if result["exit_code"] == 0 else "false alarm"
        lines.append(
            f"| {result['attack']} | {result['sites']} ({len(result['attackers'])}) | {result['seed']} "
            f"| {result['best_auroc']:.3f} | {result['last_auroc']:.3f} | {floor[0]:.3f}, {floor[1]:.3f} "
            f"| {result.get('largest_harm', math.nan):.1f} | {result['exit_code']} "
            f"| {', '.join(result['rejected']) or '—'} | {', '.join(result['clipped']) or '—'} "
            f"| {', '.join(result['capped']) or '—'} | {'yes' if result['disagreement'] else 'no'} | {said} |"
        )
    return lines


def cases(seeds: list[int], attacks: list[str], site_counts: list[int]) -> list[Case]:
    """Every clean federation over ``seeds``, then each attack with the first seed."""
    planned = [Case(CLEAN, sites, seed) for sites in site_counts for seed in seeds]
    planned += [
        Case(attack, sites, seeds[0]) for attack in attacks for sites in ATTACKS[attack] if sites in site_counts
    ]
    return planned


def main(argv: list[str] | None = None) -> dict[str, dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="jobs, workspaces, logs and results.json")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--attacks", nargs="+", choices=list(ATTACKS), default=list(ATTACKS))
    parser.add_argument("--sites", type=int, nargs="+", choices=[2, 4, 5], default=[2, 4, 5])
    parser.add_argument("--table-only", action="store_true", help="only redraw the table of results.json")
    parser.add_argument("--write-doc", type=Path, help=f"rewrite the table between <!-- {MARKER} --> markers")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    store = args.out / "results.json"
    results = json.loads(store.read_text()) if store.is_file() else {}
    if not args.table_only:
        for case in cases(args.seeds, args.attacks, args.sites):
            if case.name in results:
                continue
            started = time.perf_counter()
            job, attackers = write_case_job(case, args.out / "jobs" / case.name, args.out / "cache")
            workspace = args.out / "workspaces" / case.name
            code, log = run_simulator(job, workspace)
            (args.out / f"{case.name}.log").write_text(log)
            results[case.name] = {
                "attack": case.attack,
                "sites": case.sites,
                "seed": case.seed,
                **outcome(workspace, code, log, test_config(args.out / "cache"), attackers),
                "seconds": round(time.perf_counter() - started, 1),
            }
            print(f"{case.name}: {results[case.name]}", flush=True)
            store.write_text(json.dumps(results, indent=2) + "\n")
    lines = table(results)
    print("\n".join(lines))
    if args.write_doc:
        start, end = f"<!-- {MARKER} -->", f"<!-- /{MARKER} -->"
        text = args.write_doc.read_text()
        args.write_doc.write_text(rewrite_marked_block(text, start, end, "\n".join(lines)))
    return results


if __name__ == "__main__":
    main()
