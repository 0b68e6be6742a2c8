"""Atomic outputs and strict JSON (issue 30, items 4 and 8): a kill, ``ulimit -f`` or a full disk leaves
the old file whole; every JSON document we print parses under a strict parser."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from acceptscope.export import MANIFEST, export_parquet, read_export
from acceptscope.ingest import ingest_paths
from acceptscope.outputs import atomic_write, dumps_strict
from acceptscope.store import Store

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures" / "sglang"


def _py(code: str, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=120, **kw)


def _temps(d: Path) -> list[str]:
    return [p.name for p in d.iterdir() if p.name.endswith(".tmp")]


def test_atomic_write_replaces_the_whole_file(tmp_path):
    f = tmp_path / "out.html"
    atomic_write(f, "old")
    atomic_write(f, b"new bytes")
    assert f.read_bytes() == b"new bytes" and not _temps(tmp_path)


def test_file_size_limit_leaves_the_old_file_whole(tmp_path):
    """``ulimit -f``: the write fails with EFBIG; the old file is untouched and no temporary is left."""
    f = tmp_path / "table.json"
    f.write_text("the good old table")
    r = _py(f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        from acceptscope.outputs import atomic_write
        try:
            atomic_write({str(f)!r}, "x" * 100_000)
        except OSError as e:
            print("refused", e.errno)
            sys.exit(3)
    """)
    assert r.returncode == 3 and "refused" in r.stdout, r.stderr
    assert f.read_text() == "the good old table" and not _temps(tmp_path)


def test_kill_mid_write_leaves_the_old_file_whole(tmp_path):
    f = tmp_path / "report.html"
    f.write_text("the good old report")
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from acceptscope.outputs import atomic_file
        with atomic_file({str(f)!r}) as out:
            out.write("half a report" * 1000)
            out.flush()
            print("writing", flush=True)
            time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.stdout.readline().strip() == "writing"
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    assert f.read_text() == "the good old report"
    assert all(n.startswith(".") for n in _temps(tmp_path))  # a killed write leaves only a hidden temporary


@pytest.fixture(scope="module")
def fixture_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("db") / "f.duckdb"
    ingest_paths([FIX], Store(db), progress=False)
    return db


def _lake(out: Path) -> dict:
    return {t: read_export(out, t).num_rows for t in ("runs", "steps", "request_steps", "gaps")}


def test_export_killed_mid_reexport_keeps_the_old_lake(fixture_db, tmp_path):
    """The new partition is written before the old one is dropped and the manifest last: a kill after the
    first new partition is staged leaves every old partition and the old manifest."""
    out = tmp_path / "lake"
    export_parquet(Store(fixture_db, read_only=True), None, out)
    before, manifest = _lake(out), (out / MANIFEST).read_bytes()
    r = _py(f"""
        import os, signal
        from acceptscope import export
        from acceptscope.store import Store
        real = export._Swap.replace
        n = [0]
        def replace(self, *a, **k):
            n[0] += 1
            if n[0] == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # killed with a partition staged, old ones in place
            return real(self, *a, **k)
        export._Swap.replace = replace
        export.export_parquet(Store({str(fixture_db)!r}, read_only=True), None, {str(out)!r})
    """)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert _lake(out) == before and (out / MANIFEST).read_bytes() == manifest
    export_parquet(Store(fixture_db, read_only=True), None, out)  # the next export clears the leftovers
    assert _lake(out) == before and not [p for p in out.iterdir() if p.name.startswith(".")]


def test_export_on_a_full_disk_keeps_the_old_lake(fixture_db, tmp_path):
    out = tmp_path / "lake"
    export_parquet(Store(fixture_db, read_only=True), None, out)
    before, manifest = _lake(out), (out / MANIFEST).read_bytes()
    r = _py(f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))
        from acceptscope.export import export_parquet
        from acceptscope.store import Store
        store = Store({str(fixture_db)!r}, read_only=True)
        try:
            export_parquet(store, None, {str(out)!r})
        except OSError as e:
            print("refused", e.errno)
            sys.exit(3)
    """)
    assert r.returncode == 3, r.stderr
    assert _lake(out) == before and (out / MANIFEST).read_bytes() == manifest


def _strict_loads(text: str):
    def refuse(token):
        raise ValueError(f"not strict JSON: {token}")
    return json.loads(text, parse_constant=refuse)


def test_strict_json_has_no_nan():
    doc = {"auroc": float("nan"), "inf": np.float64("-inf"), "arr": np.array([1.5, np.nan]), "n": np.int64(3),
           "t": (1, 2.0), "workload": None}
    got = _strict_loads(dumps_strict(doc))
    assert got == {"auroc": None, "inf": None, "arr": [1.5, None], "n": 3, "t": [1, 2.0], "workload": None}
    assert math.isclose(got["arr"][0], 1.5)
