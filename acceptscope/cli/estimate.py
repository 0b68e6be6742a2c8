"""``acceptscope estimate``: counterfactual tail, utilization, calibration, cost and planner audit of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from acceptscope.cli._common import EXIT_NO_DATA, EXIT_USAGE, DbOption, JsonOption, console, emit_json

HELP = """Run the estimators on one run (or every run) of a telemetry database.

For each run: the uncapped ceiling of trimmed blocks (exact for greedy walks,
Rao-Blackwellised for sampled requests with log-probs, confidence-conditioned
hazards otherwise) with per-block and aggregate intervals; SGLang's [lo, hi]
bracket and TensorRT-LLM's trim counters; utilization against the ceiling;
STS calibration metrics; the additive SPS cost fit; the planner audit.

Exit codes: 0 ok; 2 bad arguments or unreadable database; 3 no such run / no data.

\b
Examples:
  acceptscope estimate --db audit.duckdb
  acceptscope estimate --db audit.duckdb --run ref-compact-1 --json > est.json
"""


def register(app: typer.Typer) -> None:
    @app.command("estimate", help=HELP)
    def estimate(
        db: Path = DbOption,
        run: Optional[str] = typer.Option(None, "--run", help="Run id (default: every run in the database)."),
        n_boot: int = typer.Option(200, "--n-boot", min=10, help="Bootstrap replicates for intervals."),
        seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap and the splits."),
        json_out: bool = JsonOption,
    ) -> None:
        from rich.progress import Progress
        from rich.table import Table

        if not db.exists():
            console.print(f"[red]{db}: no such database file[/red]")
            raise typer.Exit(EXIT_USAGE)
        from acceptscope.store import Store
        from estimators import to_jsonable
        from estimators.stream import run_all_stream

        store = Store(db)
        runs = store.runs()
        ids = [run] if run else runs.run_id.tolist()
        if run and run not in set(runs.run_id):
            console.print(f"[red]{db}: no run {run!r} (runs: {', '.join(runs.run_id) or 'none'})[/red]")
            raise typer.Exit(EXIT_NO_DATA)
        if not ids:
            console.print(f"[yellow]{db}: no runs[/yellow]")
            raise typer.Exit(EXIT_NO_DATA)
        out = {}
        with Progress(console=console, transient=True) as prog:
            task = prog.add_task("estimating", total=len(ids))
            # every run in one ordered pass over the store, in bounded memory (estimators.stream)
            res = run_all_stream(store, ids, n_boot=n_boot, seed=seed, progress=lambda _rid: prog.advance(task))
            for rid in ids:
                r = res[rid]
                out[rid] = {"error": str(r)} if isinstance(r, Exception) else to_jsonable(r)
        if json_out:
            emit_json(out)
            return
        t = Table(title=f"acceptscope estimate: {db}")
        for c in ("run", "request-steps", "censored", "mean ceiling [95%]", "utilization [95%]",
                  "in-window acc", "spec_accept_rate", "trim regret", "cost held-out MAE ms"):
            t.add_column(c)
        for rid, r in out.items():
            if "error" in r:
                t.add_row(rid, r["error"], *[""] * 7)
                continue
            s = r["tail"]["summary"]
            a = r["tail"]["aggregate"][0]
            u = [x for x in r["utilization"]["by_group"] if x["by"] == "run"][0]
            c = r.get("cost", {}).get("held_out", {}).get("mae_ms")
            t.add_row(rid, str(s["n_request_steps"]), str(s["n_censored"]),
                      f"{a['mean_ceiling']:.3f} [{a['lo']:.3f}, {a['hi']:.3f}]",
                      f"{u['utilization']:.3f} [{u.get('util_lo', u['utilization']):.3f}, {u.get('util_hi', u['utilization']):.3f}]",
                      f"{u['in_window_accept_rate']:.3f}", f"{u['spec_accept_rate']:.3f}",
                      f"{r['bracket']['trim']['trim_regret_rate']:.3f}", "-" if c is None else f"{c:.3f}")
        console.print(t)
