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
# the repository keeps estimators/ and app/ at its top (the product layout); the wheel installs them as
# acceptscope.estimators and acceptscope.app (symlinks in a checkout), and code imports them by those names only
INSTALLED_AS = {"estimators": "acceptscope.estimators", "app": "acceptscope.app"}

# bottom to top; a module belongs to the layer of its longest matching prefix
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("schema", ("acceptscope", "acceptscope.schema", "acceptscope.arrow_columns", "acceptscope.exit_codes",
                "acceptscope.console")),
    # numpy models of SGLang's tables and rules, the prompt sets and the data locations: no torch, no store
    ("domain", ("acceptscope.domain",)),
    ("store", ("acceptscope.store", "acceptscope.store_lock", "acceptscope.store_dedupe", "acceptscope.store_sql",
               "acceptscope.runs_table",
               "acceptscope.writer", "acceptscope.reader", "acceptscope.summaries")),
    ("ingest+engine", ("acceptscope.ingest", "acceptscope.engine", "acceptscope.live", "acceptscope.export")),
    ("estimators", ("acceptscope.estimators", "acceptscope.audit_sampling", "acceptscope.parity")),
    ("figures", ("acceptscope.figures",)),
    # the Prometheus exporter is an output surface like the report: it serves estimates (estimators.tail)
    ("report+audit", ("acceptscope.report", "acceptscope.audit", "acceptscope.estimate_views",
                      "acceptscope.live.exporter")),
    ("cli+app", ("acceptscope.cli", "acceptscope.app")),
)
LEVEL = {name: i for i, (name, _) in enumerate(LAYERS)}

# optional extras: the lowest layer that may import them
EXTRAS = {"plotly": "figures", "jinja2": "report+audit", "streamlit": "cli+app"}
# (module, extra) pairs allowed below that layer, each with its reason; imported lazily inside a function
LAZY_EXTRAS: dict[tuple[str, str], str] = {}

# Imports at module top unless there is a measured reason. Each in-function import must match one
# (importer, imported) pair here: importer = a module, or "pkg.*" for every module under pkg;
# imported = a module and its submodules. Costs are extra import time over `import acceptscope.cli`
# (python -X importtime, min of 3, on the shared 2-core dev machine; see the issue 12 report).
LAZY_IMPORTS: dict[tuple[str, str], str] = {
    # CLI start-up: every command module is imported for `acceptscope --help`, so a command imports
    # the core it runs inside its function. The root cost is pyarrow (acceptscope.schema +1.3 s).
    ("acceptscope.cli.*", "acceptscope.schema"): "start-up: pyarrow, +1.3 s",
    ("acceptscope.cli.*", "acceptscope.store"): "start-up: pyarrow + duckdb, +1.2 s",
    ("acceptscope.cli.*", "duckdb"): "start-up: +0.14 s",
    ("acceptscope.cli.*", "acceptscope.ingest"): "start-up: +1.5 s",
    ("acceptscope.cli.*", "acceptscope.export"): "start-up: +2.4 s",
    ("acceptscope.cli.*", "acceptscope.audit"): "start-up: +5.0 s (engine, report, estimators)",
    ("acceptscope.cli.*", "acceptscope.report"): "start-up: +3.5 s; the [app] extra (jinja2, plotly)",
    ("acceptscope.cli.*", "acceptscope.live"): "the [live] extra (requests, prometheus_client); start-up +1.3-2.2 s",
    ("acceptscope.cli.*", "acceptscope.engine"): ("the [engine] extra: torch + transformers at import, +5-7 s "
                                                 "(run, train, profile)"),
    ("acceptscope.cli.*", "acceptscope.domain"): ("start-up: +23 ms on `acceptscope --help` (check_names: "
                                                 "workloads -> corpus), min of 3"),
    ("acceptscope.cli.*", "torch"): "the [engine] extra; +7.2 s",
    ("acceptscope.cli.*", "acceptscope.estimators"): "start-up: +1.2 s (estimators.calibration +3.5 s)",
    # acceptscope.audit imports this package on every audit; its sglang entry point needs the [live] extra
    ("acceptscope.live", "acceptscope.live.launcher"): "the [live] extra (requests)",
    ("acceptscope.live", "acceptscope.live.driver"): "the [live] extra (requests)",
    ("acceptscope.live", "acceptscope.live.session"): "the [live] extra (requests, prometheus_client)",
    ("acceptscope.live.launcher", "torch"): "the [engine] extra; the GPU preflight falls back to nvidia-smi",
    # `.pt` shards are read with torch.load; a core install (no torch) still ingests every other artifact
    # a vLLM metrics dump is parsed by prometheus_client's text parser; a core install ingests every other format
    ("acceptscope.ingest.engines.vllm", "prometheus_client"): "the [live] extra; only a vLLM dump needs it",
    ("acceptscope.ingest.sts_shards", "torch"): "the [engine] extra; +5.7 s after `import acceptscope.ingest`",
    ("acceptscope.engine.gpu_profile", "torch._dynamo"): "+12.7 s over torch; only --compile uses it",
    # run_all imports estimators.validation (batch_band); only the binomial reading needs scipy.stats
    # (scipy.special.bdtr is not bit-equal to binom.cdf)
    ("acceptscope.estimators.validation", "scipy.stats"): "+3.0 s on `import acceptscope.estimators.validation`",
    # only a run whose ceiling is recorded fits STS tables; a store of compact runs never needs the optimizer
    ("acceptscope.estimators.calibration", "scipy.optimize"): ("+0.14 s on every `estimate` (python -X importtime, "
                                                              "min of 3): 5% of a 125k-row compact run's CPU"),
}

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
    if parts[0] in INSTALLED_AS:
        parts = INSTALLED_AS[parts[0]].split(".") + parts[1:]
    return ".".join(parts)


def _in_functions(tree: ast.AST) -> set[int]:
    """ids of the import statements that sit inside a function (at any depth)."""
    out: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out |= {id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import statements under ``if TYPE_CHECKING:`` (read by type checkers, never run)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in (getattr(test, "id", None), getattr(test, "attr", None)):
            out |= {id(n) for s in node.body for n in ast.walk(s) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return out


def _parse(root: Path, path: Path) -> tuple[ast.Module, str]:
    """The file's syntax tree and the package its relative imports resolve against."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    me = module_name(root, path)
    return tree, me if path.name == "__init__.py" else me.rpartition(".")[0]


def _from_base(node: ast.ImportFrom, pkg: str) -> str:
    """The absolute module a ``from ... import`` reads from (relative levels resolved against ``pkg``)."""
    base = node.module or ""
    if node.level:
        anchor = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    return base


def is_module(root: Path, name: str) -> bool:
    """Whether the dotted ``name`` is a module or package of the tree (not a name inside one)."""
    p = root / name.replace(".", "/")
    return p.with_suffix(".py").exists() or p.is_dir()


def imports(root: Path, path: Path, *, in_function_only: bool = False,
            runtime_only: bool = False) -> list[tuple[int, str, bool]]:
    """(line, imported module, at module top?) for every import statement in ``path``
    (only those inside a function with ``in_function_only``; none under ``if TYPE_CHECKING:`` with
    ``runtime_only``)."""
    tree, pkg = _parse(root, path)
    top = {id(n) for n in tree.body}
    inner = _in_functions(tree) if in_function_only else None
    skip = _type_checking_only(tree) if runtime_only else set()
    out = []
    for node in ast.walk(tree):
        if (inner is not None and id(node) not in inner) or id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, pkg)
            # `from pkg import mod` imports pkg.mod when mod is a module
            names = [f"{base}.{a.name}" for a in node.names]
            out += [(node.lineno, n if is_module(root, n) else base, id(node) in top) for n in names]
    return out


def from_imports(root: Path, path: Path) -> list[tuple[int, str, str]]:
    """(line, module imported from, name) for every name of every ``from ... import`` in ``path``."""
    tree, pkg = _parse(root, path)
    return [(node.lineno, _from_base(node, pkg), a.name) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) for a in node.names]


def modules(root: Path):
    """(path, module name, path relative to ``root``) of every module of our packages."""
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            yield path, module_name(root, path), str(path.relative_to(root))


def upward_imports(root: Path = ROOT) -> list[Edge]:
    edges: set[Edge] = set()
    for path, src, rel in modules(root):
        src_layer = layer_of(src)
        assert src_layer is not None, f"{rel}: module {src} is in no layer; add it to LAYERS in tests/test_layers.py"
        for line, dst, at_top in imports(root, path):
            head = dst.split(".")[0]
            if head in INSTALLED_AS:
                edges.add(Edge(rel, line, src, dst, f"imports {head} by its checkout name; the wheel installs it as "
                                                    f"{INSTALLED_AS[head]}"))
            elif head in PACKAGES:
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


def _empty_packages(root: Path) -> Path:
    for pkg in PACKAGES:
        (root / pkg).mkdir()
        (root / pkg / "__init__.py").write_text("")
    for pkg, name in INSTALLED_AS.items():  # as in a checkout
        (root / name.replace(".", "/")).symlink_to(Path("..") / pkg)
    return root


def test_layer_map_is_complete_and_detects_an_upward_import(tmp_path):
    """The checker itself: a planted report -> app import and a plotly import in estimators are found."""
    _empty_packages(tmp_path)
    (tmp_path / "app" / "panel.py").write_text("X = 1\n")
    (tmp_path / "acceptscope" / "report.py").write_text("import json\n\ndef f():\n    from acceptscope.app import panel\n")
    (tmp_path / "estimators" / "fig.py").write_text("import plotly.graph_objects as go\n")
    (tmp_path / "app" / "ok.py").write_text("from acceptscope import report\nimport streamlit\n")
    got = [(e.path, e.dst) for e in upward_imports(tmp_path)]
    assert got == [("acceptscope/report.py", "acceptscope.app.panel"), ("estimators/fig.py", "plotly.graph_objects")]


def test_checkout_names_are_refused(tmp_path):
    """Code imports the estimators and the dashboard by their installed names: ``import estimators`` breaks
    in the wheel, which installs no top-level ``estimators``."""
    _empty_packages(tmp_path)
    (tmp_path / "acceptscope" / "report.py").write_text("from acceptscope.estimators import fig\n")
    (tmp_path / "estimators" / "fig.py").write_text("X = 1\n")
    (tmp_path / "acceptscope" / "audit.py").write_text("from estimators import fig\n")
    got = [(e.path, e.dst) for e in upward_imports(tmp_path)]
    assert got == [("acceptscope/audit.py", "estimators.fig")]


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def lazy_reason(src: str, dst: str) -> str | None:
    """The LAZY_IMPORTS reason that lets module ``src`` import ``dst`` inside a function, if any."""
    for (who, what), why in LAZY_IMPORTS.items():
        mine = _under(src, who[:-2]) if who.endswith(".*") else src == who
        if mine and _under(dst, what):
            return why
    return None


def unexplained_function_imports(root: Path = ROOT) -> list[Edge]:
    """In-function imports with no LAZY_IMPORTS reason."""
    out: set[Edge] = set()
    for path, src, rel in modules(root):
        for line, dst, _ in imports(root, path, in_function_only=True):
            if lazy_reason(src, dst) is None:
                out.add(Edge(rel, line, src, dst, "inside a function: hoist it, or add a measured "
                                                  "reason to LAZY_IMPORTS in tests/test_layers.py"))
    return sorted(out, key=lambda e: (e.path, e.line, e.dst))


def test_imports_at_module_top_unless_a_measured_reason():
    lazy = unexplained_function_imports()
    assert not lazy, f"{len(lazy)} in-function import(s):\n" + "\n".join(map(str, lazy))


def test_function_import_rule_detects_and_allows(tmp_path):
    """The checker itself: a planted in-function import is reported with file:line; a listed reason clears it."""
    _empty_packages(tmp_path)
    (tmp_path / "estimators" / "late.py").write_text("import json\n\n\ndef f():\n    import pyarrow as pa\n    return pa\n")
    (tmp_path / "acceptscope" / "cli").mkdir()
    (tmp_path / "acceptscope" / "cli" / "cmd.py").write_text("def f():\n    from acceptscope.store import Store\n")
    got = [str(e).split(" ")[0] + " " + e.dst for e in unexplained_function_imports(tmp_path)]
    assert got == ["estimators/late.py:5: pyarrow"]


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
    lazy = unexplained_function_imports(root)
    print(f"{len(lazy)} in-function imports without a LAZY_IMPORTS reason")
    for e in lazy:
        print(f"  {e}")
