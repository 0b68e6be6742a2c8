"""Output safety and one-line failures (issue 30, items 7 and 8), through the real ``acceptscope`` process.

A run id holding rich markup, terminal escape sequences and an ``<a href>`` must print as text, never
crash a command, never reach the terminal as a control sequence and never become a link in a figure;
every failure is one line with a non-zero exit code; JSON output is strict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pandas as pd
import pytest

from acceptscope.console import console, one_line, plain, safe
from acceptscope.exit_codes import EXIT_NO_DATA
from acceptscope.figures import tables as F
from acceptscope.ingest.synth import make_server_info

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures" / "sglang"
HOSTILE = '[/]x[/bold]\x1b]0;pwned\x07\x1b[2J<a href="http://evil.example">x</a>'


def _cli(*args: str, columns: int = 100) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS=str(columns))
    env.pop("ACCEPTSCOPE_DEBUG", None)
    return subprocess.run([sys.executable, "-c", "from acceptscope.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=300, errors="surrogateescape")


def _strict(text: str):
    def refuse(token):
        raise ValueError(f"not strict JSON: {token}")
    return json.loads(text, parse_constant=refuse)


def _clean(r: subprocess.CompletedProcess) -> None:
    """No control sequence of the data reached the terminal; no traceback, no MarkupError."""
    for stream in (r.stdout, r.stderr):
        assert "\x1b]0;" not in stream and "\x1b[2J" not in stream and "\x07" not in stream
        assert "Traceback" not in stream and "MarkupError" not in stream


@pytest.fixture(scope="module")
def hostile_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("hostile") / "h.duckdb"
    r = _cli("ingest", str(FIX / "capacc.server_info.json"), "--db", str(db), "--run-id", HOSTILE)
    assert r.returncode == 0, r.stderr
    _clean(r)
    return db


def test_console_helpers():
    with console.capture() as cap:  # (the shared console keeps writing to whatever stderr is later)
        console.print(f"run {HOSTILE}")  # a site that forgot safe(): printed as text, not raised
        console.print(f"[red]run[/red] {safe(HOSTILE)}")
    out = cap.get()
    assert "\x1b]0;" not in out and "\x1b[2J" not in out and out.count("[/]x[/bold]") == 2
    assert plain("a\x1bb\u202ec") == "a?b?c"
    line = one_line(ValueError("x" * 130_000 + "\nsecond"))
    assert "\n" not in line and len(line) <= 400 and "characters" in line


@pytest.mark.parametrize("columns", [60, 200])
def test_commands_on_a_hostile_run_id(hostile_db, tmp_path, columns):
    r = _cli("estimate", "--db", str(hostile_db), columns=columns)
    assert r.returncode == 0, r.stderr
    _clean(r)
    r = _cli("calibrate", "--run", HOSTILE, "--db", str(hostile_db), "--out", str(tmp_path / "sts.json"), "--json",
             columns=columns)
    assert r.returncode == 0, r.stderr
    _clean(r)
    _strict(r.stdout)
    r = _cli("export", "--all", "--parquet", str(tmp_path / "lake"), "--db", str(hostile_db), columns=columns)
    assert r.returncode == 0, r.stderr
    _clean(r)


def test_report_on_a_hostile_run_id_is_strict_and_link_free(hostile_db, tmp_path):
    out = tmp_path / "r.html"
    r = _cli("report", "--db", str(hostile_db), "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    _clean(r)
    _strict(r.stdout)
    html = out.read_text()
    assert "evil.example" in html  # shown, as text
    for link in ('<a href="http://evil.example"', '<a href=\\"http://evil.example', '\\u003ca href='):
        assert link not in html, link  # never a tag: not in a table, not in a figure's JSON


def test_figures_show_links_as_text():
    win = pd.DataFrame({"workload": ['<a href="http://evil.example">w</a>'] * 2, "window": [1, 2], "blocks": [3, 4],
                        "arm": ["compact", "compact"], "run_id": ["r", "r"]})
    html = F.fig_windows(win).to_html(include_plotlyjs=False)
    assert "<a href" not in html and "\\u003ca href" not in html and "evil.example" in html  # (plotly's JSON: < is \\u003c)


def test_estimate_json_is_strict(hostile_db):
    r = _cli("estimate", "--db", str(hostile_db), "--json")
    assert r.returncode == 0, r.stderr
    assert "NaN" not in r.stdout
    _strict(r.stdout)


def test_calibrate_on_a_one_request_run_cannot_estimate(tmp_path):
    dump = tmp_path / "one.json"
    dump.write_bytes(msgspec.json.encode(make_server_info(ranks=1, n_steps=6, bs=1, gamma=4, seed=3)))
    db = tmp_path / "one.duckdb"
    assert _cli("ingest", str(dump), "--db", str(db)).returncode == 0
    run = _strict(_cli("ingest", str(dump), "--db", str(db), "--json").stdout)["runs"][0]
    r = _cli("calibrate", "--run", run, "--db", str(db), "--out", str(tmp_path / "sts.json"))
    assert r.returncode == EXIT_NO_DATA, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "cannot calibrate" in r.stderr
    assert not (tmp_path / "sts.json").exists()


def test_unwritable_output_is_one_line(hostile_db, tmp_path):
    """An output path that cannot be created (its parent is a file: refused even to root) is one line, exit != 0;
    so is a report into it."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    for args in (("export", "--all", "--parquet", str(blocker / "lake")), ("report", "--out", str(blocker / "r.html"))):
        r = _cli(*args, "--db", str(hostile_db))
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        _clean(r)


def test_failed_attach_leaves_no_database(tmp_path):
    db = tmp_path / "attach.duckdb"
    r = _cli("live", "attach", "--url", "http://127.0.0.1:9", "--duration", "1", "--db", str(db))
    assert r.returncode != 0
    assert not list(tmp_path.glob("attach.duckdb*"))


def test_report_on_a_run_without_requests_and_on_a_full_disk(tmp_path):
    """A run whose steps hold 0 requests still reports (strict JSON); a report that cannot be written
    (``ulimit -f``: the disk-full path) is one line, exit != 0, and the old report stays whole."""
    doc = make_server_info(ranks=1, n_steps=6, bs=1, gamma=4, seed=3)
    for rec in doc["internal_states"][0]["dspark_info_record"]["records"]:
        rec.update(reqs=[], bs=0, num_running_reqs=0)
    dump = tmp_path / "zero.json"
    dump.write_bytes(msgspec.json.encode(doc))
    db = tmp_path / "z.duckdb"
    assert _cli("ingest", str(dump), "--db", str(db)).returncode == 0
    out = tmp_path / "z.html"
    r = _cli("report", "--db", str(db), "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    _strict(r.stdout)
    good = out.read_bytes()
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100")
    code = ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536)); from acceptscope.cli import main; main()")
    r = subprocess.run([sys.executable, "-c", code, "report", "--db", str(db), "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1].startswith("acceptscope: "), r.stderr
    assert "Traceback" not in r.stderr and out.read_bytes() == good


def test_a_130_kb_run_id_is_refused_in_one_line(tmp_path):
    db = tmp_path / "x.duckdb"
    r = _cli("ingest", str(FIX / "capacc.server_info.json"), "--db", str(db), "--run-id", "r" * 130_000)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and len(r.stderr) < 1000, r.stderr[:300]
    assert not list(tmp_path.iterdir())  # refused before the database file is made
