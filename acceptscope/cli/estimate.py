"""``acceptscope estimate``: counterfactual tail, utilization, calibration, cost and planner audit of a run."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.progress import Progress

from acceptscope import glossary
from acceptscope.console import safe
from acceptscope.cli._common import (
    require_db,
    EXIT_NO_DATA,
    EXIT_USAGE,
    DbOption,
    JsonOption,
    console,
    emit_json,
    open_store_read_only,
    print_run_table,
    unreadable_db,
    require_extra,
)

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
  acceptscope estimate --lake LAKE --engine spark --master 'local[2]' --json

With --lake LAKE --engine spark (needs the [spark] extra) the same estimators run over a
Parquet lake written by `acceptscope export` (estimators/spark.py: the tail walk, per-block
predictions and their per-request sums on the executors) and print the same JSON as --db on
the same runs.
"""


def register(app: typer.Typer) -> None:
    @app.command("estimate", help=HELP)
    def estimate(
        db: Path = DbOption,
        run: Optional[str] = typer.Option(None, "--run", help="Run id (default: every run in the database)."),
        hazards_from: Optional[str] = typer.Option(
            None, "--hazards-from",
            help="Take the tail hazards of --run from this truth-bearing run (a cap-accept audit arm). Refused "
                 "unless the two are compatible (gamma, STS table in force, training data at every sampling "
                 "temperature of --run). Default: the run's "
                 "own observed outcomes, or the cap-accept arm of its own audit."),
        role: Optional[List[str]] = typer.Option(None, "--role", metavar="ROLE",
                                                 help="Only runs playing this role (repeatable): production | "
                                                      "audit | calibration | curve."),
        n_boot: int = typer.Option(200, "--n-boot", min=10, help="Bootstrap replicates for intervals."),
        seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap and the splits."),
        json_out: bool = JsonOption,
        lake: Optional[Path] = typer.Option(None, "--lake", help="Parquet lake written by `acceptscope export` (with --engine spark)."),
        engine: str = typer.Option("local", "--engine", help="local (the --db file, in process) or spark (--lake)."),
        master: str = typer.Option("local[2]", "--master", help="Spark master URL (--engine spark)."),
    ) -> None:
        if engine not in ("local", "spark") or (engine == "spark") != (lake is not None):
            console.print("[red]--engine must be local (with --db) or spark (with --lake LAKE)[/red]")
            raise typer.Exit(EXIT_USAGE)
        if lake is not None:
            out = _with_figures(_estimate_lake(lake, run, master, n_boot, seed))
            if json_out:
                emit_json(out)
            else:
                console.print_json(data=out)
            return
        require_db(db)
        import duckdb

        from acceptscope.estimators import run_all, run_all_runs, to_jsonable
        from acceptscope.estimators.audit_size import advice_sentences
        from acceptscope.schema import ROLES

        if hazards_from is not None and run is None:
            console.print("[red]--hazards-from needs --run (the run whose tail it stands in for)[/red]")
            raise typer.Exit(EXIT_USAGE)
        store = open_store_read_only(db)
        try:
            runs = store.runs()
        except duckdb.Error as e:
            raise unreadable_db(db, e) from None
        if hazards_from is not None and hazards_from not in set(runs.run_id):
            console.print(f"[red]{safe(db)}: no run {safe(repr(hazards_from))} for --hazards-from[/red]")
            raise typer.Exit(EXIT_USAGE)
        if role and set(role) - set(ROLES):
            console.print(f"--role must be one of {', '.join(ROLES)}, got {', '.join(sorted(set(role) - set(ROLES)))}",
                          style="red", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_USAGE)
        ids = [run] if run else runs[runs.role.isin(role)].run_id.tolist() if role else runs.run_id.tolist()
        if run and run not in set(runs.run_id):
            console.print(f"[red]{safe(db)}: no run {safe(repr(run))} (runs: {safe(', '.join(runs.run_id) or 'none')})[/red]")
            raise typer.Exit(EXIT_NO_DATA)
        if not ids:
            console.print(f"[yellow]{safe(db)}: no runs[/yellow]")
            raise typer.Exit(EXIT_NO_DATA)
        incomplete = set(store.incomplete_runs(ids))
        for rid in ids:
            if rid in incomplete:
                console.print(f"warning: run {rid} is incomplete (no completion mark: still being written, or its "
                              "command was killed); the estimates cover only the rows written so far",
                              style="yellow", markup=False, highlight=False)
        out = {}
        with Progress(console=console, transient=True) as prog:
            task = prog.add_task("estimating", total=len(ids))
            # a run of more than estimators.STREAM_ROWS request-steps is streamed in bounded memory (estimators.stream)
            if hazards_from is None and len(ids) > 1:  # many runs: one ordered scan for all (estimators.run_all_runs)
                try:
                    many = run_all_runs(store, ids, n_boot=n_boot, seed=seed, progress=lambda rid: prog.advance(task))
                except duckdb.Error as e:  # a file damaged past its header
                    raise unreadable_db(db, e) from None
                for rid in ids:
                    r = many[rid]
                    out[rid] = {"error": str(r)} if isinstance(r, (ValueError, KeyError)) else to_jsonable(r)
                    out[rid]["complete"] = rid not in incomplete
                ids = []
            for rid in ids:
                prog.update(task, description=f"estimating {safe(rid)}")
                try:
                    out[rid] = to_jsonable(run_all(store, rid, n_boot=n_boot, seed=seed, hazards_from=hazards_from))
                except (ValueError, KeyError) as e:
                    if hazards_from is not None and "--hazards-from" in str(e):
                        console.print(str(e), style="red", markup=False, highlight=False, soft_wrap=True)
                        raise typer.Exit(EXIT_USAGE)
                    out[rid] = {"error": str(e)}
                except duckdb.Error as e:  # a file damaged past its header
                    raise unreadable_db(db, e) from None
                out[rid]["complete"] = rid not in incomplete
                prog.advance(task)
        out = _with_figures(out)
        if json_out:
            emit_json(out)
            return
        _print_table(out, f"acceptscope estimate: {db}")
        for rid, r in out.items():
            if "error" not in r:
                console.print(f"{rid}: {r['tail']['summary']['statement']}", markup=False, highlight=False,
                              soft_wrap=True)
                lines = [f"interval health: {r['interval_health']['verdict']}"] if "interval_health" in r else []
                lines += [f"audit size: {x}" for x in advice_sentences(r["tail"]["summary"].get("audit_advice"))]
                for line in lines:  # run ids and workload names are data: printed without markup
                    console.print(f"{rid}: {line}", markup=False, highlight=False, soft_wrap=True)


def _estimate_lake(lake: Path, run: Optional[str], master: str, n_boot: int, seed: int) -> dict:
    if not lake.is_dir():
        console.print(f"[red]{safe(lake)}: no such lake directory[/red]")
        raise typer.Exit(EXIT_USAGE)
    require_extra("estimate --lake", "spark")
    from acceptscope.estimators.spark import estimate_lake  # here, not at the top: pyspark is the optional [spark] extra
    try:
        out = estimate_lake(lake, [run] if run else None, master=master, n_boot=n_boot, seed=seed)
    except (FileNotFoundError, KeyError) as e:
        console.print(f"[red]{safe(lake)}: {safe(e)}[/red]")
        raise typer.Exit(EXIT_NO_DATA if isinstance(e, KeyError) else EXIT_USAGE)
    if not out:
        console.print(f"[yellow]{safe(lake)}: no runs[/yellow]")
        raise typer.Exit(EXIT_NO_DATA)
    return out


def _with_figures(out: dict) -> dict:
    """Each run's results with its glossary figures (``figures``: key -> estimate, lo, hi, label, unit,
    interval), the numbers every other surface shows."""
    for r in out.values():
        if isinstance(r, dict) and "error" not in r:
            r["figures"] = glossary.to_json(glossary.run_figures(r))
    return out


_L = glossary.FIGURES
_COLUMNS = ("arm", "request-steps", "censored", "ceiling is", _L["realized_accept_length"].label,
            _L["ceiling_drafts"].label, _L["utilization"].label, _L["window"].label,
            _L["trimmed"].label, "in-window acc", "spec_accept_rate", "trim regret", "cost held-out MAE ms")


def _row(r: dict) -> list[str]:
    """The table cells of one run's estimates (``_COLUMNS`` order; the figures: :mod:`acceptscope.glossary`)."""
    if "error" in r:
        return ["", r["error"], *[""] * (len(_COLUMNS) - 2)]
    s = r["tail"]["summary"]
    f = glossary.run_figures(r)
    u = [x for x in r["utilization"]["by_group"] if x["by"] == "run"][0]
    c = (r.get("cost") or {}).get("held_out", {}).get("mae_ms")
    return [r["run"]["arm"], str(s["n_request_steps"]), str(s["n_censored"]), s["ceiling"],
            *(glossary.show(k, f[k]) for k in ("realized_accept_length", "ceiling_drafts", "utilization", "window",
                                                "trimmed")),
            f"{u['in_window_accept_rate']:.3f}", f"{u['spec_accept_rate']:.3f}",
            f"{r['bracket']['trim']['trim_regret_rate']:.3f}", "-" if c is None else f"{c:.3f}"]


def _print_table(out: dict, title: str) -> None:
    print_run_table(title, _COLUMNS, {rid: _row(r) for rid, r in out.items()})
