"""The report-labelling job's cost on this machine: embedding the IU reports once, then the job in FLARE's simulator.

Not a test. On a fresh, temporary cache it times
  (1) embedding the 3,927 IU reports with text (the first run on a machine does this once) and reading them back
      from the cache (every later run),
  (2) ``nvflare simulator jobs/report_labeling -w WS`` as docs/reproducing-the-papers.md runs it (FLARE starts a
      site process for each task) and the same with ``-t 2`` (each site's process kept between tasks),
and keeps each job's aggregations and its last round's validation mean AUROC (the sites' mean of their own
validation splits) from the server's round history.

    python benchmarks/report_job_time.py --out docs/report-labeling/job_time.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from surgical_aggregation.data.storage import CACHE_ENV
from surgical_aggregation.experiments.grid_run import machine
from surgical_aggregation.flare.simulation import FederationResult
from surgical_aggregation.reports.data import TEXT_COLUMN, load_iu_reports
from surgical_aggregation.reports.dataset import embed_table
from surgical_aggregation.reports.embeddings import MINILM

JOB = Path(__file__).resolve().parents[1] / "jobs" / "report_labeling"


def embedding(cache: Path) -> dict[str, Any]:
    """How many IU reports (and distinct texts) there are to embed, and the seconds to embed them into an empty
    ``cache``, then to read them all from it."""
    table, _ = load_iu_reports()
    record = {"reports": len(table), "distinct_texts": int(table.frame[TEXT_COLUMN].nunique()), "seconds": {}}
    for step in ("embed", "read from the cache"):
        started = time.perf_counter()
        _, summary = embed_table(table, cache, MINILM)
        record["seconds"][step] = round(time.perf_counter() - started, 2)
        print(f"{step}: {record['seconds'][step]} s ({summary})", flush=True)
    return record


def job_run(workspace: Path, threads: int | None, cache: Path) -> dict:
    """One simulator run of the job: its wall time, exit code, aggregations and last validation."""
    command = ["nvflare", "simulator", str(JOB), "-w", str(workspace), *(["-t", str(threads)] if threads else [])]
    started = time.perf_counter()
    finished = subprocess.run(
        command, env={**os.environ, CACHE_ENV: str(cache)}, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - started
    history = json.loads(FederationResult(workspace).history.read_text())
    aggregated = [entry for entry in history if "aggregation" in entry]  # as the round loop counts them
    run = {
        "command": " ".join(["nvflare", "simulator", "jobs/report_labeling", "-w", "WS", *command[5:]]),
        "exit_code": finished.returncode,
        "seconds": round(seconds, 1),
        "aggregations": len(aggregated),
        "last_round_mean_val_auroc": aggregated[-1]["validation"]["mean_val_auroc"],
    }
    print(json.dumps(run), flush=True)
    if finished.returncode:
        print(finished.stdout[-3000:], finished.stderr[-3000:], file=sys.stderr)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON record of the times, the runs' results and the machine")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="report-job-") as root:
        cache = Path(root) / "cache"
        record = {
            "command": "python benchmarks/report_job_time.py",
            "machine": machine(),
            "embedding": embedding(cache),
            "runs": [job_run(Path(root) / f"ws-{threads}", threads, cache) for threads in (None, 2)],
        }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
