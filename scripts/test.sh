#!/usr/bin/env bash
# The whole test suite from a fresh machine: set-up, then every tier.
#   tier 1: unit, property-based, engine losslessness, store crash/concurrency, estimators, notebook, AppTest
#   tier 2: browser (real headless Chromium against the Streamlit dashboard)
#   tier 3: sglang (SGLang 0.5.23's own DSpark recorders, in .venv-sglang)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash .ci/browser-deps.sh
bash .ci/sglang-env.sh
status=0
.venv/bin/python -m pytest -q -p no:cacheprovider -m "not sglang" tests || status=$?
.venv-sglang/bin/python -m pytest -q -p no:cacheprovider -m sglang tests/integration || status=$?
exit $status
