"""The attacks the field benchmarks with, through FLARE's simulator: what each does to the honest sites' models.

Not a test. Each attack is a site of the job whose client script (the bundle's own, wrapped: ``suite_site.py``)
alters what it sends as the attack's paper defines it; it has read ``docs/server-checks.md``, and the omniscient
ones (ByzFL's catalogue: sign flipping, IPM, ALIE, Opt-IPM, Opt-ALIE, Mimic, Inf, Gaussian) read the honest sites'
updates of the round, as their threat model assumes. Data poisoning: label flipping (loud and quiet), a trigger
backdoor, and inflated BatchNorm variances. ``suite_site.py`` describes each.

Federations (100 patients a site, 64 px, 3 rounds: ``--patients`` and ``--rounds`` change them; the product's default
defences): two sites (the default job, ``site-chexpert`` the attacker), and three, four or seven sites of the NIH and
CheXpert layouts (alternating, each a part of one embedded dataset of its layout; the last in name order attack), with
one attacker, and seven with two. Every model is scored on one external test set (300 embedded MIMIC-layout patients
labelled with the 20 classes of both layouts): each honest site on its own classes. The backdoor's success: the share of
the test set's negatives for its target finding, with the trigger stamped, that the model scores above its own 95th
percentile of that finding's scores on the untriggered test images.

Each attack runs against the clean run of the same seed and size, beside a placebo: the same federation with the
attacking sites honest but for their training seed, whose loss against the clean run is how far two runs of one
federation fall apart by chance (the suite's noise floor; an attack's loss inside it says nothing either way). An
attack **holds** when every honest site's best and final AUROC is within :data:`TOLERANCE` of the clean run's (and,
for the backdoor, its success within :data:`BACKDOOR_TOLERANCE` of the clean model's); it **fails closed** when the
job stopped non-zero, published nothing and named why; otherwise it **breaks through**. A backdoor is judged by its
best and its final model's success, each against the reference's; one that holds while its attacker's own last local
model scores the trigger within the same tolerance of the reference **did not take**: the poisoning did not teach even
the attacker's model, and the run says nothing of the defences.

    python benchmarks/attack_suite.py --out results/attack_suite          # about 3 hours on 2 CPU cores
    python benchmarks/attack_suite.py --out results/attack_suite --table-only --write-doc docs/server-checks.md
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hostile_site import direction_check, run_simulator
from suite_site import ADAPTED, ATTACKS, TARGET, TRIGGERS, Wrapped, trigger_of

from surgical_aggregation.core.labels import BUILTIN_VOCABULARY, CHEXPERT_LABELS, NIH_LABELS, union_labels
from surgical_aggregation.core.robust import DEFAULT_RULE
from surgical_aggregation.evaluation.inference import predict_checkpoint, scoring_dataset
from surgical_aggregation.evaluation.metrics import auroc
from surgical_aggregation.experiments.grid_run import code_version, machine
from surgical_aggregation.experiments.summary import rewrite_marked_block
from surgical_aggregation.flare.recipe import (
    DEMO,
    SurgicalAggregationRecipe,
    nih_chexpert_recipe,
    start_settings,
    write_job,
)
from surgical_aggregation.flare.results import HISTORY_FILE
from surgical_aggregation.training.checkpoint import load_checkpoint
from surgical_aggregation.training.config import SiteConfig, site_config_from_dict
from surgical_aggregation.training.profiles import JOB_STARTS, SCRATCH, STAND_IN
from surgical_aggregation.training.site_data import resolve_table

PATIENTS, IMAGE_SIZE, ROUNDS = 100, 64, 3
TEST_PATIENTS = 300
TOLERANCE = 0.05  # the AUROC an honest site may lose to an attack, against the clean run
BACKDOOR_TOLERANCE = 0.05  # the backdoor's success above the clean model's, as a share of the target's negatives
CLEAN = "clean"
ALONE = "honest_alone"  # the same federation without its attacking sites: what a defence that leaves them out gives
# the same federation with its "attacking" sites honest but for their training seed (+ PLACEBO_SEED): an attack that
# does nothing. Its loss against the clean run is the suite's noise floor, what any attack's loss is measured against
PLACEBO = "placebo"
PLACEBO_SEED = 1000
REFERENCES = (CLEAN, ALONE)
# (sites, attackers) of every federation an attack runs in
SETTINGS = ((2, 1), (3, 1), (4, 1), (7, 1), (7, 2))
# backdoor_tuned: the attacker's own training over its site config, the demo profile's (at which from scratch the
# backdoor teaches its own model the trigger; its warm-up at the site config's default rate), 2 local epochs a round;
# backdoor_glyph_tuned: the same, with the glyph trigger
TUNED = {
    "learning_rate": DEMO.training["learning_rate"],
    "warmup_epochs": DEMO.training["warmup_epochs"],
    "warmup_learning_rate": SiteConfig.warmup_learning_rate,
    "local_epochs": 2,
}
ATTACKER_TRAINING = {"backdoor_tuned": TUNED, "backdoor_glyph_tuned": TUNED}
MARKER = "attack-suite"
GLOBAL_MODELS = {"best": "best_FL_global_model.pt", "final": "FL_global_model.pt"}  # in a run's server app folder
UNION = union_labels(NIH_LABELS, CHEXPERT_LABELS)
BENCHMARKS = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Case:
    attack: str  # an attack of suite_site.ATTACKS or ADAPTED, or CLEAN
    sites: int
    attackers: int
    seed: int
    patients: int = PATIENTS  # a site's
    rounds: int = ROUNDS
    start: str = SCRATCH  # where the backbone starts: scratch (FedAvg, the demo's rates) or the stand-in (FedBN+)

    @property
    def name(self) -> str:
        size = "" if (self.patients, self.rounds) == (PATIENTS, ROUNDS) else f"-{self.patients}p{self.rounds}r"
        start = "" if self.start == SCRATCH else f"-{self.start}"
        return f"{self.attack}-{self.sites}sites-{self.attackers}attackers-seed{self.seed}{size}{start}"


def site_configs(sites: int, seed: int, patients: int = PATIENTS, start: str = SCRATCH) -> dict[str, dict[str, Any]]:
    """Two sites: the default job's; more: sites of the NIH and CheXpert layouts, alternating, each a part of one
    embedded dataset of its layout. From the stand-in each fine-tunes at the papers' rates, as the main job does."""
    rates, _, _ = start_settings(start)
    if sites == 2:
        configs = nih_chexpert_recipe(start=start).site_configs
        configs = {site: {**config, "embedded": {"patients": patients}} for site, config in configs.items()}
    else:
        kinds = ["nih" if index % 2 == 0 else "chexpert" for index in range(sites)]
        counts = {kind: kinds.count(kind) for kind in set(kinds)}
        configs, seen = {}, {"nih": 0, "chexpert": 0}
        for kind in kinds:
            seen[kind] += 1
            data = {"kind": kind, "partition_count": counts[kind], "partition_index": seen[kind] - 1}
            configs[f"site-{kind}-{seen[kind]}"] = DEMO.site_config(
                data, embedded={"patients": patients * counts[kind]}, **rates
            )
    return {
        site: {**config, "image_size": IMAGE_SIZE, "seed": seed, "record_exchanges": "off",
               "embedded": {**config["embedded"], "image_size": IMAGE_SIZE}}
        for site, config in configs.items()
    }  # fmt: skip


def attackers_of(case: Case, configs: dict[str, dict]) -> list[str]:
    return ["site-chexpert"][: case.attackers] if case.sites == 2 else sorted(configs)[len(configs) - case.attackers :]


def client_script(role: str, exchange: Path, case: Case, rule: str) -> str:
    return (
        f'"""A site of benchmarks/attack_suite.py ({role}): a benchmark double, not part of the product."""\n\n'
        "import sys\n\n"
        f"sys.path.insert(0, {str(BENCHMARKS)!r})\n\n"
        "from suite_site import main  # noqa: E402\n\n"
        f"main({role!r}, {str(exchange)!r}, {case.sites}, {case.attackers}, {rule!r})\n"
    )


def write_case_job(
    case: Case, folder: Path, cache: Path, exchange: Path, controller: dict, honest: dict | None = None
) -> tuple[Path, list[str]]:
    """The case's job folder, and its attacking sites; ``honest``: site config settings over every honest site's
    (a defence the sites run; an attacker trains as it likes)."""
    sized = site_configs(case.sites, case.seed, case.patients, case.start)
    configs = {site: {**config, "cache_dir": str(cache)} for site, config in sized.items()}
    _, persistor, started = start_settings(case.start)
    settings = {"num_rounds": case.rounds, "patience": case.rounds, "min_clients": 1, **started,
                **controller}  # fmt: skip
    attackers = attackers_of(case, configs)
    tuned = ATTACKER_TRAINING.get(case.attack, {})  # the attacker's own rates, where the attack sets them
    configs = {site: {**config, **(tuned if site in attackers else honest or {})} for site, config in configs.items()}
    if case.attack == PLACEBO:
        configs = {site: {**config, "seed": config["seed"] + PLACEBO_SEED} if site in attackers else config
                   for site, config in configs.items()}  # fmt: skip
    recipe = SurgicalAggregationRecipe(
        f"attack-{case.sites}",
        configs,
        controller=settings,
        persistor={"seed": case.seed, **persistor},
        left_out=attackers if case.attack == ALONE else (),
    )
    job = write_job(recipe, folder, force=True)
    if case.attack not in (CLEAN, ALONE, PLACEBO):
        rule = settings.get("robust_aggregation", DEFAULT_RULE)  # what the omniscient attacks optimise against
        for site in configs:
            role = case.attack if site in attackers else "honest"
            (job / f"app_{site}" / "custom" / "client.py").write_text(client_script(role, exchange, case, rule))
    return job, attackers


def test_config(cache: Path) -> dict[str, Any]:
    """The test set: embedded MIMIC-layout images of other patients, labelled with both layouts' 20 classes."""
    config = DEMO.site_config(
        {"kind": "mimic", "labels": list(UNION)}, embedded={"patients": TEST_PATIENTS, "image_size": IMAGE_SIZE}
    )
    return {**config, "image_size": IMAGE_SIZE, "cache_dir": str(cache)}


class Triggered(Wrapped):
    """A scoring dataset's items with a backdoor's trigger (of ``suite_site.TRIGGERS``) stamped on every image."""

    def __init__(self, dataset: Any, trigger: str = "square") -> None:
        super().__init__(dataset)
        self.stamp = TRIGGERS[trigger]

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = dict(self.dataset[index])
        item["image"] = self.stamp(item["image"].clone())
        return item


def scores(model: Path, test: dict[str, Any]) -> dict[str, Any] | None:
    """Per class AUROC of ``model`` on the test set, and the backdoor's success: the square trigger's, and each
    trigger's by name (None when the job left no model)."""
    if not model.is_file():
        return None
    config = site_config_from_dict(test, "the attack suite's test set")
    table = resolve_table(config)
    checkpoint = load_checkpoint(model)
    dataset, kept = scoring_dataset([checkpoint], table, cache_dir=config.cache_dir)
    names = [BUILTIN_VOCABULARY.canonical(name) for name in checkpoint.class_names]
    probabilities = predict_checkpoint(checkpoint, dataset, 64, "cpu", 0)
    labels, _ = kept.label_matrix(list(UNION), "error")
    per_class = {
        name: auroc(labels[:, index], probabilities[:, names.index(name)])
        for index, name in enumerate(UNION)
        if name in names
    }
    target = names.index(TARGET)
    target_labels = labels[:, list(UNION).index(TARGET)]
    by_trigger = {
        trigger: backdoor_success(
            target_labels,
            probabilities[:, target],
            predict_checkpoint(checkpoint, Triggered(dataset, trigger), 64, "cpu", 0)[:, target],
        )
        for trigger in TRIGGERS
    }
    return {"per_class_auroc": per_class, "backdoor_success": by_trigger["square"], "by_trigger": by_trigger}


def success_of(result: dict[str, Any], attack: str, label: str = "best") -> float:
    """A run's ``label`` (best or final) model's success with ``attack``'s trigger (NaN where it was not scored with
    it: runs recorded before the trigger existed)."""
    trigger = trigger_of(attack)
    if trigger == "square":
        return result[f"{label}_backdoor_success"]
    return result.get(f"{label}_backdoor_success_by_trigger", {}).get(trigger, math.nan)


def backdoor_success(target_labels: np.ndarray, clean: np.ndarray, triggered: np.ndarray) -> float:
    """The share of the target finding's negatives whose triggered image scores above the model's 95th percentile on
    the clean images."""
    threshold = float(np.percentile(clean, 95))
    return float(np.mean(triggered[target_labels == 0] > threshold))


def taking_part(case: Case, configs: dict[str, dict], attackers: list[str]) -> dict[str, dict]:
    """The sites of ``configs`` the case's job runs: all but the attackers where the honest sites run alone (a site
    the job leaves out is not one it failed to hear from)."""
    return {site: config for site, config in configs.items() if case.attack != ALONE or site not in attackers}


def site_classes(sites: list[str], configs: dict[str, dict]) -> dict[str, list[str]]:
    labels = {"nih": NIH_LABELS, "chexpert": CHEXPERT_LABELS}
    return {
        site: [BUILTIN_VOCABULARY.canonical(name) for name in labels[configs[site]["data"]["kind"]]] for site in sites
    }


def _sites_of(aggregation: dict) -> set[str]:
    """The sites a round's aggregation heard from (accepted, rejected, failed, late or left out)."""
    heard = set(aggregation.get("accepted", [])) | set(aggregation.get("missing", []))
    for key in ("rejected", "failed", "excluded"):
        heard |= set(aggregation.get(key, {}))
    return heard


def outcome(
    workspace: Path,
    code: int,
    log: str,
    test: dict,
    attackers: list[str],
    configs: dict,
    trigger: str | None = None,
) -> dict[str, Any]:
    """What a case's run did: the server's decisions, the honest sites' best and final test AUROC and the backdoor's
    success; for a backdoor (``trigger``: its trigger) also each attacker's own last local model's success with it."""
    server = workspace / "server" / "simulate_job" / "app_server"
    history = json.loads((server / HISTORY_FILE).read_text()) if (server / HISTORY_FILE).is_file() else []
    rounds = [entry["aggregation"] for entry in history if "aggregation" in entry]
    honest = sorted(set(configs) - set(attackers))
    classes = site_classes(honest, configs)
    result: dict[str, Any] = {
        "exit_code": code,
        "attacking_sites": attackers,
        "rejected": sorted({site for entry in rounds for site in entry.get("rejected", {})}),
        "rejections": {
            str(entry["round"]): entry["aggregation"].get("rejected", {}) for entry in history if "aggregation" in entry
        },
        "direction_check": direction_check(server),
        "excluded": sorted({site for entry in rounds for site in entry.get("excluded", {})}),
        "published": any(workspace.glob("site-*/*/app_site-*/published_global_model.pt")),
        "stopped": (re.search(r"the job cannot go on: ([^\n]*)", log) or [None, None])[1],
        "rounds": len(rounds),
        # each site's shared head rows (three or more holders) against their consensus, by round: a record
        "row_agreement": {str(index): entry.get("row_agreement", {}) for index, entry in enumerate(rounds)},
        "shared_rows": {str(index): entry.get("shared_rows", {}) for index, entry in enumerate(rounds)},
        "row_turns": {str(index): entry.get("row_turns", {}) for index, entry in enumerate(rounds)},
        "two_sites": {str(index): entry.get("two_sites", {}) for index, entry in enumerate(rounds)},
        # each site's backbone update against the round's consensus (cosine), by round: what the direction check read
        "directions": {
            str(entry["round"]): entry["aggregation"].get("directions", {})
            for entry in history
            if "aggregation" in entry
        },
        # each site judged before: its running opposition (the CUSUM of its cosines) after the round, by round
        "opposition": {
            str(entry["round"]): entry["aggregation"].get("opposition", {})
            for entry in history
            if "aggregation" in entry
        },
        # every site's validation figures of each round's candidate (what the server's harm tests read), by round
        "validations": {
            str(entry["round"]): dict(entry["validation"].get("sites", {}))
            for entry in history
            if "validation" in entry
        },
        # sites the job never heard from (FLARE's simulator can fail to start a site's script, "Can not find
        # client.py", when the machine is loaded): such a run is not the federation the case describes
        "absent": sorted(set(configs) - {site for entry in rounds for site in _sites_of(entry)}) if rounds else [],
    }
    for label, found in global_scores(server, test).items():
        result[f"{label}_backdoor_success"] = found["backdoor_success"] if found else math.nan
        result[f"{label}_backdoor_success_by_trigger"] = found["by_trigger"] if found else {}
        result[f"{label}_auroc"] = {
            site: float(np.nanmean([found["per_class_auroc"].get(name, math.nan) for name in names]))
            if found
            else math.nan
            for site, names in classes.items()
        }
    if trigger:  # whether the attack taught its own model the trigger: else no defence was tested
        result["attackers_own_backdoor_success"] = attackers_own_success(workspace, attackers, trigger, test)
    return result


def global_scores(server: Path, test: dict) -> dict[str, dict[str, Any] | None]:
    """:func:`scores` of a run's best and final global models (``server``: its server app folder), by label."""
    return {label: scores(server / file, test) for label, file in GLOBAL_MODELS.items()}


def backdoor_trigger(attack: str) -> str | None:
    """The trigger a backdoor attack stamps, or None for any other attack."""
    return trigger_of(attack) if attack.startswith("backdoor") else None


def attackers_own_success(workspace: Path, attackers: list[str], trigger: str, test: dict) -> dict[str, float]:
    """Each attacker's own last local model's success with ``trigger`` (NaN where it left none)."""
    found = {
        site: scores(workspace / site / "simulate_job" / f"app_{site}" / "local_model.pt", test) for site in attackers
    }
    return {site: (score or {}).get("by_trigger", {}).get(trigger, math.nan) for site, score in found.items()}


def verdict(result: dict[str, Any], reference: dict[str, Any] | None) -> str:
    """Against ``reference`` (the clean run, or the honest sites alone): holds, fails closed, breaks through, or (a
    backdoor that held only because its attacker's own model never learned the trigger) did not take."""
    if result["exit_code"] != 0:
        return "fails closed" if result["stopped"] and not result["published"] else "fails open"
    if reference is None:
        return "no reference run"
    if result["attack"].startswith("backdoor") and math.isnan(success_of(reference, result["attack"])):
        return "no reference run"  # the reference was not scored with this trigger
    worst = lowest_margin(result, reference)
    backdoor = backdoor_above(result, reference)
    if worst >= -TOLERANCE and (not result["attack"].startswith("backdoor") or backdoor <= BACKDOOR_TOLERANCE):
        return "did not take" if not_taken(result, reference) else "holds"
    return "breaks through"


def backdoor_above(result: dict[str, Any], reference: dict[str, Any]) -> float:
    """How far a run's backdoor success (its attack's trigger) lies above the reference's, the larger of its best
    model's against the reference's best and its final model's against the reference's final: both models are
    judged, as the AUROC is."""
    above = [
        success_of(result, result["attack"], label) - success_of(reference, result["attack"], label)
        for label in ("best", "final")
    ]
    return max((value for value in above if not math.isnan(value)), default=math.nan)


def not_taken(result: dict[str, Any], reference: dict[str, Any]) -> bool:
    """A backdoor whose attackers' own last local models (one round's training from the round's global model) score
    its trigger within :data:`BACKDOOR_TOLERANCE` of the reference's best global model: the poisoning did not teach
    even the attacker's model, so the run says nothing of the defences (runs recorded before the attackers' own
    success was measured, and attackers with no local model, count as taken)."""
    own = result.get("attackers_own_backdoor_success") if result["attack"].startswith("backdoor") else None
    return bool(own) and max(own.values()) - success_of(reference, result["attack"]) <= BACKDOOR_TOLERANCE


def lowest_margin(result: dict[str, Any], reference: dict[str, Any]) -> float:
    """The largest loss of an honest site's best or final AUROC against ``reference``, as a negative number."""
    margins = [
        result[f"{label}_auroc"][site] - reference[f"{label}_auroc"][site]
        for label in ("best", "final")
        for site in result[f"{label}_auroc"]
        if site in reference[f"{label}_auroc"]
    ]
    return min(margins, default=math.nan)


def clean_of(results: dict[str, dict], case: dict[str, Any]) -> dict[str, Any] | None:
    return results.get(Case(CLEAN, case["sites"], 0, case["seed"], *_size(case)).name)


def judged_against_alone(sites: int) -> bool:
    """Whether a run of ``sites`` sites is judged against its honest sites alone too: not at two sites, where no rule
    comparing the two can tell which attacks and the best the server can do where they disagree is fail closed; there
    the clean run alone judges (holds or fails closed), the honest site alone being one site training by itself (from
    scratch at the suite's size it beats the clean federation, so even the placebo would break through against it)."""
    return sites > 2


def alone_of(results: dict[str, dict], case: dict[str, Any]) -> dict[str, Any] | None:
    return results.get(Case(ALONE, case["sites"], case["attackers"], case["seed"], *_size(case)).name)


def _size(case: dict[str, Any]) -> tuple[int, int, str]:
    """A recorded run's patients a site, rounds and start (runs recorded before these were options: the defaults)."""
    return case.get("patients", PATIENTS), case.get("job_rounds", ROUNDS), case.get("start", SCRATCH)


def setting_of(case: dict[str, Any]) -> str:
    """``3 (1)``: sites (attackers), with the size where it is not the default's (``3 (1; 400 patients, 5 rounds)``)."""
    patients, rounds, start = _size(case)
    size = "" if (patients, rounds) == (PATIENTS, ROUNDS) else f"; {patients} patients, {rounds} rounds"
    size += "" if start == SCRATCH else f"; from the {start}"
    return f"{case['sites']} ({case['attackers']}{size})"


def _lowest(result: dict[str, Any], label: str) -> float:
    return min(result[f"{label}_auroc"].values(), default=math.nan)


def table(results: dict[str, dict]) -> list[str]:
    """One row per run: the honest sites' lowest best and final AUROC, the largest loss of one against the clean run
    and against the honest sites alone, the backdoor's success, what the server did, and the verdicts."""
    lines = [
        "| attack | sites (attackers) | honest sites' lowest AUROC: best, final | largest loss against the clean run "
        "| against the honest sites alone | backdoor success: best, final | exit code | rejected | excluded | stopped "
        "| verdict (clean run) | verdict (honest alone) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    order = {CLEAN: 0, ALONE: 1, PLACEBO: 2}
    for result in sorted(
        results.values(),
        key=lambda r: (order.get(r["attack"], 3), r["attack"], r["sites"], r["attackers"], _size(r)),
    ):
        clean, alone = clean_of(results, result), alone_of(results, result)
        reference_run = result["attack"] in REFERENCES
        if reference_run:
            said = ("runs" if result["exit_code"] == 0 else "false alarm", "")
        else:
            said = (verdict(result, clean), verdict(result, alone) if judged_against_alone(result["sites"]) else "")
        against = [
            "—" if reference_run or other is None else _shown(lowest_margin(result, other), "+.3f")
            for other in (clean, alone if judged_against_alone(result["sites"]) else None)
        ]
        stopped = (result["stopped"] or "")[:80]
        lowest = [_shown(_lowest(result, label), ".3f") for label in ("best", "final")]
        success = [_shown(success_of(result, result["attack"], label), ".3f") for label in ("best", "final")]
        lines.append(
            f"| {result['attack']} | {setting_of(result)} "
            f"| {', '.join(lowest)} | {against[0]} | {against[1]} "
            f"| {', '.join(success)} "
            f"| {result['exit_code']} "
            f"| {', '.join(result['rejected']) or '—'} "
            f"| {', '.join(result['excluded']) or '—'} | {stopped or '—'} | {said[0]} | {said[1] or '—'} |"
        )
    return lines


def _shown(value: float, spec: str) -> str:
    """A table's figure; "—" where there is none (a run that published nothing has no AUROC)."""
    return "—" if math.isnan(value) else format(value, spec)


PAIRED_MARKER = "paired-seeds"


def paired_table(with_rule: dict[str, dict], without_rule: dict[str, dict], attack: str) -> list[str]:
    """Per setting and seed, ``attack`` run under two versions of the rules (each dict holds the runs of one version;
    ``with_rule`` also the clean runs both are measured against): the largest loss of an honest site's best test
    AUROC against the clean run under each, and how many head rows the newer one took from one holder."""
    lines = [
        f"| {attack}: sites (attackers), seed | clean run (lowest honest) | with the rule: largest loss "
        "| without it | rows taken from one holder (all rounds) |",
        "| --- | --- | --- | --- | --- |",
    ]
    losses: dict[str, list[float]] = {"with": [], "without": []}
    for result in sorted(
        (result for result in with_rule.values() if result["attack"] == attack),
        key=lambda r: (r["sites"], r["attackers"], r["seed"]),
    ):
        clean = clean_of(with_rule, result)
        earlier = next(
            (other for other in without_rule.values()
             if (other["attack"], other["sites"], other["attackers"], other["seed"])
             == (attack, result["sites"], result["attackers"], result["seed"])),
            None,
        )  # fmt: skip
        if clean is None or earlier is None:
            continue
        losses["with"].append(lowest_margin(result, clean))
        losses["without"].append(lowest_margin(earlier, clean))
        # runs of stops 61-62, under the rule for a row two sites hold (removed since): the rows it took from one holder
        taken = sum(len(rows) for rows in result.get("trusted_rows", {}).values())
        lines.append(
            f"| {result['sites']} ({result['attackers']}), {result['seed']} | {_lowest(clean, 'best'):.3f} "
            f"| {losses['with'][-1]:+.3f} | {losses['without'][-1]:+.3f} | {taken} |"
        )
    if losses["with"]:
        means = [f"{np.mean(values):+.3f}" for values in losses.values()]
        lines.append(f"| mean of {len(losses['with'])} | | {means[0]} | {means[1]} | |")
    return lines


RULES_MARKER = "rules"
# the settings (sites, at the suite's default size) and attacks docs/server-checks.md compares the rules on
RULES_SITES, RULES_ATTACKS = (3, 4, 7), ("mimic_noised", "label_flip", "label_flip_late")


def rules_table(runs_by_rule: dict[str, dict[str, dict]], sites: Sequence[int], attacks: list[str]) -> list[str]:
    """The same federations under several aggregation rules: for each rule, number of ``sites`` and seed with a clean
    run at the suite's default size, its lowest honest site, the honest sites alone's, and each attack's largest loss
    against both (with its verdict against the clean run; "—" where that attack did not run under that rule)."""
    header = ["rule", "sites", "seed", "clean run: lowest honest site", "honest sites alone"]
    header += [f"{attack}: against the clean run, the honest sites alone" for attack in attacks]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for rule, runs in runs_by_rule.items():
        cleans = [
            run for run in runs.values()
            if run["attack"] == CLEAN and run["sites"] in sites and _size(run) == (PATIENTS, ROUNDS, SCRATCH)
        ]  # fmt: skip
        for clean in sorted(cleans, key=lambda run: (run["sites"], run["seed"])):
            alone = alone_of(runs, {**clean, "attackers": 1})
            cells = [rule, str(clean["sites"]), str(clean["seed"]), f"{_lowest(clean, 'best'):.3f}"]
            cells.append(f"{_lowest(alone, 'best'):.3f}" if alone else "—")
            for attack in attacks:
                run = runs.get(Case(attack, clean["sites"], 1, clean["seed"], PATIENTS, ROUNDS).name)
                if run is None or alone is None:
                    cells.append("—")
                    continue
                cells.append(
                    f"{lowest_margin(run, clean):+.3f}, {lowest_margin(run, alone):+.3f} ({verdict(run, clean)})"
                )
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_block(page: Path, marker: str, lines: list[str]) -> None:
    """Rewrite ``page``'s block between ``<!-- marker -->`` and ``<!-- /marker -->`` with ``lines``."""
    start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    page.write_text(rewrite_marked_block(page.read_text(), start, end, "\n".join(lines)))


def plot(results: dict[str, dict], path: Path) -> Path:
    """Two cells per attack and setting: the largest loss of an honest site's best or final test AUROC against the
    clean run, and against the honest sites training alone (what a defence that leaves the attackers out gives; red
    below -TOLERANCE); each cell names its verdict (H holds, C fails closed, X breaks through, N did not take) and,
    for a backdoor, its success above the reference's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    attacked = [result for result in results.values() if result["attack"] not in REFERENCES]
    attacks = sorted({result["attack"] for result in attacked})
    settings = sorted({(result["sites"], result["attackers"], *_size(result)) for result in attacked})
    references = (("clean run", clean_of), ("honest alone", alone_of))
    columns = [
        (setting, label, find)
        for setting in settings
        for label, find in references
        if find is clean_of or judged_against_alone(setting[0])
    ]
    margins = np.full((len(attacks), len(columns)), np.nan)
    texts = [["" for _ in columns] for _ in attacks]
    short = {"holds": "H", "fails closed": "C", "breaks through": "X", "fails open": "X!", "no reference run": "?",
             "did not take": "N"}  # fmt: skip
    for result in attacked:
        row = attacks.index(result["attack"])
        for column, (setting, _, find) in enumerate(columns):
            if setting != (result["sites"], result["attackers"], *_size(result)):
                continue
            reference = find(results, result)
            text = short.get(verdict(result, reference), "?")
            if reference is not None and result["exit_code"] == 0:
                margins[row, column] = lowest_margin(result, reference)
                text += f" {margins[row, column]:+.2f}"
                if result["attack"].startswith("backdoor"):
                    text += f"\nbd {backdoor_above(result, reference):+.2f}"
            texts[row][column] = text
    figure, axis = plt.subplots(figsize=(1.8 + 1.2 * len(columns), 1.0 + 0.42 * len(attacks)))
    image = axis.imshow(margins, cmap="RdYlGn", vmin=-3 * TOLERANCE, vmax=3 * TOLERANCE, aspect="auto")
    for row in range(len(attacks)):
        for column in range(len(columns)):
            axis.text(column, row, texts[row][column], ha="center", va="center", fontsize=7)
    labels = [
        f"{sites} sites, {count} hostile"
        + ("" if (patients, rounds) == (PATIENTS, ROUNDS) else f"\n{patients}p, {rounds}r")
        + ("" if start == SCRATCH else f"\nfrom the {start}")
        + f"\nvs {label}"
        for (sites, count, patients, rounds, start), label, _ in columns
    ]
    axis.set_xticks(range(len(columns)), labels, fontsize=7)
    axis.set_yticks(range(len(attacks)), attacks, fontsize=8)
    axis.set_title(f"honest sites' largest test-AUROC loss (tolerance {TOLERANCE})", fontsize=8)
    axis.set_xlabel(
        "H holds, C fails closed, X breaks through, N did not take (not even at the attacker)\n"
        "bd: backdoor success above the reference's",
        fontsize=7,
    )
    figure.colorbar(image, ax=axis, shrink=0.8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def cases(
    seeds: list[int],
    attacks: list[str],
    settings: list[tuple[int, int]],
    patients: int = PATIENTS,
    rounds: int = ROUNDS,
    references: Sequence[str] = (ALONE, PLACEBO),
    start: str = SCRATCH,
) -> list[Case]:
    """The clean run of every size and seed, the ``references`` beside it, then each attack in each setting with
    each seed."""
    sizes = sorted({sites for sites, _ in settings})
    size = (patients, rounds, start)
    planned = [Case(CLEAN, sites, 0, seed, *size) for seed in seeds for sites in sizes]
    planned += [
        Case(kind, sites, count, seed, *size)
        for seed in seeds for kind in references for sites, count in settings
    ]  # fmt: skip
    planned += [
        Case(attack, sites, count, seed, *size)
        for seed in seeds for attack in attacks for sites, count in settings
    ]  # fmt: skip
    return planned


ATTEMPTS = 3  # runs of a case whose federation lost a site before it began


def parse_setting(text: str) -> tuple[int, int]:
    sites, attackers = (int(part) for part in text.split(":"))
    return sites, attackers


def main(argv: list[str] | None = None) -> dict[str, dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="jobs, workspaces, logs and results.json")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--attacks", nargs="+", choices=[*ATTACKS, *ADAPTED], default=list(ATTACKS))
    parser.add_argument(
        "--settings", type=parse_setting, nargs="+", default=list(SETTINGS), help="sites:attackers, e.g. 3:1 7:2"
    )
    parser.add_argument("--patients", type=int, default=PATIENTS, help=f"a site's patients (default {PATIENTS})")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"the job's rounds (default {ROUNDS})")
    parser.add_argument(
        "--references",
        nargs="*",
        choices=[ALONE, PLACEBO],
        default=[ALONE, PLACEBO],
        help="the runs beside the clean one (default both; the clean run always runs: the verdicts need it)",
    )
    parser.add_argument("--controller", type=json.loads, default={}, help="controller settings over the defaults")
    parser.add_argument(
        "--honest-sites",
        type=json.loads,
        default={},
        help="site config settings over every honest site's (a defence the sites run; the attackers train as they "
        "like); stop 91's patch hardening ran so, with the code of commit 840e99f",
    )
    parser.add_argument(
        "--start",
        choices=JOB_STARTS,
        default=SCRATCH,
        help=f"where the backbone starts (default {SCRATCH}: FedAvg at the demo's rates; {STAND_IN}: the offline "
        "stand-in for ImageNet weights, FedBN+ at the papers' fine-tuning rates, as the main job)",
    )
    parser.add_argument("--table-only", action="store_true", help="only redraw the table of results.json")
    parser.add_argument(
        "--rescore",
        nargs="+",
        metavar="RUN",
        help="score these recorded runs' best and final models again with every trigger (their workspaces under "
        "--out), keeping the rest of their records, before the cases run",
    )
    parser.add_argument("--write-doc", type=Path, help="rewrite the table between the --marker's markers")
    parser.add_argument(
        "--marker", default=MARKER, help=f"the markers' name: <!-- NAME --> and <!-- /NAME --> (default {MARKER})"
    )
    parser.add_argument(
        "--paired",
        type=Path,
        help="only draw the table of a JSON file of runs under two versions of the rules "
        f'({{"attack": ..., "with_rule": {{...}}, "without_rule": {{...}}}}), between <!-- {PAIRED_MARKER} --> markers',
    )
    parser.add_argument(
        "--rules",
        nargs="+",
        metavar="RULE=RESULTS",
        help="only draw the table of the same federations under several rules (each a results.json of runs under "
        f"RULE; one rule may name several files), {', '.join(map(str, RULES_SITES))} sites, between "
        f"<!-- {RULES_MARKER} --> markers",
    )
    args = parser.parse_args(argv)
    if args.rules:
        runs_by_rule: dict[str, dict[str, dict]] = {}
        for item in args.rules:
            rule, _, path = item.partition("=")
            runs_by_rule.setdefault(rule, {}).update(json.loads(Path(path).read_text()))
        lines = rules_table(runs_by_rule, RULES_SITES, list(RULES_ATTACKS))
        print("\n".join(lines))
        if args.write_doc:
            write_block(args.write_doc, RULES_MARKER, lines)
        return runs_by_rule
    # absolute: the jobs' site configs and attackers' scripts name paths under it, and a relative one would be read
    # from each site's own folder (the attackers then wait for honest updates written elsewhere)
    if args.paired:
        paired = json.loads(args.paired.read_text())
        lines = paired_table(paired["with_rule"], paired["without_rule"], paired["attack"])
        print("\n".join(lines))
        if args.write_doc:
            write_block(args.write_doc, PAIRED_MARKER, lines)
        return paired
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    store = args.out / "results.json"
    results = json.loads(store.read_text()) if store.is_file() else {}
    for name in args.rescore or []:
        workspace = args.out / "workspaces" / name
        server = workspace / "server" / "simulate_job" / "app_server"
        if name not in results or not (server / "FL_global_model.pt").is_file():
            parser.error(f"--rescore {name}: no such run in {store} with its workspace under {args.out / 'workspaces'}")
        test = test_config(args.out / "cache")
        for label, found in global_scores(server, test).items():
            results[name][f"{label}_backdoor_success_by_trigger"] = found["by_trigger"] if found else {}
        trigger = backdoor_trigger(results[name]["attack"])
        if trigger:  # the attackers' own models, with their trigger
            results[name]["attackers_own_backdoor_success"] = attackers_own_success(
                workspace, results[name]["attacking_sites"], trigger, test
            )
        store.write_text(json.dumps(results, indent=2) + "\n")
        print(f"{name}: rescored: {results[name]['best_backdoor_success_by_trigger']}", flush=True)
    if not args.table_only:
        test = test_config(args.out / "cache")
        ran_on, version = machine(), code_version()  # each record names the machine and the code that made it
        for case in cases(
            args.seeds, args.attacks, args.settings, args.patients, args.rounds, args.references, args.start
        ):
            if case.name in results:
                continue
            started = time.perf_counter()
            exchange = args.out / "exchange" / case.name
            for attempt in range(1, ATTEMPTS + 1):
                shutil.rmtree(exchange, ignore_errors=True)
                job, attackers = write_case_job(
                    case,
                    args.out / "jobs" / case.name,
                    args.out / "cache",
                    exchange,
                    args.controller,
                    args.honest_sites,
                )
                workspace = args.out / "workspaces" / case.name
                shutil.rmtree(workspace, ignore_errors=True)
                code, log = run_simulator(job, workspace, timeout=5400)
                (args.out / f"{case.name}.log").write_text(log)
                sized = site_configs(case.sites, case.seed, case.patients, case.start)
                taking = taking_part(case, sized, attackers)
                found = outcome(workspace, code, log, test, attackers, taking, backdoor_trigger(case.attack))
                if not found["absent"]:
                    break
                print(f"{case.name}: attempt {attempt}: {found['absent']} never took part; run again", flush=True)
            results[case.name] = {
                "attack": case.attack,
                "sites": case.sites,
                "attackers": case.attackers,
                "seed": case.seed,
                "patients": case.patients,
                "job_rounds": case.rounds,  # planned ("rounds": those the job ran)
                "start": case.start,
                "controller": args.controller,
                **({"honest_sites": args.honest_sites} if args.honest_sites else {}),
                **found,
                "seconds": round(time.perf_counter() - started, 1),
                "machine": ran_on,
                "commit": version,
            }
            shutil.rmtree(exchange, ignore_errors=True)
            print(f"{case.name}: {json.dumps(results[case.name])}", flush=True)
            store.write_text(json.dumps(results, indent=2) + "\n")
    lines = table(results)
    print("\n".join(lines))
    if results:
        print(f"plot: {plot(results, args.out / 'margins.png')}")
    if args.write_doc:
        write_block(args.write_doc, args.marker, lines)
    return results


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
