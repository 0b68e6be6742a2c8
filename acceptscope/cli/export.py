"""``acceptscope export``: hive-partitioned Parquet of one or more runs (or all)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn

from acceptscope.console import safe
from acceptscope.cli._common import EXIT_NO_DATA, EXIT_USAGE, DbOption, JsonOption, console, emit_json, require_db


def register(app: typer.Typer) -> None:
    @app.command(
        "export",
        help=(
            "Export runs to hive-partitioned Parquet: OUT/<table>/run_id=<id>/part-*.parquet "
            "(steps and request_steps add a rank=<r> level), readable by DuckDB, pandas/pyarrow and Spark.\n\n"
            "Example:  acceptscope export run-7 --parquet out/ --db audit.duckdb\n\n"
            "          acceptscope export --all --parquet out/ --db audit.duckdb --json"
        ),
    )
    def export(
        runs: Optional[List[str]] = typer.Argument(None, help="Run ids to export."),
        parquet: Path = typer.Option(..., "--parquet", help="Output directory (created if missing)."),
        all_runs: bool = typer.Option(False, "--all", help="Export every run (and rows without a run)."),
        table: Optional[List[str]] = typer.Option(None, "--table", help="Only these tables (repeatable)."),
        db: Path = DbOption,
        json_out: bool = JsonOption,
    ) -> None:
        from acceptscope.export import export_parquet, exportable_tables
        from acceptscope.store import Store

        if bool(runs) == all_runs:
            console.print("[red]give run ids or --all (not both)[/red]")
            raise typer.Exit(EXIT_USAGE)
        require_db(db)
        try:
            store = Store(db, read_only=True)
        except ValueError as e:
            console.print(f"[red]{safe(e)}[/red]")
            raise typer.Exit(EXIT_USAGE)
        n_tables = len(table) if table else len(exportable_tables())
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      console=console, transient=True) as prog:
            task = prog.add_task("exporting", total=n_tables)
            seen: set[str] = set()

            def progress(name: str, rows: int) -> None:
                prog.update(task, description=f"{safe(name)}: {rows} rows")
                if name not in seen:
                    seen.add(name)
                    prog.advance(task)

            try:
                summary = export_parquet(store, None if all_runs else runs, parquet, tables=table, progress=progress)
            except KeyError as e:
                console.print(f"[red]{safe(e.args[0])}[/red]")
                raise typer.Exit(EXIT_NO_DATA if "not in" in str(e) else EXIT_USAGE)
        total = sum(summary["tables"].values())
        if json_out:
            emit_json(summary)
        else:
            for name, rows in summary["tables"].items():
                if rows:
                    console.print(f"{name:24s} {rows:>10d} rows")
            console.print(f"wrote {total} rows of {len(summary['runs'])} run(s) to {parquet}")
        if total == 0:
            raise typer.Exit(EXIT_NO_DATA)
