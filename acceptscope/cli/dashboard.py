"""``acceptscope dashboard``: launch the Streamlit dashboard on a DuckDB file."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from acceptscope.cli._common import EXIT_USAGE, DbOption, console, require_db, require_extra

HELP = """Launch the Streamlit dashboard (binds 127.0.0.1 unless --host says so).

It reads the file with short read-only connections, so it can watch a run
that `acceptscope run` / `acceptscope audit` is still writing (turn on
"live refresh" in the sidebar).

\b
Examples:
  acceptscope dashboard --db audit.duckdb
  acceptscope dashboard --db audit.duckdb --port 8600
  # expose on the network (no authentication!):
  acceptscope dashboard --db runs.duckdb --host 0.0.0.0
"""

APP = Path(__file__).resolve().parents[1] / "app" / "dashboard.py"  # acceptscope/app (the checkout: a symlink to app/)


def streamlit_argv(db: Path, port: int, host: str, headless: bool = True) -> list[str]:
    """The exact command the dashboard runs (used by tests, too)."""
    return [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.port", str(port), "--server.address", host,
        "--server.headless", "true" if headless else "false",
        "--browser.gatherUsageStats", "false",
        "--server.fileWatcherType", "none",
        "--", "--db", str(db),
    ]


def register(app: typer.Typer) -> None:
    @app.command("dashboard", help=HELP)
    def dashboard(
        db: Path = DbOption,
        port: int = typer.Option(8501, "--port", help="TCP port."),
        host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (default: loopback only)."),
        open_browser: bool = typer.Option(False, "--open", help="Open a browser tab."),
    ) -> None:
        require_extra("dashboard", "app")
        require_db(db, "create one with `acceptscope run` or `audit`")
        if not APP.exists():
            console.print(f"[red]{APP}: dashboard app not found (is this a source checkout?)[/red]")
            raise typer.Exit(EXIT_USAGE)
        argv = streamlit_argv(db.resolve(), port, host, headless=not open_browser)
        console.print(f"acceptscope dashboard on http://{host}:{port}  (db {db}; Ctrl-C stops)")
        env = dict(os.environ, ACCEPTSCOPE_DB=str(db.resolve()))
        sys.stdout.flush()
        sys.stderr.flush()
        # become the streamlit server (exec, not a child): signals sent to this pid reach the server itself
        os.execve(argv[0], argv, env)
