#!/usr/bin/env bash
# benchmarks/gate_levers.py's levers side by side on one GPU: the gate's model (centralized_full, psi = 12/14, missing
# findings) under each lever, one process a lever. Not a test.
#
#   bash benchmarks/gate_levers_gpu.sh RESULTS_FOLDER LEVERS_FILE [SECONDS]   # SECONDS: stop every grid after (480)
#
# The grids' embedded labels are real NIH rows of torchxrayvision's data folder: carry its wheel to a lent machine
# (pip download --no-deps torchxrayvision==1.5.7 into the carried .whl/), or gate_levers.py refuses to run (with
# --builtin-labels among a lever's ARGUMENTS it runs on labels drawn finding by finding, as the first two runs did
# before it refused).
# LEVERS_FILE: one lever a line, "NAME: ARGUMENTS" (benchmarks/gate-levers-*.txt; ARGUMENTS empty for the profile as
# it ships). SEEDS (default "0 1") sets the seeds; EXTRA_ARGS (words added to every grid's command line) makes a quick
# check: EXTRA_ARGS="--rounds 1 --embedded-patients 60". Each lever's grid keeps its finished seeds, so a stopped run
# reports what finished. The models are deleted after scoring (28 MB each: the figures are in each run's result.json
# and summary.md), and the rest is packed into RESULTS_FOLDER.tgz.
set -uo pipefail
out=${1:?the results folder}
levers_file=${2:?the levers file}
limit=${3:-480}
read -r -a seeds <<< "${SEEDS:-0 1}"
mkdir -p "$out"
common=(--grid psi --only psi12of14 --methods centralized_full --variant full --seeds "${seeds[@]}"
  --controls missing --loader-workers 0 --cpu-threads 1 --bootstrap 200)
names=()
while IFS=: read -r name arguments; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  names+=("$name")
  # shellcheck disable=SC2086 # the lever's words (and EXTRA_ARGS') are separate arguments
  timeout "$limit" python3 benchmarks/gate_levers.py $arguments --out "$out/$name" -- "${common[@]}" \
    --cache-dir "/tmp/cache-$name" ${EXTRA_ARGS:-} > "$out/$name.log" 2>&1 &
done < "$levers_file"
wait
find "$out" \( -name "*.pt" -o -name "*.png" \) -delete
tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
for name in "${names[@]}"; do
  echo "== $name: $(grep -m1 '^profile:' "$out/$name.log")"
  grep -h "^| centralized\|Traceback\|Error" "$out/$name.log" | head -12
done
