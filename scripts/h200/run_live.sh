#!/usr/bin/env bash
# Plan B's run call (docs/h200-live.md), on the device, after the wheel parts are in /tmp/parts:
# install them, export + check the model pair with SGLang's own loader, run both arms and the STS relaunch
# (scripts/h200/live_audit.py), and leave the database, STS table, summary and logs in $OUT.
# NOT RUN YET: the current image cannot start SGLang 0.5.23 (docs/h200-live.md, Verdict).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTDIR="${OUT:-/tmp/acs-out}"; mkdir -p "$OUTDIR" /tmp/acs
if ! python3 -c 'import sglang' 2>/dev/null; then
  cat /tmp/parts/* | tar -x -C /tmp || exit 3
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/wheels/*.whl || exit 3
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c 'import torch, sglang, sgl_kernel; print("torch", torch.__version__, "sglang", sglang.__version__, "sgl_kernel", sgl_kernel.__version__)' || exit 4
python3 -m acceptscope.engine.sglang_export fixtures/models/drafter /tmp/acs/drafter0 || exit 5
python3 scripts/h200/check_sglang_layout.py --target fixtures/models/target --draft /tmp/acs/drafter0 2>&1 | tail -1
timeout "${LIVE_TIMEOUT:-520}" python3 scripts/h200/live_audit.py --out /tmp/acs "$@" 2>&1 | tee "$OUTDIR/live.log"
cp /tmp/acs/live.duckdb /tmp/acs/sts.json /tmp/acs/summary.json "$OUTDIR"/ 2>/dev/null
tar -czf "$OUTDIR/logs.tgz" -C /tmp/acs logs logs-sts 2>/dev/null
ls -l "$OUTDIR"
