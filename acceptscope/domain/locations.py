"""Where the reference models, the GPU cost profiles and the fixtures are found, checkout or installed wheel.

Why in the domain package: the CLI checks a ``--cost-profile`` name before any model loads, without the
``[engine]`` extra; the engine resolves its model and table paths through the same rules.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def data_roots() -> list[Path]:
    """Where relative model and profile paths (``fixtures/...``) resolve, in order.

    1. the current directory; 2. ``$ACCEPTSCOPE_HOME`` (a checkout, or any folder holding
    ``fixtures/``); 3. the checkout this package runs from (an editable install);
    4. ``<prefix>/share/acceptscope``, where the wheel installs the fixture models and profiles
    (pyproject's ``data-files``).
    """
    roots = [Path.cwd()]
    if os.environ.get("ACCEPTSCOPE_HOME"):
        roots.append(Path(os.environ["ACCEPTSCOPE_HOME"]).expanduser())
    roots.append(REPO_ROOT)
    roots.append(Path(sys.prefix) / "share" / "acceptscope")
    return roots


DEFAULT_TARGET = "fixtures/models/target"
DEFAULT_DRAFTER = "fixtures/models/drafter"
PROFILE_DIR = next((r / "fixtures" / "profiles" for r in data_roots()[1:] if (r / "fixtures" / "profiles").is_dir()),
                   REPO_ROOT / "fixtures" / "profiles")
# the GPU cost profile the audit serves on by default (measured on an H200; fixtures/profiles/README.md)
DEFAULT_COST_PROFILE = "h200-qwen3-8b"

def resolve_model_path(p: str | Path) -> Path:
    """Absolute paths as given; relative ones against :func:`data_roots` in order (cwd, $ACCEPTSCOPE_HOME, checkout)."""
    path = Path(p).expanduser()
    if path.is_absolute() or path.exists():
        return path.resolve()
    for root in data_roots()[1:]:
        if (root / path).exists():
            return root / path
    return path


def resolve_cost_profile(spec: str | Path) -> Path:
    """A shipped profile name (``h200-qwen3-8b``, see ``fixtures/profiles``) or a path to an SPS table."""
    s = str(spec)
    named = PROFILE_DIR / f"{s}.json"
    if "/" not in s and not s.endswith(".json") and named.is_file():
        return named
    p = resolve_model_path(s)
    if not p.is_file():
        names = sorted(f.name.removesuffix(".json") for f in PROFILE_DIR.glob("*.json")
                       if not f.name.endswith((".1d.json", ".manifest.json", ".vclock.json")))
        raise FileNotFoundError(f"cost profile {s!r}: no such file, and not one of the shipped profiles {names}")
    return p
