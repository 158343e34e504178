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

    python benchmarks/gate_levers.py --summarize first=results/levers second=results/levers2 \
        --machine "NVIDIA H200 (16 cores)" --record docs/benchmark/gate-levers/record.json

reads each lever's log (``NAME.log`` in each folder, as ``gate_levers_gpu.sh`` writes them) into one record: per
lever and seed the selected and the last model's round, NIH test mean AUROC and logit correlation; and writes the
table the benchmark page shows beside it (``summary.md``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

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


# a row of the grid summary's first table: method, seed, model (round), validation AUROC, test AUROC (CI), r / loss
SUMMARY_ROW = re.compile(
    r"^\| centralized \(all labels\) \| (\d+) \| (selected|last) \((\d+)\) \| [0-9.]+ \| ([0-9.]+) \([^)]*\) \| "
    r"([0-9.]+) / ([0-9.]+) \|"
)


def model_figures(round_number: int, auroc: float, correlation: float, lost: float) -> dict:
    return {
        "round": round_number,
        "nih_test_mean_auroc": round(auroc, 3),
        "logit_correlation": round(correlation, 2),
        "shared_score_auroc_loss": round(lost, 3),
    }


def lever_figures(log: Path) -> dict:
    """One lever's run: the profile it ran (its log's first line) and, per seed, its selected and last models' figures,
    from each finished run's result.json where the lever's folder is kept (a grid stopped by the time limit prints no
    summary), else from the summary its log printed; rounded as the summary prints them either way."""
    text = log.read_text()
    profile = re.search(r"^profile: (.*)$", text, re.MULTILINE)
    if profile is None:
        raise SystemExit(f"{log}: no 'profile:' line (not a gate_levers.py log)")
    seeds: dict[str, dict] = {}
    results = sorted((log.parent / log.stem).glob("runs/*/centralized_full/seed*/result.json"))
    for path in results:
        result = json.loads(path.read_text())
        for model, figures in result["models"].items():
            nih = figures["test_sets"]["nih"]
            specific = nih["finding_specificity"]
            seeds.setdefault(str(result["seed"]), {})[model] = model_figures(
                figures["round"], nih["mean_auroc"], specific["logit_correlation"], specific["shared_score_auroc_loss"]
            )
    if not results:
        for line in text.splitlines():
            row = SUMMARY_ROW.match(line)
            if row:
                seed, model, number, auroc, correlation, lost = row.groups()
                seeds.setdefault(seed, {})[model] = model_figures(
                    int(number), float(auroc), float(correlation), float(lost)
                )
    return {"profile": profile.group(1), "source": "result.json" if results else "log", "seeds": seeds}


def summarize(folders: list[str], machine: str) -> dict:
    """The record of one or more runs of gate_levers_gpu.sh (LABEL=FOLDER each)."""
    runs = {}
    for item in folders:
        label, separator, folder = item.partition("=")
        if not separator:
            raise SystemExit(f"--summarize {item!r}: expected LABEL=FOLDER")
        runs[label] = {log.stem: lever_figures(log) for log in sorted(Path(folder).glob("*.log"))}
    return {"machine": machine, "runs": runs}


def spread(values: list[float], digits: int) -> str:
    """A mean and its range over seeds: "0.40 (0.35-0.46)"."""
    mean = sum(values) / len(values)
    return f"{mean:.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def summary_table(record: dict) -> str:
    """The record as the benchmark page shows it: per run and lever, over its finished seeds."""
    lines = [
        "| run | lever | profile | seeds | selected model: logit correlation | its NIH test mean AUROC | its AUROC "
        "lost to one shared score | last model: logit correlation |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, levers in record["runs"].items():
        for name, lever in levers.items():
            seeds = [lever["seeds"][seed] for seed in sorted(lever["seeds"], key=int)]
            selected = [seed["selected"] for seed in seeds]
            lines.append(
                f"| {label} | {name} | {lever['profile']} | {len(seeds)} | "
                f"{spread([model['logit_correlation'] for model in selected], 2)} | "
                f"{spread([model['nih_test_mean_auroc'] for model in selected], 3)} | "
                f"{spread([model['shared_score_auroc_loss'] for model in selected], 3)} | "
                f"{spread([seed['last']['logit_correlation'] for seed in seeds], 2)} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="levers", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--out", help="the grid's results folder")
    parser.add_argument("--summarize", nargs="+", metavar="LABEL=FOLDER", help="record finished runs instead")
    parser.add_argument("--machine", default="", help="--summarize: the machine the runs ran on")
    parser.add_argument("--record", type=Path, help="--summarize: write the record here")
    parser.add_argument(
        "--builtin-labels",
        action="store_true",
        help="run without torchxrayvision's label files (the embedded labels then drawn at built-in frequencies, "
        "each finding on its own: not the grids' data, whose labels are real NIH rows)",
    )
    args, rest = parser.parse_known_args()
    if args.summarize:
        record = summarize(args.summarize, args.machine)
        if args.record is None:
            print(json.dumps(record, indent=1))
        else:
            args.record.parent.mkdir(parents=True, exist_ok=True)
            args.record.write_text(json.dumps(record, indent=1) + "\n")
            (args.record.parent / "summary.md").write_text(summary_table(record))
        return 0
    if not args.out:
        parser.error("--out is required to run a grid")
    rest = [item for item in rest if item != "--"]
    profiles.PROFILES[PROFILE] = changed_profile(profiles.PROFILES[PROFILE], args.levers)
    print(f"profile: {profiles.PROFILES[PROFILE].name}", flush=True)
    unchecked = ["--builtin-labels"] if args.builtin_labels else []  # the experiment command refuses without them
    return cli_main(["experiment", "--profile", PROFILE, "--engine", "inprocess", "--out", args.out, *unchecked, *rest])


if __name__ == "__main__":
    sys.exit(main())
