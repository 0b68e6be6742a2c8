#!/usr/bin/env bash
# Build /work/main/.venv-sglang: the environment of the `sglang` test tier.
#
# Why a second venv: sglang 0.5.23's long import chain (and its own pins) stay out
# of the main .venv. We install the wheel with --no-deps
# and then exactly the packages its DSpark recorders' import chain needs (found
# by trying the imports; see docs in the reference §10), plus acceptscope itself.
#
# Idempotent: a stamp file holding the hash of this script marks a complete
# install; re-running with an unchanged script is a no-op.
#
# Usage: bash .ci/sglang-env.sh            (creates <repo>/.venv-sglang)
#        VENV=/path bash .ci/sglang-env.sh (elsewhere)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv-sglang}"
STAMP="$VENV/.acceptscope-sglang-env"
WANT="$(sha256sum "$0" | cut -d' ' -f1)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] \
   && "$VENV/bin/python" -c "import sglang, acceptscope" 2>/dev/null; then
  echo "sglang-env: $VENV already complete"
  exit 0
fi

PY="${PYTHON:-python3}"
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
# shellcheck source=../scripts/pip-quiet.sh
source "$ROOT/scripts/pip-quiet.sh"

# 1. torch 2.14.1 + torchvision 0.29.1, as sglang 0.5.23 pins them (these releases lie on this
#    machine's disk). They are the CUDA builds and pull 17 nvidia-* wheels (~6 GB): the CPU
#    build here (2.13.0+cpu) runs the recorders, but sglang's import chain reaches
#    torchvision (srt/multimodal/internvl_utils.py) and no CPU torchvision exists here (PyPI's
#    0.28.0 beside 2.13.0+cpu fails: "operator torchvision::nms does not exist").
pip_install "$VENV/bin/python" "torch==2.14.1" "torchvision==0.29.1"

# 2. In one resolver run: the import chain of srt/speculative/dspark_components/
#    {dspark_observability,dspark_block_accept_estimator,dspark_sts,dspark_sps}.py and
#    benchmark/dspark_* (found by trying the imports; see docs in the reference §10), and
#    acceptscope's core + test deps.
pip_install "$VENV/bin/python" \
  msgspec orjson psutil pybase64 requests packaging pillow starlette \
  pydantic pyzmq tqdm IPython aiohttp transformers dill "apache-tvm-ffi==0.1.11" triton \
  sentencepiece compressed-tensors gguf openai partial-json-parser einops \
  setproctitle uvicorn fastapi numpy \
  duckdb pyarrow pandas rich typer hypothesis pytest

# 3. sglang without its GPU-server dependency set, and acceptscope (editable) on top. --no-deps
#    also skips pip's conflict report, which would list sglang's ~60 GPU-server requirements
#    we leave out on purpose after every later install.
pip_install "$VENV/bin/python" --no-deps "sglang==0.5.23" -e "$ROOT"

# 4. Verify the modules the tier drives import.
"$VENV/bin/python" - <<'EOF'
import importlib
for m in (
    "sglang.srt.speculative.dspark_components.dspark_observability",
    "sglang.srt.speculative.dspark_components.dspark_block_accept_estimator",
    "sglang.srt.speculative.dspark_components.dspark_sts",
    "sglang.srt.speculative.dspark_components.dspark_sps",
    "acceptscope.ingest",
):
    importlib.import_module(m)
print("sglang-env: imports ok")
EOF
echo "$WANT" > "$STAMP"
echo "sglang-env: $VENV complete"
