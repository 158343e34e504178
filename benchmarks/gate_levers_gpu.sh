#!/usr/bin/env bash
# benchmarks/gate_levers.py's levers side by side on one GPU: the gate's model (centralized_full, psi = 12/14, missing
# findings) under each lever, seeds 0 and 1, one process a lever. Not a test.
#
#   bash benchmarks/gate_levers_gpu.sh RESULTS_FOLDER [SECONDS]     # SECONDS: stop every grid after this (default 480)
#
# EXTRA_ARGS (words added to every grid's command line) makes a quick check: EXTRA_ARGS="--rounds 1 --embedded-patients 60".
#
# Each lever's grid keeps its finished seeds, so a stopped run reports what finished. The models are deleted after
# scoring (28 MB each): the figures are in each run's result.json and summary.md.
set -uo pipefail
out=${1:?the results folder}
limit=${2:-480}
mkdir -p "$out"
common=(--grid psi --only psi12of14 --methods centralized_full --variant full --seeds 0 1 --controls missing
  --loader-workers 0 --cpu-threads 1 --bootstrap 200)
declare -A levers=(
  [base]=""
  [lr2e-4]="--set learning_rate=2e-4"
  [lr1e-3]="--set learning_rate=1e-3"
  [batch16]="--set batch_size=16"
  [patience20]="--set rounds=90 --set patience=20"
  [lr2e-4-patience20]="--set learning_rate=2e-4 --set rounds=90 --set patience=20"
  [warmup60]="--set warmup_epochs=60"
  [no-augment]="--set augment=false"
)
for name in "${!levers[@]}"; do
  # shellcheck disable=SC2086 # the lever's words (and EXTRA_ARGS') are separate arguments
  timeout "$limit" python3 benchmarks/gate_levers.py ${levers[$name]} --out "$out/$name" -- "${common[@]}" \
    --cache-dir "/tmp/cache-$name" ${EXTRA_ARGS:-} > "$out/$name.log" 2>&1 &
done
wait
find "$out" -name "*.pt" -delete
for name in "${!levers[@]}"; do
  echo "== $name: $(grep -m1 '^profile:' "$out/$name.log")"
  grep -h "logit correlation of\|Traceback\|Error" "$out/$name.log" | head -5
done
