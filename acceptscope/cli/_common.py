"""Options and helpers shared by the CLI command modules."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

# soft_wrap: messages are never broken by inserted newlines at the terminal's width (paths and run ids
# stay whole for grep and for tests at any COLUMNS); tables still fit the width
console = Console(stderr=True, soft_wrap=True)

# Exit codes scripts can rely on.
EXIT_OK = 0
EXIT_FAILURE = 1  # the command ran and found a problem (e.g. audit parity broken)
EXIT_USAGE = 2  # bad arguments or unreadable input
EXIT_NO_DATA = 3  # the database holds nothing to work on

DbOption = typer.Option(Path("acceptscope.duckdb"), "--db", help="DuckDB telemetry file.")
JsonOption = typer.Option(False, "--json", help="Print a machine-readable JSON summary on stdout.")


def emit_json(summary: Any) -> None:
    """Write one JSON document to stdout (human output goes to stderr)."""
    sys.stdout.write(json.dumps(summary, indent=2, default=str) + "\n")
    sys.stdout.flush()


def unreadable_db(db: Any, e: BaseException) -> typer.Exit:
    """Say in one line why ``db`` cannot be read (corrupt, not DuckDB, not telemetry); the exit to raise (2)."""
    first = (str(e).strip().splitlines() or [""])[0]
    console.print(f"{db}: not a readable acceptscope database ({type(e).__name__}: {first})",
                  style="red", markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(EXIT_USAGE)


def open_store_read_only(db: Path) -> Any:
    """A read-only :class:`acceptscope.store.Store` (a read command never creates tables in a file),
    or exit 2 with one line when the file is not a readable acceptscope store."""
    import duckdb

    from acceptscope.store import Store

    try:
        return Store(db, read_only=True)
    except (duckdb.Error, ValueError, OSError) as e:
        raise unreadable_db(db, e) from None
