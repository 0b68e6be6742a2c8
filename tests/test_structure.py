"""The structure targets of issue 29, held as tests: rooms small enough to name, no private reach-ins,
no package cycle, one installed top-level name.

Why: the issue found 1,193- and 814-line modules, a 154-line function, ``spark.py`` importing
``_RunAcc`` from ``stream.py``, an engine <-> ingest cycle hidden by lazy imports, and a wheel that put
``estimators`` and ``app`` into site-packages. Each failure lists every offender as ``file:line``.
The import graph comes from ``tests/test_layers.py``'s scanner (one reading of our imports).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.test_layers import ROOT, from_imports, imports, is_module, module_name

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 150
# the folders the targets cover; estimators/ and app/ are scanned where they live (acceptscope/estimators
# and acceptscope/app are symlinks to them, which rglob does not follow)
SCANNED = ("acceptscope", "estimators", "app", "bench")
OURS = ("acceptscope", "estimators", "app", "bench")


def py_files(root: Path = ROOT) -> list[Path]:
    out: list[Path] = []
    for top in SCANNED:
        out += sorted(p for p in (root / top).rglob("*.py") if "__pycache__" not in p.parts)
    return out


def _rel(root: Path, p: Path) -> str:
    return str(p.relative_to(root))


def long_files(root: Path = ROOT) -> list[str]:
    out = []
    for p in py_files(root):
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > MAX_FILE_LINES:
            out.append(f"{_rel(root, p)}:1: {n} lines")
    return out


def long_functions(root: Path = ROOT) -> list[str]:
    out = []
    for p in py_files(root):
        tree = ast.parse(p.read_text(encoding="utf-8"), filename=str(p))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out.append(f"{_rel(root, p)}:{node.lineno}: {node.name} is {n} lines")
    return out


def private_imports(root: Path = ROOT) -> list[str]:
    """``from x import _y`` where x is one of our modules and not the importer itself; importing a private
    *submodule* of the importer's own package (``from acceptscope.cli import _common`` in the CLI) is that
    package's own business and passes."""
    out = []
    for p in py_files(root):
        me = module_name(root, p)
        mine = me if p.name == "__init__.py" else me.rpartition(".")[0]
        for line, base, name in from_imports(root, p):
            if base.split(".")[0] not in OURS or not name.startswith("_") or name.startswith("__") or base == me:
                continue
            if is_module(root, f"{base}.{name}") and (mine == base or mine.startswith(base + ".")):
                continue
            out.append(f"{_rel(root, p)}:{line}: from {base} import {name}")
    return out


def package_of(module: str) -> str:
    """The graph's node: acceptscope's subpackage or top module (``acceptscope.engine``, ``acceptscope.store``)."""
    return ".".join(module.split(".")[:2])


def package_graph(root: Path = ROOT) -> dict[str, dict[str, list[str]]]:
    """node -> imported node -> the ``file:line`` of each import making that edge (lazy imports count:
    an import inside a function still runs; ``if TYPE_CHECKING:`` imports never run and do not)."""
    graph: dict[str, dict[str, list[str]]] = {}
    for top in ("acceptscope", "estimators", "app"):
        for p in sorted((root / top).rglob("*.py")):
            src = package_of(module_name(root, p))
            for line, dst, _ in imports(root, p, runtime_only=True):
                if dst.split(".")[0] != "acceptscope":
                    continue
                d = package_of(dst)
                if d != src and d != "acceptscope":
                    graph.setdefault(src, {}).setdefault(d, []).append(f"{_rel(root, p)}:{line}")
    return graph


def cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def cycle_report(graph: dict[str, dict[str, list[str]]]) -> list[str]:
    out = []
    for comp in cycles(graph):
        out.append(" <-> ".join(comp) + ":")
        out += [f"  {a} -> {b}: {', '.join(graph[a][b])}" for a in comp for b in comp if b in graph.get(a, {})]
    return out


def _fail(what: str, found: list[str]) -> str:
    return f"{len(found)} {what}:\n" + "\n".join(found)


def test_no_file_over_800_lines():
    found = long_files()
    assert not found, _fail(f"file(s) over {MAX_FILE_LINES} lines", found)


def test_no_function_over_150_lines():
    found = long_functions()
    assert not found, _fail(f"function(s) over {MAX_FUNCTION_LINES} lines", found)


def test_no_private_cross_module_import():
    found = private_imports()
    assert not found, _fail("private cross-module import(s)", found)


def test_no_package_level_import_cycle():
    found = cycle_report(package_graph())
    assert not found, "package-level import cycle(s):\n" + "\n".join(found)


def _plant(root: Path) -> Path:
    for top in SCANNED:
        (root / top).mkdir()
        (root / top / "__init__.py").write_text("")
    return root


def test_checkers_find_planted_offenders(tmp_path):
    """The checkers themselves: a long file, a long function, a private import, a lazy-import cycle, each
    named with file:line; what is allowed (a TYPE_CHECKING import, the own package's private submodule) passes."""
    root = _plant(tmp_path)
    (root / "acceptscope" / "big.py").write_text("x = 1\n" * (MAX_FILE_LINES + 1))
    body = "".join(f"    a{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (root / "bench" / "fn.py").write_text(f"import os\n\n\ndef long_one():\n{body}")
    (root / "estimators" / "a.py").write_text("from acceptscope.estimators.b import _Acc, Public\n")
    (root / "estimators" / "b.py").write_text("class _Acc: ...\nclass Public: ...\n")
    (root / "acceptscope" / "cli").mkdir()
    (root / "acceptscope" / "cli" / "__init__.py").write_text("from acceptscope.cli import _common\n")
    (root / "acceptscope" / "cli" / "_common.py").write_text("X = 1\n")
    (root / "acceptscope" / "engine").mkdir()
    (root / "acceptscope" / "engine" / "__init__.py").write_text("def f():\n    from acceptscope.ingest import p\n")
    (root / "acceptscope" / "ingest").mkdir()
    (root / "acceptscope" / "ingest" / "__init__.py").write_text("")
    (root / "acceptscope" / "ingest" / "p.py").write_text("from acceptscope.engine import f\n")
    (root / "acceptscope" / "writer.py").write_text("from typing import TYPE_CHECKING\n"
                                                   "if TYPE_CHECKING:\n    from acceptscope.store import S\n")
    (root / "acceptscope" / "store.py").write_text("from acceptscope.writer import W\n")
    (root / "acceptscope" / "estimators").symlink_to(Path("..") / "estimators")
    assert long_files(root) == [f"acceptscope/big.py:1: {MAX_FILE_LINES + 1} lines"]
    assert long_functions(root) == [f"bench/fn.py:4: long_one is {MAX_FUNCTION_LINES + 1} lines"]
    assert private_imports(root) == ["estimators/a.py:1: from acceptscope.estimators.b import _Acc"]
    assert cycle_report(package_graph(root)) == [
        "acceptscope.engine <-> acceptscope.ingest:",
        "  acceptscope.engine -> acceptscope.ingest: acceptscope/engine/__init__.py:2",
        "  acceptscope.ingest -> acceptscope.engine: acceptscope/ingest/p.py:1"]


@pytest.mark.slow
def test_wheel_installs_one_top_level_name(tmp_path):
    """``pip install acceptscope`` puts only ``acceptscope`` (and its metadata) into site-packages. Built from a
    copy of the tree, so the build's own build/ and egg-info never land in the checkout."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".venv-*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis",
        ".ruff_cache", "*.duckdb", "*.duckdb.wal", "node_modules"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src),
                        "-w", str(tmp_path / "out")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = (tmp_path / "out").glob("acceptscope-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = sorted({n.split("/")[0] for n in names})
    extra = [t for t in top if t != "acceptscope" and not (t.startswith("acceptscope-")
                                                           and t.endswith((".dist-info", ".data")))]
    assert not extra, f"the wheel installs top-level names besides acceptscope: {extra} (all: {top})"
    assert any(n.startswith("acceptscope/estimators/") for n in names), "acceptscope.estimators missing"
    assert any(n.startswith("acceptscope/app/") for n in names), "acceptscope.app missing"
