#!/usr/bin/env bash
# The embedded benchmark's full-network grids (docs/benchmark/README.md): whole DenseNet121s trained by the in-process
# federation, several runs at once on one GPU. Finished runs are skipped, so a stopped grid resumes where it stopped.
#
#   bash benchmarks/full_network_grid.sh RESULTS_FOLDER [JOBS]     # JOBS: 12 by default (16 CPU cores, one thread a run)
#
# psi in {0, 6/14, 12/14, 1} at K = 4, missing and absent; then K in {2, 4, 8} at psi = 4/14 (and its psi = 0 control),
# missing; 5 seeds, every comparator. On one H200, 12 at a time, 25 runs took 262 s (docs/benchmark/README.md): about
# an hour for the 340 runs. docs/benchmark/full-psi holds the part that has run.
# On a lent GPU machine carry torchxrayvision's wheel too (its label files: without them `experiment` refuses, as
# the grids' embedded labels are real NIH and CheXpert rows).
set -euo pipefail
out=${1:?the results folder}
jobs=${2:-12}
common=(
  --profile benchmark --engine inprocess --seeds 0 1 2 3 4 --bootstrap 200
  --methods surgical vanilla partial_loss centralized centralized_full individual
  --jobs "$jobs" --loader-workers 0 --cpu-threads 1
)
python3 -m surgical_aggregation experiment --grid psi --only psi0of14 psi6of14 psi12of14 psi14of14 \
  --controls missing absent --out "$out/full-psi" "${common[@]}"
python3 -m surgical_aggregation experiment --grid K --only K2-psi4of14 K4-psi4of14 K8-psi4of14 K4-psi0of14 \
  --controls missing --out "$out/full-K" "${common[@]}"
