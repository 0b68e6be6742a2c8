"""``acceptscope report``: write the self-contained HTML report of runs in a DuckDB file."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import List, Optional

import typer

from acceptscope.console import safe
from acceptscope.cli._common import (EXIT_NO_DATA, EXIT_OK, EXIT_USAGE, DbOption, JsonOption, console,
                                     emit_json, require_db, require_extra, require_out_dir, unreadable_db)

HELP = """Write ONE self-contained HTML report (plotly inlined; no server, no CDN).

The page opens with a written verdict (parity, calibration, utilization,
counterfactual-tail error, cost-model error), then the evidence: reliability
per position before/after STS, ECE table, survival vs empirical acceptance,
window distributions per workload, utilization against the ceiling,
tail estimates against cap-accept truth, and the cost-model fit.

Without --run/--audit-group it reports the newest audit group (or every run).

\b
Examples:
  acceptscope report --db audit.duckdb --out report.html
  acceptscope report --db audit.duckdb --audit-group G --out g.html --json
  acceptscope report --db runs.duckdb --run RUN_A --run RUN_B -o r.html
"""


def register(app: typer.Typer) -> None:
    @app.command("report", help=HELP)
    def report(
        db: Path = DbOption,
        out: Path = typer.Option(Path("report.html"), "--out", "-o", help="HTML file to write."),
        run: Optional[List[str]] = typer.Option(None, "--run", help="Run id to include (repeatable)."),
        audit_group: Optional[str] = typer.Option(None, "--audit-group", help="Report this audit group's runs."),
        role: Optional[List[str]] = typer.Option(None, "--role", metavar="ROLE",
                                                 help="Only runs playing this role (repeatable): production | "
                                                      "audit | calibration | curve."),
        ece_threshold: float = typer.Option(0.05, "--ece-threshold", help="Flag after-STS ECE above this."),
        util_threshold: float = typer.Option(0.80, "--util-threshold", help="Flag utilization below this."),
        no_estimators: bool = typer.Option(False, "--no-estimators", help="Raw-table views only (faster)."),
        json_out: bool = JsonOption,
    ) -> None:
        require_extra("report", "report")
        require_db(db)
        require_out_dir(out)
        # imported here, not at the top: plotly and jinja2 are the optional [app] extra
        import duckdb

        from acceptscope.report import Thresholds, write_report

        th = Thresholds(ece=ece_threshold, utilization=util_threshold)
        with console.status(f"rendering report of {safe(db)} ..."):
            try:
                res = write_report(db, out, run_ids=run or None, audit_group=audit_group, roles=role or None,
                                   thresholds=th, use_estimators=not no_estimators)
            except duckdb.Error as e:  # not DuckDB, or damaged: one line, exit 2
                raise unreadable_db(db, e) from None
            except KeyError as e:
                console.print(f"[red]{e.args[0]}[/red]")
                raise typer.Exit(EXIT_USAGE)
            except ValueError as e:
                console.print(f"[red]{safe(e)}[/red]")
                raise typer.Exit(EXIT_USAGE)
            except LookupError as e:
                console.print(f"[yellow]{e}[/yellow]")
                raise typer.Exit(EXIT_NO_DATA)
        for f in res.findings:
            color = {"ok": "green", "warn": "yellow", "bad": "red"}.get(f.level, "white")
            console.print(f"[{color}]{f.level:>4}[/{color}] {f.area}: {_plain(f.text)}")
        console.print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB, {res.figures} figures)")
        if json_out:
            emit_json(res.to_dict())
        raise typer.Exit(EXIT_OK)


def _plain(text: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", text))
