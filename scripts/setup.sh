#!/usr/bin/env bash
# Create .venv with everything acceptscope needs on a fresh CPU machine (idempotent): the core
# and every extra ([dev] = engine + app + live + the test tools; [spark] for the lake tests).
# torch is pinned to the 2.13.0 CPU build: an unpinned torch pulls a multi-GB CUDA build.
# VENV=/path bash scripts/setup.sh builds it elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# shellcheck source=pip-quiet.sh
source scripts/pip-quiet.sh
pip_install "$VENV/bin/python" --upgrade pip
pip_install "$VENV/bin/python" "torch==2.13.0"
# spark: tests/test_estimators_spark.py runs the lake estimators on local[2] (Java 17 on the machine)
# (setuptools' "Editable installation ... folders with the same name as your package" notice is information
# about editable installs in general, not a problem of this one: kept out of the set-up's output)
PYTHONWARNINGS="ignore:Editable installation" pip_install "$VENV/bin/python" -e ".[dev,spark]"
"$VENV/bin/python" -m ipykernel install --sys-prefix --name python3 >/dev/null
# the package's own bytecode: pip compiles what it installs, not an editable source tree, and where
# PYTHONDONTWRITEBYTECODE is set (this project's machine) every process compiled ~160 modules again
# (~0.08 CPU-s of every `estimate`'s imports). A source edited later is recompiled in memory, as usual.
"$VENV/bin/python" -m compileall -q acceptscope estimators app >/dev/null
echo "acceptscope: $VENV ready ($("$VENV/bin/python" -c 'import torch, duckdb; print("torch", torch.__version__, "duckdb", duckdb.__version__)'))"
