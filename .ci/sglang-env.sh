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

# 1. torch: the 2.13.0 CPU build on this machine's disk (pip's configured find-links), as in
#    .venv. sglang 0.5.23 pins 2.14.1, but the only 2.14.1 here is the CUDA build, which
#    pulls 17 nvidia-* wheels (6.4 GB); the DSpark recorders run on the CPU build. No
#    torchvision: nothing on the recorders' import chain imports it.
pip_install "$VENV/bin/python" "torch==2.13.0"

# 2. In one resolver run: the import chain of srt/speculative/dspark_components/
#    {dspark_observability,dspark_block_accept_estimator,dspark_sts,dspark_sps}.py and
#    benchmark/dspark_* (sglang/srt/utils/common.py imports triton at its top: 3.8.0 is the
#    release torch 2.14.1 pairs with), and acceptscope's core + test deps.
pip_install "$VENV/bin/python" \
  "triton==3.8.0" msgspec orjson psutil pybase64 requests packaging pillow starlette \
  pydantic pyzmq tqdm IPython aiohttp transformers dill "apache-tvm-ffi==0.1.11" \
  sentencepiece compressed-tensors gguf openai partial-json-parser einops \
  setproctitle uvicorn fastapi numpy \
  duckdb pyarrow pandas rich typer hypothesis pytest

# 3. sglang without its GPU-server dependency set, and acceptscope (editable) on top. --no-deps
#    also skips pip's conflict report, which would list sglang's ~60 GPU-server requirements
#    we leave out on purpose after every later install.
pip_install "$VENV/bin/python" --no-deps "sglang==0.5.23" -e "$ROOT"

# 4. CPU only: drop what no CPU import touches (the tier would be 2.5 GB with them):
#    triton's CUDA toolchain (ptxas, cupti: compiled kernels only; `import triton` loads
#    its Python backends, not these), torch's C++ test binaries and extension headers.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -rf "$SITE/triton/backends/nvidia/bin" "$SITE/triton/backends/nvidia/lib" "$SITE/torch/test" "$SITE/torch/include"

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
