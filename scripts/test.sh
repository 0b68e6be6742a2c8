#!/usr/bin/env bash
# The whole test suite from a fresh machine: set-up, then every tier.
#   tier 1: unit, property-based, engine losslessness, store crash/concurrency, estimators, notebook, AppTest
#   tier 2: browser (real headless Chromium against the Streamlit dashboard); a real Prometheus scraping the exporter
#   tier 3: sglang (SGLang 0.5.23's own DSpark recorders, in .venv-sglang)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash .ci/browser-deps.sh
bash .ci/prometheus-deps.sh
bash .ci/sglang-env.sh
status=0
# tier 1 + 2, and the sglang-tier tests that call into .venv-sglang by subprocess
.venv/bin/python -m pytest -q -rfEs -p no:cacheprovider tests || status=$?
# tier 3 proper: SGLang's recorders imported in-process
.venv-sglang/bin/python -m pytest -q -p no:cacheprovider -m sglang tests/integration || status=$?
exit $status
