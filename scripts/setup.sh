#!/usr/bin/env bash
# Create .venv with everything acceptscope needs on a fresh CPU machine (idempotent).
# torch is pinned to the 2.13.0 CPU build: an unpinned torch pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
# spark: tests/test_estimators_spark.py runs the lake estimators on local[2] (Java 17 on the machine)
.venv/bin/python -m pip install -q -e ".[dev,spark]"
.venv/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
echo "acceptscope: .venv ready ($(.venv/bin/python -c 'import torch, duckdb; print("torch", torch.__version__, "duckdb", duckdb.__version__)'))"
