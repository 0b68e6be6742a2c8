"""Options and helpers shared by the CLI command modules."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from acceptscope.console import console  # noqa: F401 - re-exported for the command modules
from acceptscope.console import plain, safe
from acceptscope.outputs import dumps_strict
from acceptscope.exit_codes import EXIT_FAILURE, EXIT_NO_DATA, EXIT_NOT_BETTER, EXIT_OK, EXIT_USAGE  # noqa: F401

# The optional extras of pyproject.toml and the modules that tell whether each is installed.
EXTRAS = {
    "engine": ("torch", "transformers", "safetensors", "tokenizers"),
    "app": ("streamlit", "plotly", "jinja2"),
    "report": ("plotly", "jinja2"),  # the HTML report: the part of [app] it needs
    "live": ("prometheus_client",),
    "spark": ("pyspark",),
}


def require_extra(command: str, extra: str) -> None:
    """Exit 2 with the one ``pip install`` line when ``command`` needs an extra that is not installed.

    Why here: the core (ingest, store, estimators) installs without torch, plotly or
    streamlit, and a command reaching for one must say what to install, not print a traceback.
    """
    missing = [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]
    if missing:
        pkg = "app" if extra == "report" else extra
        console.print(f"acceptscope {command} needs the [{pkg}] extra (missing: {', '.join(missing)}); "
                      f"install it with:  pip install 'acceptscope[{pkg}]'",
                      style="red", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE)


def check_names(arm: str | None = None, workload: str | None = None, cost_profile: str | None = None) -> None:
    """Exit 2 on a misspelled arm, workload or cost profile *before* any model loads (< 1 s)."""
    from acceptscope.domain.locations import resolve_cost_profile
    from acceptscope.domain.workloads import check_spec
    from acceptscope.schema import ARMS

    try:
        if arm is not None and arm not in ARMS:
            raise ValueError(f"--arm {arm!r}: expected one of {', '.join(ARMS)}")
        if workload is not None:
            check_spec(workload)
        if cost_profile is not None and cost_profile.lower() != "none":
            resolve_cost_profile(cost_profile)
    except (ValueError, FileNotFoundError) as e:
        console.print(str(e), style="red", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE) from None


DbOption = typer.Option(Path("acceptscope.duckdb"), "--db", help="DuckDB telemetry file.")
JsonOption = typer.Option(False, "--json", help="Print a machine-readable JSON summary on stdout.")


def emit_json(summary: Any) -> None:
    """Write one strict JSON document to stdout (``NaN`` -> ``null``; human output goes to stderr)."""
    sys.stdout.write(dumps_strict(summary, indent=2) + "\n")
    sys.stdout.flush()


def unreadable_db(db: Any, e: BaseException) -> typer.Exit:
    """Say in one line why ``db`` cannot be read (corrupt, not DuckDB, not telemetry); the exit to raise (2)."""
    first = (str(e).strip().splitlines() or [""])[0]
    console.print(f"{db}: not a readable acceptscope database ({type(e).__name__}: {first})",
                  style="red", markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(EXIT_USAGE)


def require_db(db: Path, hint: str = "") -> None:
    """Exit 2 with the one phrase every command uses when ``db`` does not exist (``hint``: what creates one)."""
    if not db.exists():
        console.print(f"{db}: no such database file" + (f" ({hint})" if hint else ""),
                      style="red", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE)


def require_out_dir(out: Path, option: str = "--out") -> None:
    """Exit 2 when ``out``'s directory does not exist: a typo in a path is refused, not created."""
    if not out.parent.is_dir():
        console.print(f"{option} {out}: no such directory {out.parent}", style="red", markup=False,
                      highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_USAGE)


def open_store_read_only(db: Path) -> Any:
    """A read-only :class:`acceptscope.store.Store` (a read command never creates tables in a file),
    or exit 2 with one line when the file is not a readable acceptscope store."""
    import duckdb

    from acceptscope.store import Store

    try:
        return Store(db, read_only=True)
    except (duckdb.Error, ValueError, OSError) as e:
        raise unreadable_db(db, e) from None


def print_run_table(title: str, columns: tuple[str, ...] | list[str], rows: dict[str, list[str]]) -> None:
    """One row per run when the terminal is wide enough, else one block per run: whole run ids, never cut,
    at any terminal width (``rows``: run id -> one cell per column; empty cells are left out of a block)."""
    id_w = max(len(rid) for rid in rows) if rows else 0
    wide = id_w + sum(max(len(c), *(len(v[i]) for v in rows.values())) + 3 for i, c in enumerate(columns)) + 4
    if console.width >= wide:
        t = Table(title=title)
        t.add_column("run", no_wrap=True)
        for c in columns:
            t.add_column(c, overflow="fold")
        for rid, cells in rows.items():
            t.add_row(safe(rid), *(safe(c) for c in cells))
        console.print(t)
        return
    console.print(title, markup=False, highlight=False, soft_wrap=True)
    for rid, cells in rows.items():
        console.print(f"\n{plain(rid)}", style="bold", markup=False, highlight=False, soft_wrap=True)
        t = Table(show_header=False, box=None, padding=(0, 2))
        t.add_column("metric", no_wrap=True)
        t.add_column("value", overflow="fold")
        for c, v in zip(columns, cells):
            if v:
                t.add_row(safe(c), safe(v))
        console.print(t)
