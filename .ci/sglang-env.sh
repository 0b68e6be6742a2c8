#!/usr/bin/env bash
# Build /work/main/.venv-sglang: the environment of the `sglang` test tier (SGLang 0.5.23's own DSpark
# recorders, on CPU). docs/sglang.md ("The `sglang` test tier's environment") says why it is built this way.
#
# Default (layered CPU, ~1 GB): .venv-sglang holds only what .venv lacks, installed --no-deps: sglang,
# triton 3.6.0, PyPI's torchvision 0.28.0 and the small packages of the recorders' import chain. One .pth
# appends .venv's site-packages AFTER its own, so torch 2.13.0+cpu, transformers, numpy, pandas, pyarrow,
# duckdb, pytest and acceptscope (editable) come from .venv: it must exist (scripts/setup.sh builds it).
# torchvision 0.28.0's `_C` needs CUDA and does not load beside CPU torch; a second .pth loads
# .ci/torchvision_nms_schema.py, the stand-in for pytorch/vision#9649 (bug #9085; see that file).
#
# ACCEPTSCOPE_SGLANG_ENV=cuda: the previous standalone env, torch 2.14.1 + torchvision 0.29.1 CUDA builds
# (6.4 GB, 17 nvidia-* wheels), kept so a reviewer can compare.
#
# Idempotent: a stamp holding the hash of this script, the stand-in and the mode marks a complete install;
# re-running unchanged is a no-op. A stamp that differs (e.g. the old 6.4 GB env) rebuilds from scratch.
#
# Usage: bash .ci/sglang-env.sh            (creates <repo>/.venv-sglang)
#        VENV=/path bash .ci/sglang-env.sh (elsewhere)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv-sglang}"
MODE="${ACCEPTSCOPE_SGLANG_ENV:-cpu}"
STANDIN="$ROOT/.ci/torchvision_nms_schema.py"
STAMP="$VENV/.acceptscope-sglang-env"
WANT="$MODE-$(cat "$0" "$STANDIN" | sha256sum | cut -d' ' -f1)"
MAIN="$ROOT/.venv/bin/python"
[[ "$MODE" == cpu || "$MODE" == cuda ]] \
  || { echo "sglang-env: ACCEPTSCOPE_SGLANG_ENV must be cpu or cuda, not '$MODE'" >&2; exit 2; }
if [[ "$MODE" == cpu && ! -x "$MAIN" ]]; then
  echo "sglang-env: $ROOT/.venv is missing; the layered sglang env needs it: run 'bash scripts/setup.sh' first" >&2
  exit 1
fi

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] \
   && "$VENV/bin/python" -c "import sglang, acceptscope" 2>/dev/null; then
  echo "sglang-env: $VENV already complete ($MODE)"
  exit 0
fi
# anything else at $VENV (an older build, a half-done one) is rebuilt from scratch, never installed over
if [[ -e "$VENV" ]]; then
  [[ -f "$VENV/pyvenv.cfg" || -z "$(ls -A "$VENV")" ]] \
    || { echo "sglang-env: $VENV exists and is not a venv; not touching it" >&2; exit 1; }
  echo "sglang-env: removing the previous env at $VENV (its stamp does not match this script)"
  rm -rf "$VENV"
fi
# shellcheck source=../scripts/pip-quiet.sh
source "$ROOT/scripts/pip-quiet.sh"

build_cpu() {
  echo "sglang-env: building the layered CPU env at $VENV on $ROOT/.venv"
  # same interpreter as .venv (venv uses its base executable); no pip or setuptools of its own: .venv's pip
  # installs into it (PIP_PYTHON: pip's --python), and .venv's setuptools is the one on the path
  "$MAIN" -m venv --without-pip "$VENV"
  local own main
  own="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  main="$("$MAIN" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # addsitedir (not a bare path line) so .venv's own .pth files run too: acceptscope's editable finder
  echo "import site; site.addsitedir('$main')" > "$own/zz-acceptscope-main-venv.pth"
  cp "$STANDIN" "$own/_torchvision_nms_schema.py"
  echo "import _torchvision_nms_schema" > "$own/_torchvision_nms_schema.pth"
  # 1. What .venv lacks of the recorders' import chain (srt/speculative/dspark_components/{dspark_observability,
  # dspark_block_accept_estimator,dspark_sts,dspark_sps}.py and benchmark/dspark_*) and those packages' own
  # requirements, from pip's resolver run against .venv (`pip install --dry-run --report` in an env layered like
  # this one, 2026-12-05); step 2 checks every requirement is met, so a drifted list fails here, not in a test.
  PIP_PYTHON="$VENV/bin/python" pip_install "$MAIN" --no-deps \
    "sglang==0.5.23" "triton==3.6.0" "torchvision==0.28.0" "apache-tvm-ffi==0.1.11" \
    orjson pybase64 dill sentencepiece compressed-tensors loguru gguf openai jiter sniffio partial-json-parser \
    einops setproctitle fastapi opentelemetry-api \
    aiohttp aiohappyeyeballs aiosignal frozenlist multidict propcache yarl
  # 2. Every requirement of what we installed (sglang's ~60 GPU-server ones aside, left out on purpose) is met
  #    on the layered path, and torch is .venv's, not a second copy.
  "$VENV/bin/python" - "$own" <<'PY'
import sys
from importlib import metadata

from packaging.requirements import Requirement

own, bad = sys.argv[1], []
for dist in metadata.distributions(path=[own]):
    if dist.metadata["Name"].lower() == "sglang":
        continue
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            bad.append(f"{dist.metadata['Name']} needs {req}: missing")
            continue
        if not req.specifier.contains(have, prereleases=True):
            bad.append(f"{dist.metadata['Name']} needs {req}: have {have}")
import torch

if torch.__file__.startswith(own):
    bad.append(f"a second torch ({torch.__version__}) in {own}: it must come from .venv")
if bad:
    sys.exit("sglang-env: unmet requirements: " + "; ".join(bad))
PY
}

build_cuda() {
  echo "sglang-env: building the standalone CUDA env at $VENV (ACCEPTSCOPE_SGLANG_ENV=cuda)"
  "${PYTHON:-python3}" -m venv "$VENV"
  # 1. torch 2.14.1 + torchvision 0.29.1, as sglang 0.5.23 pins them: the CUDA builds, with 17 nvidia-*
  #    wheels (~6 GB).
  pip_install "$VENV/bin/python" "torch==2.14.1" "torchvision==0.29.1"
  # 2. In one resolver run: the import chain of the recorders, and acceptscope's core + test deps.
  pip_install "$VENV/bin/python" \
    msgspec orjson psutil pybase64 requests packaging pillow starlette \
    pydantic pyzmq tqdm IPython aiohttp transformers dill "apache-tvm-ffi==0.1.11" triton \
    sentencepiece compressed-tensors gguf openai partial-json-parser einops \
    setproctitle uvicorn fastapi numpy \
    duckdb pyarrow pandas rich typer hypothesis pytest
  # 3. sglang without its GPU-server dependency set (--no-deps also skips pip's conflict report), and
  #    acceptscope (editable) on top.
  pip_install "$VENV/bin/python" --no-deps "sglang==0.5.23" -e "$ROOT"
}

"build_$MODE"
# 3. Verify the modules the tier drives import.
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
import torch
print(f"sglang-env: imports ok (torch {torch.__version__})")
EOF
echo "$WANT" > "$STAMP"
echo "sglang-env: $VENV complete ($MODE, $(du -sh "$VENV" | cut -f1))"
