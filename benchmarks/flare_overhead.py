"""What FLARE's simulator adds to the default job: its wall time against the same work in a bare loop.

Not a test. In one run, on a warm cache (the sites' embedded data are generated and decoded first,
untimed), it times
  (1) the default job (``jobs/nih_chexpert``'s recipe, from scratch as its figures were measured: the stand-in's
      start adds its pretraining) in FLARE's simulator as the README runs it
      (``surgical-aggregation simulate``: one process per site, the cores shared among them), and
  (2) the same work without FLARE: the same site configs, one process, the sites one after the other
      with every core, as many rounds as (1) ran before its early stopping: per round each site loads its
      slice of the global model, validates it, warms its head up (round 0), trains its local epochs and
      validates again; the rows are aggregated by name; at the end each site validates the final and the
      best global model.
and prints both wall times and their ratio (min and median over ``--repeats``).

    python benchmarks/flare_overhead.py --repeats 2 --out overhead.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from surgical_aggregation.core.aggregation import Contribution, SurgicalAggregator
from surgical_aggregation.core.head import slice_for_client
from surgical_aggregation.core.labels import BUILTIN_VOCABULARY
from surgical_aggregation.data.storage import CACHE_ENV
from surgical_aggregation.experiments.grid_run import machine
from surgical_aggregation.flare.recipe import nih_chexpert_recipe
from surgical_aggregation.flare.simulation import simulate
from surgical_aggregation.images.modality import MODALITY as IMAGES
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.profiles import SCRATCH
from surgical_aggregation.training.site_data import prepare_site_data
from surgical_aggregation.training.trainer import SiteTrainer


def bare_loop(rounds: int) -> float:
    """(2): seconds for the default job's work without FLARE."""
    started = time.perf_counter()
    recipe = nih_chexpert_recipe(start=SCRATCH)
    configs = {site: site_config_from_dict(values) for site, values in recipe.site_configs.items()}
    quiet = logging.getLogger("bare-loop")
    trainers = {
        site: SiteTrainer(config, prepare_site_data(config, quiet), site, quiet) for site, config in configs.items()
    }
    union = sorted({name for trainer in trainers.values() for name in trainer.class_names})
    first = next(iter(configs.values()))
    torch.manual_seed(0)
    state = IMAGES.build_model(union, IMAGES.preprocessing(first)).state_dict()
    for round_number in range(rounds):
        aggregator = SurgicalAggregator(state, union, normalize_name=BUILTIN_VOCABULARY.canonical)
        for site, trainer in trainers.items():
            trainer.load_global(slice_for_client(state, union, trainer.class_names), trainer.class_names)
            trainer.validate()
            trainer.fit(round_number, warmup=round_number == 0)
            trainer.validate()
            aggregator.add(Contribution(site, trainer.state_dict(), trainer.class_names, len(trainer.data.train)))
        state = aggregator.finalize().state
    for trainer in trainers.values():
        for _ in range(2):  # the final model and the best one
            trainer.evaluate_state(state, union)
    return time.perf_counter() - started


def simulator(workspace: Path) -> tuple[float, int]:
    """(1): seconds for the default job in FLARE's simulator, as ``surgical-aggregation simulate`` runs it, and the
    rounds it ran (early stopping may end it before ``num_rounds``: the bare loop then runs as many)."""
    started = time.perf_counter()
    result = simulate(nih_chexpert_recipe(start=SCRATCH), workspace, log_file=workspace / "simulator.log")
    seconds = time.perf_counter() - started
    return seconds, sum(entry["round"] >= 0 for entry in json.loads(result.history.read_text()))  # not the start's


def _spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="JSON file for the results")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="flare-overhead-") as root:
        os.environ[CACHE_ENV] = str(Path(root) / "cache")
        # warm cache: generated and decoded once
        for values in nih_chexpert_recipe(start=SCRATCH).site_configs.values():
            prepare_site_data(site_config_from_dict(values))
        bare, simulated, rounds = [], [], []
        for repeat in range(args.repeats):
            seconds, ran = simulator(Path(root) / f"simulation-{repeat}")
            simulated.append(seconds)
            rounds.append(ran)
            bare.append(bare_loop(ran))
            print(f"repeat {repeat + 1}: simulator {seconds:.1f} s, bare loop {bare[-1]:.1f} s ({ran} rounds each)")
    results = {
        "command": f"python benchmarks/flare_overhead.py --repeats {args.repeats}",
        "machine": machine(),
        "cpu_count": os.cpu_count(),
        "rounds": rounds,
        "simulator_seconds": _spread(simulated),
        "bare_loop_seconds": _spread(bare),
        "ratio": statistics.median(simulated) / statistics.median(bare),
    }
    print(
        f"default job, {os.cpu_count()} cores: simulator {results['simulator_seconds']['median']:.1f} s "
        f"(min {results['simulator_seconds']['min']:.1f}), bare loop {results['bare_loop_seconds']['median']:.1f} s "
        f"(min {results['bare_loop_seconds']['min']:.1f}); ratio {results['ratio']:.2f}"
    )
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
