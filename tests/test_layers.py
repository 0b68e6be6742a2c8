"""The import graph runs one way: every module imports only its own layer or the layers below it.

Why this test exists: issue 12 found the core importing the dashboard (report -> app) and the estimators
pulling plotly in. The layer map below is THE description of the architecture, written once; an import
that points upward fails here with the file, line and both layers named.

Run ``python tests/test_layers.py [ROOT]`` to print the count and list of upward imports of a tree
(e.g. an older checkout) without failing.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("acceptscope", "estimators", "app")

# bottom to top; a module belongs to the layer of its longest matching prefix
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("schema", ("acceptscope", "acceptscope.schema", "acceptscope.arrow_columns", "acceptscope.exit_codes",
                "acceptscope.console")),
    ("store", ("acceptscope.store", "acceptscope.writer", "acceptscope.reader", "acceptscope.summaries")),
    ("ingest+engine", ("acceptscope.ingest", "acceptscope.engine", "acceptscope.live", "acceptscope.export")),
    ("estimators", ("estimators", "acceptscope.audit_sampling", "acceptscope.parity")),
    ("figures", ("acceptscope.figures",)),
    # the Prometheus exporter is an output surface like the report: it serves estimates (estimators.tail)
    ("report+audit", ("acceptscope.report", "acceptscope.audit", "acceptscope.estimate_views",
                      "acceptscope.live.exporter")),
    ("cli+app", ("acceptscope.cli", "app")),
)
LEVEL = {name: i for i, (name, _) in enumerate(LAYERS)}

# optional extras: the lowest layer that may import them
EXTRAS = {"plotly": "figures", "jinja2": "report+audit", "streamlit": "cli+app"}
# (module, extra) pairs allowed below that layer, each with its reason; imported lazily inside a function
LAZY_EXTRAS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Edge:
    path: str
    line: int
    src: str
    dst: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.src} -> {self.dst} ({self.why})"


def layer_of(module: str) -> str | None:
    best, best_len = None, -1
    for name, prefixes in LAYERS:
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = name, len(p)
    return best


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(root: Path, path: Path) -> list[tuple[int, str, bool]]:
    """(line, imported module, at module top?) for every import statement in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    me = module_name(root, path)
    pkg = me if path.name == "__init__.py" else me.rpartition(".")[0]
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import mod` imports pkg.mod when mod is a module
            names = [f"{base}.{a.name}" for a in node.names]
            out += [(node.lineno, n if (root / n.replace(".", "/")).with_suffix(".py").exists()
                     or (root / n.replace(".", "/")).is_dir() else base, id(node) in top) for n in names]
    return out


def upward_imports(root: Path = ROOT) -> list[Edge]:
    edges: set[Edge] = set()
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            src = module_name(root, path)
            src_layer = layer_of(src)
            rel = str(path.relative_to(root))
            assert src_layer is not None, f"{rel}: module {src} is in no layer; add it to LAYERS in tests/test_layers.py"
            for line, dst, at_top in imports(root, path):
                head = dst.split(".")[0]
                if head in PACKAGES:
                    dst_layer = layer_of(dst)
                    if dst_layer is not None and LEVEL[dst_layer] > LEVEL[src_layer]:
                        edges.add(Edge(rel, line, src, dst, f"{src_layer} imports {dst_layer}"))
                elif head in EXTRAS and LEVEL[EXTRAS[head]] > LEVEL[src_layer]:
                    if (src, head) in LAZY_EXTRAS and not at_top:
                        continue
                    edges.add(Edge(rel, line, src, dst, f"{src_layer} imports the optional extra {head}"))
    return sorted(edges, key=lambda e: (e.path, e.line, e.dst))


def test_no_upward_imports():
    up = upward_imports()
    assert not up, f"{len(up)} upward import(s):\n" + "\n".join(map(str, up))


def test_layer_map_is_complete_and_detects_an_upward_import(tmp_path):
    """The checker itself: a planted report -> app import and a plotly import in estimators are found."""
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "app" / "panel.py").write_text("X = 1\n")
    (tmp_path / "acceptscope" / "report.py").write_text("import json\n\ndef f():\n    from app import panel\n")
    (tmp_path / "estimators" / "fig.py").write_text("import plotly.graph_objects as go\n")
    (tmp_path / "app" / "ok.py").write_text("from acceptscope import report\nimport streamlit\n")
    got = [(e.path, e.dst) for e in upward_imports(tmp_path)]
    assert got == [("acceptscope/report.py", "app.panel"), ("estimators/fig.py", "plotly.graph_objects")]


def module_edges(edges: list[Edge]) -> list[tuple[str, str]]:
    """Distinct (module, imported module) pairs, an optional extra counted once per package."""
    return sorted({(e.src, e.dst.split(".")[0] if e.dst.split(".")[0] in EXTRAS else e.dst) for e in edges})


if __name__ == "__main__":
    root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT
    found = upward_imports(root)
    pairs = module_edges(found)
    print(f"{len(found)} upward import statements, {len(pairs)} upward module edges in {root}")
    for e in found:
        print(f"  {e}")
