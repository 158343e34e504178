"""A grid's runs: each run trained (unless it finished before) and evaluated, in parallel worker processes, then
the summary; ``plan.json`` says what the grid is."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import re
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.errors import SiteConfigError
from ..core.methods import COMPARATORS, POOLED_COMPARATORS
from ..data.storage import CACHE_ENV, default_cache_root
from ..training.profiles import Profile
from .choices import (
    ABSENT,
    HEAD_ONLY,
    MISSING,
)
from .grids import DataSources, Setting, grid_settings
from .head_only_run import evaluate_heads, run_head_only
from .runner import LAST, SELECTED, Run, RunOptions, evaluate_run, run_federated, run_pooled, with_initial_model
from .summary import PER_CLASS_FILE, RESULT_FILE, summarize

logger = logging.getLogger(__name__)

TRAINED_FILE = "trained.json"  # a run's models and training record, from its training until its result.json


def execute(run: Run, out: Path, profile: Profile, options: RunOptions) -> dict:
    """Train (unless finished before) and evaluate one run's selected and last models; returns its result."""
    folder = run.folder(out)
    result_path = folder / RESULT_FILE
    if result_path.is_file():
        return json.loads(result_path.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if options.variant == HEAD_ONLY:
        models, record = run_head_only(run, profile, options)
        evaluate = evaluate_heads
        trained = time.perf_counter() - started
    else:
        evaluate = evaluate_run
        resumed = trained_before(folder, options)
        if resumed is None:
            train = run_pooled if run.method in POOLED_COMPARATORS else run_federated
            models, record = train(run, folder, profile, options)
            trained = time.perf_counter() - started
            save_trained(folder, models, record, trained)
        else:
            models, record, trained = resumed
            logger.info("%s: trained before (%s); scoring its models", run.title, folder / TRAINED_FILE)
            started -= trained  # the run's seconds count its training
    validation = {entry["round"]: entry for entry in record["curve"]}
    evaluated, frames = {}, []
    for kind in (SELECTED, LAST):
        per_class, summary = evaluate(run, models[kind], options)
        frames.append(per_class.assign(model=kind))
        round_number = record["rounds"][kind]
        evaluated[kind] = {"round": round_number, "validation": validation.get(round_number), "test_sets": summary}
    pd.concat(frames, ignore_index=True).to_csv(folder / PER_CLASS_FILE, index=False)
    result = {
        "setting": run.setting.name,
        "factor": run.setting.factor,
        "value": run.setting.value,
        "control": run.setting.control,
        "variant": options.variant,
        "method": run.method,
        "seed": run.seed,
        "label_sets": run.setting.label_sets,
        "shared_classes": run.setting.shared_classes,
        "train_seconds": round(trained, 1),
        "seconds": round(time.perf_counter() - started, 1),
        "machine": machine(),  # a CPU model's float kernels are its own: runs agree to the bit on one kind of CPU
        "test_sets": evaluated[SELECTED]["test_sets"],  # the selected model's, as the papers report
        "models": evaluated,
        "curve": record["curve"],
        "training": record["training"],
    }
    result_path.write_text(json.dumps(result, indent=2) + "\n")  # last: its presence marks the run finished
    (folder / TRAINED_FILE).unlink(missing_ok=True)  # result.json holds all of it now
    return result


def machine() -> str:
    """Where a run ran: the GPU's name, or the CPU's model, and the cores. A virtual machine's CPU may name only its
    brand ("AMD EPYC"), under which CPUs of different kernels run: its family and model and the instruction set
    torch's kernels use (AVX2, AVX512) tell them apart."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} ({os.cpu_count()} cores)"
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.is_file() else []

    def field(name: str) -> str | None:
        return next((line.split(":", 1)[1].strip() for line in lines if line.split(":", 1)[0].strip() == name), None)

    generation = f", family {field('cpu family')} model {field('model')}" if field("cpu family") else ""
    kernels = torch.backends.cpu.get_cpu_capability()
    return f"{field('model name') or 'CPU'}{generation}, {kernels} ({os.cpu_count()} cores)"


def code_version(root: Path | None = None) -> str | None:
    """The commit the bundle's checkout at ``root`` (by default this file's, when it runs from a checkout) is at, with
    ``+changes`` when its code (``custom/``, ``benchmarks/``) differs from that commit; None outside a git checkout. A
    record names it so that a table can say which rules made each of its rows."""
    if root is None:
        here = Path(__file__).resolve()
        if here.parents[2].name != "custom":  # an installed copy: no checkout to name
            return None
        root = here.parents[3]

    def git(*arguments: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *arguments], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--verify", "HEAD")
    if not commit:
        return None
    changed = git("status", "--porcelain", "--", "custom", "benchmarks")
    return f"{commit}+changes" if changed else commit


def save_trained(folder: Path, models: dict[str, dict[str, list[Path]]], record: dict, seconds: float) -> None:
    """``trained.json``: a full-network run's trained models (relative to its folder) and training record, so that a
    run stopped while its models are scored resumes at the scoring rather than training again."""
    saved = {
        "models": {
            kind: {identity: [str(path.relative_to(folder)) for path in paths] for identity, paths in found.items()}
            for kind, found in models.items()
        },
        "record": record,
        "train_seconds": round(seconds, 1),
    }
    (folder / TRAINED_FILE).write_text(json.dumps(saved, indent=2) + "\n")


def trained_before(folder: Path, options: RunOptions) -> tuple[dict[str, dict[str, list[Path]]], dict, float] | None:
    """What :func:`save_trained` kept of this run: its models, record and training seconds; None where nothing was
    kept, a model file is missing, or it trained from another initial model than this grid's."""
    path = folder / TRAINED_FILE
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    if _start_of(saved["record"]["training"].get("initial_model", "")) != _start_of(options.initial_model or ""):
        return None
    models = {
        kind: {identity: [folder / name for name in names] for identity, names in found.items()}
        for kind, found in saved["models"].items()
    }
    if not all(model.is_file() for found in models.values() for paths in found.values() for model in paths):
        return None
    return models, saved["record"], float(saved["train_seconds"])


def plan(settings: Sequence[Setting], methods: Sequence[str], seeds: Sequence[int]) -> list[Run]:
    unknown = [method for method in methods if method not in COMPARATORS]
    if unknown:
        raise SiteConfigError(f"unknown method(s) {unknown}; choose from {list(COMPARATORS)}")
    runs = []
    for setting in settings:
        for seed in seeds:
            seeded = setting.for_seed(seed)
            if leaves_nothing_out(seeded):
                continue
            runs.extend(
                Run(seeded, method, seed)
                for method in methods
                # no centralized_full under absent: the findings it would label are gone
                if not (setting.control == ABSENT and method == "centralized_full")
            )
    return runs


def leaves_nothing_out(setting: Setting) -> bool:
    """An absent control in which every site labels the federation's every class (psi = 0): no finding is left out
    of any image, so its data and runs are the missing setting's (images.modality generates the same folder), and it
    is not run twice."""
    return setting.control == ABSENT and not any(
        config.get("embedded", {}).get("absent") for config in setting.sites.values()
    )


def run_grid(
    grid: str,
    methods: Sequence[str],
    seeds: Sequence[int],
    sources: DataSources,
    profile: Profile,
    out: str | Path,
    options: RunOptions,
    only: Sequence[str] = (),
    controls: Sequence[str] = (MISSING,),
    jobs: int = 1,
) -> Path:
    """Run (or resume) a named grid and write its summary; returns the summary's path.

    ``only`` restricts the grid to the settings whose name contains one of the given strings; ``controls``: the
    simulated settings' controls (missing, absent).
    """
    settings = grid_settings(grid, sources, profile, controls)
    if only:
        settings = [s for s in settings if any(part in s.name for part in only)]
        if not settings:
            raise SiteConfigError(f"no setting of grid {grid!r} matches {list(only)}")
    return run_settings(settings, methods, seeds, profile, out, options, grid_description(grid, sources), jobs)


def grid_description(grid: str, sources: DataSources) -> dict[str, Any]:
    """What a grid's plan says of its data: the sources, and where the embedded datasets' labels came from."""
    return {"grid": grid, "data": asdict(sources), "embedded_labels": sources.embedded_labels()}


PLAN_FILE = "plan.json"
WEIGHTS_DIGEST = re.compile(r"\(sha256 ([0-9a-f]+)\.\.\.\)$")  # how InitialModel.from_weights ends its description


def _start_of(initial_model: str) -> str:
    """What a run started from, for comparison: its weights file's digest (the file's path may differ between
    machines), or the description of a start without weights."""
    found = WEIGHTS_DIGEST.search(initial_model)
    return found.group(1) if found else initial_model


def refuse_other_starts(runs: Sequence[Run], out: Path, initial_model: str) -> None:
    """A grid compares its methods from one initial model: finished runs that started from another (other weights, or
    a stand-in built by another recipe or CPU: another digest) are refused by name, never mixed into the tables."""
    other = []
    for run in runs:
        path = run.folder(out) / RESULT_FILE
        if path.is_file():
            recorded = json.loads(path.read_text()).get("training", {}).get("initial_model", "")
            if _start_of(recorded) != _start_of(initial_model):
                other.append(f"{run.title}: {recorded}")
    if other:
        listed = "; ".join(other[:3]) + ("; ..." if len(other) > 3 else "")
        raise SiteConfigError(
            f"{out}: {len(other)} finished run(s) started from another initial model than this grid's "
            f"({initial_model}): {listed}. A grid's methods must start alike: pass that weights file with "
            "--pretrained, or move those runs out of the folder"
        )


def write_plan(
    out: Path,
    settings: Sequence[Setting],
    methods: Sequence[str],
    seeds: Sequence[int],
    profile: Profile,
    options: RunOptions,
    description: dict[str, Any] | None = None,
) -> Path:
    """``plan.json``: the grid's settings (sites, label sets, test sets), methods, seeds, profile and options."""
    out.mkdir(parents=True, exist_ok=True)
    plan_data = {
        **(description or {}),
        "profile": asdict(profile),
        "methods": list(methods),
        "seeds": list(seeds),
        "options": asdict(options),
        "settings": [
            {
                "name": s.name,
                "factor": s.factor,
                "value": s.value,
                "label_sets": s.label_sets,
                "shared_classes": s.shared_classes,
                "sites": s.sites,
                "test_sets": [asdict(t) for t in s.test_sets],
            }
            for s in settings
        ],
    }
    path = out / PLAN_FILE
    path.write_text(json.dumps(plan_data, indent=2) + "\n")
    return path


def run_settings(
    settings: Sequence[Setting],
    methods: Sequence[str],
    seeds: Sequence[int],
    profile: Profile,
    out: str | Path,
    options: RunOptions,
    description: dict[str, Any] | None = None,
    jobs: int = 1,
) -> Path:
    """Run every (setting, seed, method) not finished yet, with progress logs, then summarise. ``jobs`` > 1 runs
    that many at once, each in a process of its own (a GPU's launch-bound small models leave it room for several)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = plan(settings, methods, seeds)
    os.environ.setdefault(CACHE_ENV, str(options.cache_dir or default_cache_root()))
    options = with_initial_model(settings, methods, profile, options)
    logger.info("initial model of every method: %s", options.initial_model)
    refuse_other_starts(runs, out, options.initial_model)
    write_plan(out, settings, methods, seeds, profile, options, description)
    started = time.perf_counter()
    todo = [run for run in runs if not (run.folder(out) / RESULT_FILE).is_file()]
    finished_before = len(runs) - len(todo)
    logger.info("%d runs, %d finished before; %d to run, %d at a time", len(runs), finished_before, len(todo), jobs)
    if jobs > 1:
        context = multiprocessing.get_context("spawn")  # CUDA in the workers: never fork a process that holds it
        with ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_logging) as pool:
            futures = [pool.submit(execute, run, out, profile, options) for run in todo]
            finished = (future.result() for future in as_completed(futures))
            for index, result in enumerate(finished, start=1):
                _log_result(index, len(todo), result, started)
    else:
        for index, run in enumerate(todo, start=1):
            logger.info("[%d/%d] %s", index, len(todo), run.title)
            _log_result(index, len(todo), execute(run, out, profile, options), started)
    return summarize(out)


def _worker_logging() -> None:
    """A worker says what goes wrong, and how each federation's rounds go (its round lines)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    logging.getLogger("surgical_aggregation.experiments.federation").setLevel(logging.INFO)


def _log_result(index: int, total: int, result: dict[str, Any], started: float) -> None:
    means = ", ".join(f"{name} {values['mean_auroc']:.3f}" for name, values in result["test_sets"].items())
    title = f"{result['setting']} / {result['method']} / seed {result['seed']}"
    logger.info(
        "[%d/%d] %s: mean AUROC %s (%.0f s; %.0f s elapsed)",
        index,
        total,
        title,
        means,
        result["seconds"],
        time.perf_counter() - started,
    )
