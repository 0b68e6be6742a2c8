"""``acceptscope ingest``: load saved SGLang DSpark artifacts into a DuckDB store."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from acceptscope.cli._common import EXIT_OK, EXIT_USAGE, DbOption, JsonOption, console, emit_json

EXIT_REJECTS = 2  # --strict: at least one record was rejected


def register(app: typer.Typer) -> None:
    @app.command(
        "ingest",
        help=(
            "Ingest SGLang 0.5.23 DSpark artifacts: /server_info dumps (JSON or JSONL of polls), "
            "block-accept estimator JSONL, STS shards (*.pt) and calibration JSON, SPS tables (1-D and "
            "additive), SPS profiler records/rounds/manifest, and saved /generate or OpenAI responses. "
            "Directories are recursed; each file's kind is sniffed. Invalid records go to the rejects "
            "table with file:line: field: reason; valid ones are always kept.\n\n"
            "Example:  acceptscope ingest fixtures/sglang --db runs.duckdb"
        ),
    )
    def ingest_cmd(
        paths: List[Path] = typer.Argument(..., help="Files or directories to ingest."),
        db: Path = DbOption,
        run_id: Optional[str] = typer.Option(
            None, "--run-id", help="Run id for every artifact (default: the server that wrote them, from its "
                                   "/server_info launch fields; artifacts without one join that server's run)."),
        temperature: Optional[float] = typer.Option(
            None, "--temperature", min=0.0,
            help="Sampling temperature of all traffic in these dumps (SGLang's dumps carry none; 0 = greedy, "
                 "whose trimmed blocks then resolve exactly). Per-request temperatures in request records win."),
        strict: bool = typer.Option(False, "--strict", help="Exit with code 2 if any record was rejected."),
        show_rejects: int = typer.Option(10, "--show-rejects", help="Print up to N reject messages."),
        json_out: bool = JsonOption,
    ) -> None:
        from acceptscope.ingest import ingest_paths, tune_allocator_for_bulk_ingest
        from acceptscope.store import Store

        missing = [str(p) for p in paths if not p.exists()]
        if missing:
            console.print(f"[red]no such file or directory:[/] {', '.join(missing)}")
            raise typer.Exit(EXIT_USAGE)
        if run_id is not None:
            from acceptscope.ingest.identity import check_run_id

            try:
                check_run_id(run_id)
            except ValueError as e:  # (before the database file is created)
                console.print(f"--run-id: {e}", style="red", markup=False, highlight=False, soft_wrap=True)
                raise typer.Exit(EXIT_USAGE)
        tune_allocator_for_bulk_ingest()  # this process ingests, then exits (see the function's docstring)
        store = Store(db)
        summary = ingest_paths(paths, store, run_id=run_id, temperature=temperature, progress=not json_out)
        summary["db"] = str(db)
        if json_out:
            emit_json(summary)
        else:
            t = Table(title=f"ingest -> {db}  ({len(summary['files'])} files, {summary['seconds']} s)")
            t.add_column("table")
            t.add_column("rows written", justify="right")
            t.add_column("duplicates ignored", justify="right")
            for name, row in summary["tables"].items():
                if name == "rejects":
                    continue
                t.add_row(name, str(row["written"]), str(row["duplicates_ignored"]))
            rej = summary["rejects"]
            t.add_row("[red]rejects[/]" if rej["count"] else "rejects", str(rej["count"]), "")
            console.print(t)
            if rej["count"]:
                console.print("[bold]top reject reasons:[/]")
                for reason, n in rej["top_reasons"]:  # (reasons quote input: never markup)
                    console.print(f"  {n:>6}  {reason}", markup=False, highlight=False)
                if rej.get("not_stored"):
                    console.print(f"  ({rej['not_stored']} rejects past the per-file cap are counted, not stored)")
                for msg in rej["messages"][:show_rejects]:
                    console.print("  " + msg, markup=False, highlight=False, soft_wrap=True)
            if summary["runs"]:
                console.print("runs: " + ", ".join(summary["runs"]), markup=False, highlight=False, soft_wrap=True)
            for note in summary["notes"]:
                console.print("  " + note, markup=False, highlight=False, soft_wrap=True)
            if summary["skipped"]:
                console.print(f"skipped {len(summary['skipped'])} non-artifact files")
            if summary["empty"]:
                console.print(f"{len(summary['empty'])} empty files (nothing to ingest): "
                              + ", ".join(Path(p).name for p in summary["empty"]), markup=False, highlight=False,
                              soft_wrap=True)
        if strict and summary["rejects"]["count"]:
            raise typer.Exit(EXIT_REJECTS)
        raise typer.Exit(EXIT_OK)
