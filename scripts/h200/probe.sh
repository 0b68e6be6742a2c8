#!/usr/bin/env bash
# On the device (one call, carry [".whl"] after scripts/h200/pack_probe.sh): can sglang-kernel 0.4.10,
# which SGLang 0.5.23 imports unconditionally on CUDA, load under the image's torch? Prints the image's
# versions, the five torch symbols the CPU analysis found missing from torch 2.11.0, and the import result.
set -uo pipefail
cd "$(dirname "$0")/../.."
python3 - <<'PY'
import importlib.metadata as md, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.get_device_name(0))
for n in ("triton", "nvidia-nccl-cu13", "nvidia-cudnn-cu13", "cuda-toolkit", "nvidia-cuda-runtime", "transformers", "torchvision"):
    try:
        print(n, md.version(n))
    except md.PackageNotFoundError:
        print(n, "absent")
PY
(cd .whl/probe && sha256sum -c SHA256SUMS) || exit 3
rm -rf /tmp/sk && mkdir -p /tmp/sk && tar -C /tmp/sk -xzf .whl/probe/sgl_kernel_sm90.tgz
LIB=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
for s in _ZN3c1019NotImplementedErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE \
         _ZN3c104cuda19CUDAErrorLogCaptureC1Ev \
         _ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jbPNS0_19CUDAErrorLogCaptureE; do
  n=$(for f in "$LIB"/libc10*.so "$LIB"/libtorch*.so; do nm -D --defined-only "$f" 2>/dev/null; done | grep -c " $s\$")
  echo "symbol defined in image torch: $n  $s"
done
cd /tmp && PYTHONPATH=/tmp/sk python3 -c 'import sgl_kernel, torch; print("sgl_kernel", sgl_kernel.__version__, "LOADED"); print(torch.ops.sgl_kernel.rmsnorm)' 2>&1 | tail -4
