#!/usr/bin/env bash
# The tail-estimator validation table of README's "Measured figures": 21 cap-accept runs of the
# reference engine (greedy, T=0.7 and T=1; batch 32/16/8), then the harness over all of them.
# Greedy runs of different seeds are token-identical, so one greedy seed per batch size is used.
#
# Usage: bash bench/validation_runs.sh [DIR]   (DIR default /tmp/acceptscope-validation; about
#        15 min of runs on 2 cores, skipped for runs whose database exists, then ~3 min of validation)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-/tmp/acceptscope-validation}"
mkdir -p "$DIR"

run() {  # run-id temperature seed batch
  local db="$DIR/$1.duckdb"
  [[ -f "$db" ]] || .venv/bin/acceptscope run --engine reference --arm cap-accept --workload mixed \
    --temperature "$2" --seed "$3" --batch "$4" --db "$db" --run-id "$1"
}

run val-T0-s11 0 11 32
run val-T0-b16 0 11 16
run val-T0-b8 0 11 8
for s in $(seq 11 24); do run "val-T1-s$s" 1 "$s" 32; done
for s in 31 32 33 34; do run "val-T0.7-s$s" 0.7 "$s" 16; done

.venv/bin/python -m acceptscope.estimators.validation "$DIR"/*.duckdb --json "$DIR/validation.json" | tee "$DIR/validation.txt"
