"""What a newcomer meets first (issue 31): --help that reads at 80 columns, one phrase for a missing
database in every command, a report path with a typo refused rather than created, a quiet test command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from acceptscope.cli import app
from acceptscope.store import Store

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = [[], ["audit"], ["run"], ["ingest"], ["estimate"], ["calibrate"], ["report"], ["dashboard"], ["export"],
            ["train"], ["train", "drafter"], ["profile"], ["live"], ["live", "attach"], ["live", "launch"],
            ["live", "drive"], ["live", "export-metrics"], ["live", "sps-profile"]]


def _help(cmd: list[str], columns: int) -> str:
    r = CliRunner().invoke(app, [*cmd, "--help"], env={"COLUMNS": str(columns)})
    assert r.exit_code == 0, r.output
    return r.output


@pytest.mark.parametrize("columns", [60, 80, 200])
def test_help_reads_at_any_width(columns):
    for cmd in COMMANDS:
        text = _help(cmd, columns)
        name = " ".join(cmd) or "acceptscope"
        assert "<bool>" not in text and not re.search(r"<(str|int|float|path|int range)>", text), name
        assert max(map(len, text.splitlines())) <= max(columns, 80), name  # example blocks stay within 80
    assert "needs the [spark] extra" in " ".join(_help(["estimate"], columns).split())  # not eaten as markup


def test_help_paragraphs_are_rewrapped_not_ragged():
    """A help paragraph fills its lines: no line but a paragraph's last is cut far short of the width."""
    text = _help(["estimate"], 80)
    para = text.split("With --lake")[1].split("\n\n")[0].splitlines()
    assert len(para) >= 2 and all(len(ln) >= 60 for ln in para[:-1]), para


@pytest.mark.parametrize("cmd", [["estimate"], ["calibrate", "--run", "r"], ["report"], ["dashboard"],
                                 ["export", "--all", "--parquet", "p"], ["live", "export-metrics"]])
def test_one_phrase_for_a_missing_database(tmp_path, cmd):
    db = tmp_path / "nope.duckdb"
    r = CliRunner().invoke(app, [*cmd, "--db", str(db)])
    assert r.exit_code == 2, r.output
    assert f"{db}: no such database file" in " ".join(r.output.split()), r.output
    assert not db.exists()


def test_report_refuses_an_out_dir_that_does_not_exist(tmp_path):
    db = tmp_path / "a.duckdb"
    Store(db)  # an empty store: the path check comes first
    missing = tmp_path / "no" / "such"
    r = CliRunner().invoke(app, ["report", "--db", str(db), "--out", str(missing / "r.html")])
    assert r.exit_code == 2, r.output
    assert "no such directory" in r.output and not (tmp_path / "no").exists()


def test_the_test_command_is_quiet_and_says_what_it_installs():
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    flags = re.findall(r"pytest[^\n]*?-r(\w+)", test_sh)
    assert flags and all("p" not in f and "P" not in f and "A" not in f for f in flags)  # no PASSED lines
    browser = (ROOT / ".ci" / "browser-deps.sh").read_text()
    assert "installing" in browser and "already" in browser
