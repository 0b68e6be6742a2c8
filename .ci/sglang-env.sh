#!/usr/bin/env bash
# Build /work/main/.venv-sglang: the environment of the `sglang` test tier.
#
# Why a second venv: sglang 0.5.23 wants torch 2.14.1 (the main .venv pins the
# 2.13.0 CPU build) and a long import chain. We install the wheel with --no-deps
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
PIP=("$VENV/bin/python" -m pip install --progress-bar off -q)

# 1. torch: these releases are on this machine's disk (pip's configured find-links / local index).
"${PIP[@]}" "torch==2.14.1" "torchvision==0.29.1"

# 2. sglang itself, without its (GPU-server) dependency set.
"${PIP[@]}" --no-deps "sglang==0.5.23"

# 3. The import chain of srt/speculative/dspark_components/{dspark_observability,
#    dspark_block_accept_estimator,dspark_sts,dspark_sps}.py and benchmark/dspark_*.
"${PIP[@]}" \
  msgspec orjson psutil pybase64 requests triton packaging pillow starlette \
  pydantic pyzmq tqdm IPython aiohttp transformers dill "apache-tvm-ffi==0.1.11" \
  sentencepiece compressed-tensors gguf openai partial-json-parser einops \
  setproctitle uvicorn fastapi numpy

# 4. acceptscope (editable, no deps: keep sglang's torch) + its light deps for the tests.
"${PIP[@]}" duckdb pyarrow pandas rich typer hypothesis pytest msgspec
"${PIP[@]}" --no-deps -e "$ROOT"

# 5. Verify the modules the tier drives import.
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
