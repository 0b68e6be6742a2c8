"""Packaging: the core imports without the optional extras, a command missing one says what to
install, and misspelled names fail before any model loads.

Each check runs in a fresh interpreter (subprocess), so what this test process already
imported cannot hide an import-time dependency.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ("torch", "transformers", "safetensors", "tokenizers", "plotly", "streamlit", "jinja2", "requests",
            "prometheus_client", "pyspark")
# the figure library draws with plotly, the [app] extra
NOT_CORE = {"acceptscope.estimators.figures", "acceptscope.estimators.spark"}


def _py(code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="80")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)


def test_core_modules_import_no_optional_extra():
    code = f"""
import importlib, json, pkgutil, sys
import acceptscope.ingest
from acceptscope import estimators
mods = ["acceptscope", "acceptscope.cli", "acceptscope.store", "acceptscope.writer", "acceptscope.schema",
        "acceptscope.export", "acceptscope.domain.sps", "acceptscope.domain.scheduler", "acceptscope.domain.workloads"]
mods += ["acceptscope.estimators." + m.name for m in pkgutil.iter_modules(estimators.__path__)]
mods += ["acceptscope.ingest." + m.name for m in pkgutil.iter_modules(acceptscope.ingest.__path__)]
mods = [m for m in mods if m not in {sorted(NOT_CORE)!r}]
for m in mods:
    importlib.import_module(m)
print(json.dumps({{"n": len(mods), "loaded": [b for b in {OPTIONAL!r} if b in sys.modules]}}))
"""
    r = _py(code)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["n"] > 25
    assert out["loaded"] == [], f"core modules import optional extras at import time: {out['loaded']}"


_MISSING_EXTRA = [
    (["run", "--workload", "math", "--requests", "1"], "engine"),
    (["train", "eval"], "engine"),
    (["report", "--db", "x.duckdb"], "app"),
    (["dashboard", "--db", "x.duckdb"], "app"),
    (["live", "drive", "--url", "http://127.0.0.1:9"], "live"),
]
_BAD_NAMES = [
    (["run", "--workload", "bogus"], "unknown workload 'bogus'"),
    (["run", "--arm", "compactt"], "--arm 'compactt': expected one of compact, cap-accept, static"),
    (["run", "--workload", "math,missing.jsonl"], "missing.jsonl: workload file not found"),
    (["audit", "--workload", "bogus"], "unknown workload 'bogus'"),
    (["audit", "--cost-profile", "h100-nope"], "cost profile 'h100-nope'"),
]
_HIDE = {"engine": "torch", "app": "plotly", "live": "prometheus_client"}

# One fresh interpreter runs every case (the names first, so "torch never loaded" covers all).
_INVOKE = """
import json, sys, time
from typer.testing import CliRunner
from acceptscope.cli import app
out = []
for hide, argv in json.loads(sys.argv[1]):
    saved = {n: sys.modules.get(n) for n in hide}
    for n in hide:
        sys.modules[n] = None  # this module is not installed: import raises, find_spec gives None
    t = time.perf_counter()
    r = CliRunner().invoke(app, argv)
    out.append({"code": r.exit_code, "output": r.output, "s": time.perf_counter() - t,
                "torch": sys.modules.get("torch") is not None})
    for n, m in saved.items():
        if m is None:
            del sys.modules[n]
        else:
            sys.modules[n] = m
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def cli_results():
    cases = [([], argv) for argv, _ in _BAD_NAMES] + [([_HIDE[extra]], argv) for argv, extra in _MISSING_EXTRA]
    r = _py(_INVOKE, json.dumps(cases))
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    return res[:len(_BAD_NAMES)], res[len(_BAD_NAMES):]


@pytest.mark.parametrize("i", range(len(_MISSING_EXTRA)), ids=[" ".join(a[:2]) for a, _ in _MISSING_EXTRA])
def test_missing_extra_names_the_pip_command(cli_results, i):
    got, extra = cli_results[1][i], _MISSING_EXTRA[i][1]
    flat = " ".join(got["output"].split())
    assert got["code"] == 2, got
    assert f"pip install 'acceptscope[{extra}]'" in flat and "Traceback" not in got["output"]


@pytest.mark.parametrize("i", range(len(_BAD_NAMES)), ids=[" ".join(a) for a, _ in _BAD_NAMES])
def test_bad_names_fail_before_any_model_loads(cli_results, i):
    got, message = cli_results[0][i], _BAD_NAMES[i][1]
    assert got["code"] == 2 and not got["torch"], got
    assert message in " ".join(got["output"].split())


def test_pyproject_extras_and_typed_marker():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    core = " ".join(meta["project"]["dependencies"])
    extras = meta["project"]["optional-dependencies"]
    for heavy in ("torch", "transformers", "streamlit", "plotly", "prometheus-client", "requests"):
        assert heavy not in core, f"{heavy} is a core dependency"
    from acceptscope.cli._common import EXTRAS

    for extra in ("engine", "app", "live", "spark"):
        declared = " ".join(extras[extra]).replace("-", "_").lower()
        assert all(m in declared for m in EXTRAS[extra]), (extra, EXTRAS[extra], extras[extra])
    assert (ROOT / "acceptscope" / "py.typed").is_file()
    assert "py.typed" in meta["tool"]["setuptools"]["package-data"]["acceptscope"]


def test_fixture_models_resolve_from_acceptscope_home(tmp_path, monkeypatch):
    """An installed wheel has no checkout beside it: $ACCEPTSCOPE_HOME comes before the checkout."""
    from acceptscope.domain.locations import REPO_ROOT, data_roots, resolve_model_path

    home = tmp_path / "home"
    (home / "fixtures" / "models" / "target").mkdir(parents=True)
    (home / "fixtures" / "models" / "target" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ACCEPTSCOPE_HOME", str(home))
    share = Path(sys.prefix) / "share" / "acceptscope"
    assert data_roots() == [tmp_path, home, REPO_ROOT, share]
    assert resolve_model_path("fixtures/models/target") == home / "fixtures" / "models" / "target"
    monkeypatch.delenv("ACCEPTSCOPE_HOME")
    assert resolve_model_path("fixtures/models/target") == REPO_ROOT / "fixtures" / "models" / "target"


def test_the_wheel_carries_every_fixture_model_and_profile(tmp_path, monkeypatch):
    """pyproject's data-files put every fixture model file and profile under <prefix>/share/acceptscope,
    the last root :func:`data_roots` searches, so an installed wheel runs the main job without a checkout."""
    import glob

    from acceptscope.domain.locations import resolve_model_path

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data_files = meta["tool"]["setuptools"]["data-files"]
    shipped = {str(Path(dest) / Path(f).name) for dest, pats in data_files.items()
               for pat in pats for f in glob.glob(str(ROOT / pat))}
    needed = {str(Path("share/acceptscope") / f.relative_to(ROOT)) for sub in ("models/target", "models/drafter",
              "profiles") for f in (ROOT / "fixtures" / sub).iterdir() if f.is_file()}
    assert needed and needed <= shipped, sorted(needed - shipped)
    # installed layout: found under sys.prefix when neither cwd, $ACCEPTSCOPE_HOME nor a checkout has it
    prefix = tmp_path / "prefix"
    (prefix / "share" / "acceptscope" / "fixtures" / "models" / "only-in-wheel").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ACCEPTSCOPE_HOME", raising=False)
    monkeypatch.setattr(sys, "prefix", str(prefix))
    assert resolve_model_path("fixtures/models/only-in-wheel") == \
        prefix / "share" / "acceptscope" / "fixtures" / "models" / "only-in-wheel"


def test_cli_process_numeric_defaults_unless_told_otherwise():
    """The CLI sets the numeric libraries' process defaults (numpy's 2 MB pages off, Arrow's system pool,
    one OpenBLAS thread: a quarter of `estimate`'s CPU over a fleet) before any of them loads, and keeps
    a value the user set: `import acceptscope.cli` must import none of them itself, or the settings would
    be read too late."""
    code = ("import sys, acceptscope.cli; loaded = [m for m in ('numpy', 'pyarrow', 'scipy') if m in sys.modules]; "
            "assert not loaded, loaded; import numpy, pyarrow, threadpoolctl; from numpy._core import multiarray; "
            "print(multiarray._get_madvise_hugepage(), pyarrow.default_memory_pool().backend_name, "
            "max(i['num_threads'] for i in threadpoolctl.threadpool_info() if i['internal_api'] == 'openblas'))")
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMPY_MADVISE_HUGEPAGE", "ARROW_DEFAULT_MEMORY_POOL", "OPENBLAS_NUM_THREADS")}
    told = {"NUMPY_MADVISE_HUGEPAGE": "1", "ARROW_DEFAULT_MEMORY_POOL": "mimalloc", "OPENBLAS_NUM_THREADS": "2"}
    for extra, want in (({}, "False system 1"), (told, "True mimalloc 2")):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=dict(env, PYTHONPATH=str(ROOT), **extra), cwd=ROOT, timeout=300)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == want
