#!/usr/bin/env bash
# The SGLang production path, end to end, on server directories with known truth (issue 10).
#
#   bash bench/sglang_scenarios.sh [OUT] [SEED]
#
# 1. SGLang 0.5.23's own recorders (in .venv-sglang) write four server directories under OUT
#    (fixtures/sglang/scenarios.py: compact, cap-accept of the same trajectories, greedy, and a
#    mixed-temperature server that served with an STS and an SPS table) plus the simulator's truth;
# 2. each directory goes through the CLI as a user would: ingest DIR -> estimate --json -> calibrate -> report;
# 3. estimators.scenario_validation prints the coverage and STS tables against the truth.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/acceptscope-scenarios}
SEED=${2:-0}
bash .ci/sglang-env.sh >/dev/null
.venv-sglang/bin/python -W ignore fixtures/sglang/scenarios.py "$OUT" --seed "$SEED" 2>/dev/null
DB="$OUT/transcript.duckdb"
rm -f "$DB"
A=.venv/bin/acceptscope
for s in compact cap-accept greedy sts; do
  extra=()
  [[ $s == greedy ]] && extra=(--temperature 0)
  echo "\$ acceptscope ingest $OUT/$s --db $DB ${extra[*]}"
  COLUMNS=120 $A ingest "$OUT/$s" --db "$DB" "${extra[@]}"
  run=$($A ingest "$OUT/$s" --db "$DB" "${extra[@]}" --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["runs"][0])')
  echo "\$ acceptscope estimate --db $DB --run $run --json  (tail summary and run-level utilization)"
  $A estimate --db "$DB" --run "$run" --json 2>/dev/null | .venv/bin/python -c '
import json, sys
r = next(iter(json.load(sys.stdin).values()))
s = r["tail"]["summary"]; a = r["tail"]["aggregate"][0]
u = [x for x in r["utilization"]["by_group"] if x["by"] == "run"][0]
print(json.dumps({"arm": r["run"]["arm"], "ceiling": s["ceiling"], "n_censored": s["n_censored"],
                  "n_unresolved": s["n_unresolved"], "mean_ceiling": [round(a[k], 4) for k in ("mean_ceiling", "lo", "hi")],
                  "utilization": [round(u.get(k, u["utilization"]), 4) for k in ("utilization", "util_lo", "util_hi")],
                  "statement": s["statement"]}, indent=1))'
  if [[ $s == sts || $s == cap-accept ]]; then
    echo "\$ acceptscope calibrate --db $DB --run $run --out $OUT/$s.next_sts.json"
    COLUMNS=120 $A calibrate --db "$DB" --run "$run" --out "$OUT/$s.next_sts.json" --n-boot 50 2>&1 | grep -v "^\s*$" || true
  fi
  echo "\$ acceptscope report --db $DB --run $run -o $OUT/$s.report.html"
  COLUMNS=120 $A report --db "$DB" --run "$run" -o "$OUT/$s.report.html" 2>&1 | grep -v '^\s*$' || true
  echo
done
echo "\$ python -m acceptscope.estimators.scenario_validation $OUT"
.venv/bin/python -W ignore -m acceptscope.estimators.scenario_validation "$OUT"
