"""Options and helpers shared by the CLI command modules."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from acceptscope.console import console  # noqa: F401 - re-exported for the command modules
from acceptscope.exit_codes import EXIT_FAILURE, EXIT_NO_DATA, EXIT_OK, EXIT_USAGE  # noqa: F401

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
