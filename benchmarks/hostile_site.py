"""A hostile site in the default job: three attacks against the honest reference, in FLARE's simulator.

Not a test (``tests/test_flare_e2e.py`` runs one attack on a tiny job). It runs the default job
(``jobs/nih_chexpert``'s recipe) once per case with ``site-chexpert``'s client script wrapped so that its
training results are altered before they are sent:

  withheld              every result of the site is rejected for its structure (a key left out): the same job
                        without that site's contributions, the reference the attacks are held to
  x5                    the site's update scaled by 5
  flip_x5               the site's update negated and scaled by 5
  negative_running_var  four channels of one running variance negative, the rest of the update honest
  honest                the site as it is (the job as the README runs it)

More alterations serve ``tests/test_defences_e2e.py`` and ``tests/test_blind_e2e.py`` (each defence of
docs/server-checks.md through the simulator), not this benchmark: ``flip_x2`` (the update negated and doubled;
``flip_x2_quiet``: the same, reporting no metric at all),
``x3_claiming_1e9`` (the update plus itself shifted by one entry, tripled, and 10^9 training samples claimed at the
handshake and with every result), ``poisoned_rows`` (an honest backbone and honest head weights, every head row's bias
raised by 90 % of what the rows' cap allows: inside every bound, every output pushed towards "present") and
``poisoned_rows_quiet`` (the same, reporting no metric at all), ``rows_inverted`` (an honest backbone and BatchNorm
statistics, every head row's update negated: what training on inverted labels does to the rows).

The job runs with ``min_clients: 1``, so that a round in which only the honest site's result is valid still
updates the model (with the job's ``min_clients: 2``, a two-site federation whose other site is rejected every
round ends without progress, exit code 2, naming that site and its reason). For each case: the simulator's exit
code, how each of the site's results fared, whether the published model is finite, and its validation loss (the
sites' mean, as the job selects) against the withheld run's. The issue's acceptance: every attacked job completes
with a finite published model whose loss is no worse than the withheld run's by more than 0.01.

    python benchmarks/hostile_site.py --out results/hostile_site   # about 8 minutes on 2 CPU cores
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from surgical_aggregation.data.storage import CACHE_ENV
from surgical_aggregation.flare.client import PUBLISHED_MODEL_FILE
from surgical_aggregation.flare.controller import SurgicalAggregatorShareable
from surgical_aggregation.flare.recipe import SurgicalAggregationRecipe, nih_chexpert_recipe, write_job
from surgical_aggregation.flare.results import HISTORY_FILE
from surgical_aggregation.training.checkpoint import load_checkpoint
from surgical_aggregation.training.profiles import SCRATCH

ATTACKS = ("withheld", "x5", "flip_x5", "negative_running_var", "honest")
# the e2e tests' doubles
TEST_ATTACKS = ("flip_x2", "flip_x2_quiet", "x3_claiming_1e9", "poisoned_rows", "poisoned_rows_quiet", "rows_inverted")
HOSTILE_SITE = "site-chexpert"

# The hostile site's custom/client.py: the bundle's site script with ClientSession.train wrapped.
HOSTILE_CLIENT = '''"""A hostile site (a benchmark and test double, not part of the product): the bundle's site
script, whose training results are altered ({attack!r}) before they are sent."""

import numpy as np

from surgical_aggregation.core.head import NAMED_HEAD
from surgical_aggregation.flare import client
from surgical_aggregation.flare.protocol import META_NUM_SAMPLES

ATTACK = {attack!r}
FACTORS = {{"x5": 5.0, "flip_x5": -5.0, "flip_x2": -2.0, "flip_x2_quiet": -2.0, "x3_claiming_1e9": 3.0}}
QUIET = ATTACK.endswith("_quiet")  # it reports no metric at all
TEST_DOUBLES = {test_attacks!r}  # their BatchNorm statistics are honest
CLAIMED = 10**9


def altered(received, sent):
    sent = dict(sent)
    if ATTACK == "withheld":
        del sent[NAMED_HEAD.bias_key]
    elif ATTACK in FACTORS:
        factor = FACTORS[ATTACK]
        for key, value in sent.items():
            if ATTACK in TEST_DOUBLES and key.endswith((".running_mean", ".running_var")):
                continue  # scaled statistics would be refused for negative variances before any defence acts
            if np.issubdtype(value.dtype, np.floating):
                change = value - received[key]
                if ATTACK == "x3_claiming_1e9":  # skewed: after clipping it still differs from an honest update
                    change = change + np.roll(change, 1)
                sent[key] = (received[key] + factor * change).astype(value.dtype)
    elif ATTACK.startswith("poisoned_rows"):  # the bias up by 90 % of the cap: 10 x the row's size, at least 0.1
        weight, bias = (received[key].astype(np.float64) for key in NAMED_HEAD.keys)
        size = np.maximum(np.sqrt(np.sum(weight**2, axis=1) + bias**2), 0.1)
        sent[NAMED_HEAD.bias_key] = (bias + 0.9 * 10 * size).astype(sent[NAMED_HEAD.bias_key].dtype)
    elif ATTACK == "rows_inverted":
        for key in NAMED_HEAD.keys:
            sent[key] = (2 * received[key].astype(np.float64) - sent[key]).astype(sent[key].dtype)
    elif ATTACK == "negative_running_var":
        key = sorted(key for key in sent if key.endswith(".running_var"))[0]
        variance = sent[key].copy()
        variance[:4] = -variance[:4]
        sent[key] = variance
    return sent


_train = client.ClientSession.train


def train(self, received):
    answer = _train(self, received)
    answer.params = altered(received.params, answer.params)
    if ATTACK == "x3_claiming_1e9":
        answer.meta[META_NUM_SAMPLES] = CLAIMED
    if QUIET:
        answer.metrics = {{}}
    return answer


def validate(self, received):
    answer = _validate(self, received)
    if QUIET:  # FLARE sends no FLModel that has neither params nor metrics
        answer.params, answer.metrics = {{}}, {{}}
    return answer


def describe(self, with_label_counts=False):
    answer = _describe(self, with_label_counts)
    if ATTACK == "x3_claiming_1e9":  # the training-set size the server reads at the handshake
        answer.meta[META_NUM_SAMPLES] = CLAIMED
        answer.metrics["num_train"] = CLAIMED
    return answer


_train, _describe, _validate = client.ClientSession.train, client.ClientSession.describe, client.ClientSession.validate
client.ClientSession.train, client.ClientSession.describe = train, describe
client.ClientSession.validate = validate
client.main()
'''


def write_hostile_job(recipe: SurgicalAggregationRecipe, folder: Path, attack: str, site: str = HOSTILE_SITE) -> Path:
    """``recipe``'s job folder with ``site``'s client script replaced by the hostile one."""
    return write_job_with_hostile_sites(recipe, folder, {site: attack})


def write_job_with_hostile_sites(recipe: SurgicalAggregationRecipe, folder: Path, attacks: dict[str, str]) -> Path:
    """``recipe``'s job folder with each site of ``attacks`` (site -> attack) running the hostile client script."""
    unknown = sorted(set(attacks.values()) - set(ATTACKS) - set(TEST_ATTACKS))
    if unknown:
        raise ValueError(f"unknown attack(s) {unknown}; one of {ATTACKS + TEST_ATTACKS}")
    job = write_job(recipe, folder, force=True)  # the benchmark's own folder: its last hostile job is replaced
    for site, attack in attacks.items():
        if attack != "honest":
            script = HOSTILE_CLIENT.format(attack=attack, test_attacks=TEST_ATTACKS)
            (job / f"app_{site}" / "custom" / "client.py").write_text(script)
    return job


# FLARE's simulator starts each site's process, then must connect to it within 60 s on a port it found free a moment
# before (``simulator_runner.do_one_task``; ``nvflare simulator`` offers no way to lengthen it). On a loaded machine,
# or when another run takes that port, the site's thread ends with this error and the job goes on without the site: a
# different federation from the one asked for. (The thread's other errors, ``run_client_thread error: ...``, are not
# this one: the run is not repeated for them.)
CLIENT_START_FAILURE = "Failed to create connection to the child process"


def run_simulator(
    job: Path, workspace: Path, *extra: str, timeout: int = 1800, cache: Path | None = None
) -> tuple[int, str]:
    """``nvflare simulator <job> -w <workspace>`` with the sites in parallel threads: (exit code, output).
    ``cache``: the preprocessing cache's root (``CACHE_ENV``) when not the default."""
    nvflare = Path(sys.executable).parent / "nvflare"
    # FLARE's own script, or its module where FLARE was installed without scripts (``pip install --target``)
    command = [str(nvflare)] if nvflare.is_file() else [sys.executable, "-m", "nvflare.cli"]
    threads = str(len([app for app in job.iterdir() if app.name.startswith("app_site")]))
    env = {**os.environ, "PATH": f"{nvflare.parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    if cache is not None:
        env[CACHE_ENV] = str(cache)
    for attempt in range(2):
        result = subprocess.run(
            [*command, "simulator", str(job), "-w", str(workspace), "-t", threads, *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        output = result.stdout + result.stderr
        if CLIENT_START_FAILURE not in output or attempt:
            break
        # not the job's doing: the same job again, once, in a fresh workspace (the failed one kept beside it)
        kept = workspace.with_name(f"{workspace.name}.client-start-failed")
        shutil.rmtree(kept, ignore_errors=True)  # an earlier run's, of the same workspace
        workspace.rename(kept)
        print(f"FLARE's simulator lost a site at its start: running {job.name} again", flush=True)
    return result.returncode, output


def direction_check(app_server: Path) -> bool | str | None:
    """The run's ``reject_opposed_updates`` as its server ran it (``app_server``: the server's app folder; the
    controller's default where the job leaves it out), so that a record says which rule judged it; None: no job."""
    config = app_server / "config" / "config_fed_server.json"
    if not config.is_file():
        return None
    workflow = json.loads(config.read_text())["workflows"][0]["args"]
    default = inspect.signature(SurgicalAggregatorShareable).parameters["reject_opposed_updates"].default
    return workflow.get("reject_opposed_updates", default)


def outcome(workspace: Path, code: int, site: str = HOSTILE_SITE) -> dict:
    """What a finished run left: how the site's results fared, the published model and its validation loss."""
    server = workspace / "server" / "simulate_job" / "app_server"
    history = json.loads((server / HISTORY_FILE).read_text()) if (server / HISTORY_FILE).is_file() else []
    rounds = [entry["aggregation"] for entry in history if "aggregation" in entry]
    best = [entry for entry in history if entry.get("validation", {}).get("best")]
    published_file = next(workspace.glob(f"site-nih/*/app_site-nih/{PUBLISHED_MODEL_FILE}"), None)
    finite = None
    if published_file is not None:
        state = load_checkpoint(published_file).state
        finite = all(bool(np.isfinite(value.double().numpy()).all()) for value in state.values())
    final = history[-1].get("validation", {}) if history else {}
    return {
        "exit_code": code,
        "site_results": ["accepted" if site in entry["accepted"] else "rejected" for entry in rounds],
        "first_reason": next((entry["rejected"][site] for entry in rounds if site in entry["rejected"]), None),
        "published_finite": finite,
        "best_round": best[-1]["round"] if best else None,
        "best_val_loss": best[-1]["validation"]["judged_val_loss"] if best else math.nan,
        "judged_by": best[-1]["validation"]["judged_by"]["sites"] if best else [],
        "final_val_loss": {name: metrics["val_loss"] for name, metrics in final.get("sites", {}).items()},
    }


def table(results: dict[str, dict]) -> list[str]:
    reference = results.get("withheld", {}).get("best_val_loss", math.nan)
    lines = [
        "| case | exit code | the site's results (by round) | published model finite | best round | its validation "
        "loss (judged by) | vs withheld | final model's validation loss at each site |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for case, result in results.items():
        loss = result["best_val_loss"]
        final = ", ".join(f"{site} {value:.4f}" for site, value in sorted(result["final_val_loss"].items()))
        lines.append(
            f"| {case} | {result['exit_code']} | {', '.join(result['site_results'])} | {result['published_finite']} "
            f"| {result['best_round']} | {loss:.4f} ({', '.join(result['judged_by'])}) | {loss - reference:+.4f} "
            f"| {final} |"
        )
    return lines


def main(argv: list[str] | None = None) -> dict[str, dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the jobs, workspaces and results.json")
    parser.add_argument("--attacks", nargs="+", choices=ATTACKS, default=list(ATTACKS))
    parser.add_argument("--table-only", action="store_true", help="only read the finished runs under --out again")
    args = parser.parse_args(argv)
    results = {}
    if args.table_only:
        earlier = json.loads((args.out / "results.json").read_text())
        for attack in args.attacks:
            code, seconds = earlier[attack]["exit_code"], earlier[attack]["seconds"]
            results[attack] = {**outcome(args.out / "workspaces" / attack, code), "seconds": seconds}
        print("\n".join(table(results)))
        return results
    for attack in args.attacks:
        started = time.perf_counter()
        recipe = nih_chexpert_recipe(start=SCRATCH, controller={"min_clients": 1})
        job = write_hostile_job(recipe, args.out / "jobs" / attack, attack)
        code, log = run_simulator(job, args.out / "workspaces" / attack)
        (args.out / f"{attack}.log").write_text(log)
        results[attack] = {**outcome(args.out / "workspaces" / attack, code), "seconds": time.perf_counter() - started}
        print(f"{attack}: {results[attack]}", flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(table(results)))
    return results


if __name__ == "__main__":
    main()
