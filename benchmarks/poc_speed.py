"""The POC against the simulator: each site's training images/s for the same job, quiet and under a background load.

    python benchmarks/poc_speed.py --rounds 2 --repeats 2 --load 6 --out poc_speed.json

Not a test. For each condition (``quiet``; ``loaded``: ``--load`` busy processes running beside it) and repetition,
the default job (``jobs/nih_chexpert``'s recipe with ``--rounds`` rounds) runs once in FLARE's simulator (the path of
``surgical-aggregation simulate``) and once in a POC (prepare, start, submit, wait, download, stop: what ``poc run``
does). Each site's training rate is read from its log (``... on N images in S s (R/s)``, its local epochs, not the
head warm-up). Prints each run's wall time and the sites' median images/s, and per condition the POC/simulator ratio
of that median (min and median over repetitions; each ratio from one repetition's pair, run back to back).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from surgical_aggregation.flare.poc import PocWorkspace
from surgical_aggregation.flare.recipe import nih_chexpert_recipe, write_job
from surgical_aggregation.flare.simulation import simulate
from surgical_aggregation.training.profiles import SCRATCH

# the trainer's epoch line: "<site> round <r> training epoch <e>/<n>: loss <l> on <N> <unit> in <S> s (<R>/s)"
EPOCH_LINE = re.compile(r"(site-[\w-]+) round (\d+) training epoch (\d+)/\d+: loss \S+ on (\d+) \w+ in ([\d.]+) s")


def site_rates(root: Path) -> dict[str, float]:
    """Each site's training images/s over every local epoch its logs under ``root`` record (each epoch once)."""
    epochs: dict[tuple[str, int, int], tuple[int, float]] = {}
    for log in root.rglob("*.txt"):
        for match in EPOCH_LINE.finditer(log.read_text(errors="replace")):
            site, round_number, epoch, images, seconds = match.groups()
            epochs[(site, int(round_number), int(epoch))] = (int(images), float(seconds))
    rates = {}
    for site in sorted({key[0] for key in epochs}):
        images = sum(value[0] for key, value in epochs.items() if key[0] == site)
        seconds = sum(value[1] for key, value in epochs.items() if key[0] == site)
        rates[site] = images / seconds
    return rates


def run_simulator(recipe, root: Path) -> dict:
    started = time.perf_counter()
    simulate(recipe, root, log_file=root / "simulator.log")
    return {"seconds": time.perf_counter() - started, "images_per_second": site_rates(root)}


def run_poc(recipe, root: Path) -> dict:
    job = write_job(recipe, root / "job")
    poc = PocWorkspace(root / "poc")
    started = time.perf_counter()
    poc.prepare(job)
    try:
        poc.start()
        outcome = poc.submit_and_collect(job, None, root / "results", timeout=3600)
    finally:
        poc.stop()
    seconds = time.perf_counter() - started
    if not outcome.completed:
        raise RuntimeError(f"the POC job ended {outcome.state}; its logs: {poc.root}")
    return {"seconds": seconds, "images_per_second": site_rates(poc.root)}


def median_rate(run: dict) -> float:
    return statistics.median(run["images_per_second"].values())


def busy_processes(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--load", type=int, default=6, help="busy processes beside the loaded runs")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    recipe = nih_chexpert_recipe(start=SCRATCH, controller={"num_rounds": args.rounds})
    results: dict[str, list[dict]] = {"quiet": [], "loaded": []}
    work = Path(tempfile.mkdtemp(prefix="poc-speed-"))
    try:
        simulate(recipe, work / "warm-up")  # the embedded data generated and cached once, untimed
        for condition in results:
            for repeat in range(args.repeats):
                load = busy_processes(args.load if condition == "loaded" else 0)
                try:
                    pair = {
                        "simulator": run_simulator(recipe, work / f"{condition}-{repeat}-sim"),
                        "poc": run_poc(recipe, work / f"{condition}-{repeat}-poc"),
                    }
                finally:
                    for process in load:
                        process.kill()
                        process.wait()
                pair["ratio"] = median_rate(pair["poc"]) / median_rate(pair["simulator"])
                results[condition].append(pair)
                print(condition, repeat, json.dumps(pair), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {}
    for condition, pairs in results.items():
        ratios = [pair["ratio"] for pair in pairs]
        summary[condition] = {"ratio_min": min(ratios), "ratio_median": statistics.median(ratios)}
        for engine in ("simulator", "poc"):
            rates = [median_rate(pair[engine]) for pair in pairs]
            seconds = [pair[engine]["seconds"] for pair in pairs]
            summary[condition][engine] = {
                "images_per_second_median": statistics.median(rates),
                "seconds_min": min(seconds),
                "seconds_median": statistics.median(seconds),
            }
    args.out.write_text(json.dumps({"rounds": args.rounds, "load": args.load, "runs": results, "summary": summary},
                                   indent=1))  # fmt: skip
    for condition, values in summary.items():
        print(
            f"{condition}: POC/simulator images/s ratio min {values['ratio_min']:.2f}, median "
            f"{values['ratio_median']:.2f}; simulator {values['simulator']['images_per_second_median']:.1f}/s "
            f"({values['simulator']['seconds_median']:.0f} s), POC {values['poc']['images_per_second_median']:.1f}/s "
            f"({values['poc']['seconds_median']:.0f} s)"
        )


if __name__ == "__main__":
    main()
