"""Stand-in for pytorch/vision#9649 (bug pytorch/vision#9085), owned by the layered CPU `sglang` tier env.

`.ci/sglang-env.sh` copies this file into .venv-sglang's site-packages (never into .venv, never into the
acceptscope package) with a one-line .pth that imports it at interpreter start. Why: sglang 0.5.23 imports
`torchvision.transforms` at module top (configs/__init__ -> nano_nemotron_vl -> multimodal.internvl_utils);
the only torchvision this Debian 12 machine can install beside torch 2.13.0+cpu is PyPI's 0.28.0, whose `_C`
needs CUDA libraries and does not load. torchvision tolerates that (`extension._has_ops()` is False and an op
raises only when called), except `_meta_registrations.py`, which registers fake kernels for `torchvision::nms`
and `torchvision::qnms` unguarded, so `import torchvision` fails: "operator torchvision::nms does not exist".
pytorch/vision#9649 guards those two registrations with `_has_ops()`; no release here carries it.

What this does: wraps the loader of `torchvision._meta_registrations`. If executing it fails with exactly that
error while torchvision's own `_C` did not load, it declares the two op schemas (as torchvision's C++ declares
them; no kernel, so calling either op still raises) and runs the module again, which then registers its fake
kernels as upstream intends. The ops are never executed on the recorder path. When torchvision imports on its
own (a CPU torchvision whose `_C` loads, or a release with #9649) the first run succeeds and this does nothing.
Delete it, and its .pth, once either exists here.
"""
import importlib.machinery
import sys

_TARGET = "torchvision._meta_registrations"
_SCHEMAS = {  # torchvision/csrc/ops/nms.cpp and ops/quantized/cpu/qnms_kernel.cpp (0.28.0's _C.so)
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIBS = []  # the torch.library.Library objects must stay alive for their definitions to stay registered
declared = []  # names declared by the stand-in, for the env's check and for anyone asking


def _declare_missing():
    import torch

    lib = torch.library.Library("torchvision", "FRAGMENT")
    for name, schema in _SCHEMAS.items():
        if not hasattr(torch.ops.torchvision, name):
            lib.define(schema)
            declared.append(name)
    _LIBS.append(lib)


class _Loader:
    """Runs the real loader; retries once after declaring the schemas, only on bug #9085's exact error."""

    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        try:
            self.inner.exec_module(module)
            return
        except RuntimeError as e:
            ext = sys.modules.get("torchvision.extension")
            bug = any(f"operator torchvision::{n} does not exist" in str(e) for n in _SCHEMAS)
            if not bug or ext is None or ext._has_ops():
                raise
        # Before the failing line only `register_meta` ran, a no-op while _has_ops() is False: re-running is safe.
        _declare_missing()
        self.inner.exec_module(module)


class _Finder:
    """Wraps the loader of torchvision._meta_registrations only; every other import is left to the path finder."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(_Finder)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if _Finder not in sys.meta_path:
    sys.meta_path.insert(0, _Finder)
