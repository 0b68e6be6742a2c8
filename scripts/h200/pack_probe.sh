#!/usr/bin/env bash
# Here (CPU): put the Hopper part of sglang-kernel 0.4.10 (the kernel package SGLang 0.5.23 pins) into
# .whl/probe/ (ignored by .gitignore) for ONE device call, scripts/h200/probe.sh, that tries to load it
# under the device's torch 2.11.0+cu130. Only sgl_kernel's Python files and sm90/common_ops.abi3.so
# travel (~9 MB): common_ops is the first extension `import sgl_kernel` loads, and the one that fails.
# The full wheel (373 MB: FA3's flash_ops.abi3.so alone is 342 MB compressed) cannot travel in one call.
set -euo pipefail
cd "$(dirname "$0")/../.."
git check-ignore -q .whl/probe || { echo "error: .whl/ is not ignored (add /.whl/ to .gitignore or .git/info/exclude)" >&2; exit 2; }
WORK="${WORK:-/tmp/acceptscope-h200}"
mkdir -p "$WORK" .whl/probe
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d "$WORK" sglang-kernel==0.4.10
rm -rf "$WORK/sk" && mkdir -p "$WORK/sk"
(cd "$WORK/sk" && unzip -q "$WORK"/sglang_kernel-0.4.10-*.whl 'sgl_kernel/*' 'sglang_kernel-0.4.10.dist-info/*' \
  -x 'sgl_kernel/flash_ops.abi3.so' 'sgl_kernel/sm100/*' 'sgl_kernel/infllm_ops*' 'sgl_kernel/flashmla_ops*')
tar -C "$WORK/sk" -czf .whl/probe/sgl_kernel_sm90.tgz sgl_kernel sglang_kernel-0.4.10.dist-info
(cd .whl/probe && sha256sum sgl_kernel_sm90.tgz > SHA256SUMS)
du -b .whl/probe/* | sed 's/^/probe: /'
