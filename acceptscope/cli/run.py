"""``acceptscope run``: serve a prompt mix with the embedded reference DSpark engine, streaming telemetry."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from acceptscope import glossary
from acceptscope.console import safe
from acceptscope.cli._common import EXIT_USAGE, JsonOption, check_names, console, emit_json, require_extra

ENGINE_HELP = "Serving engine: 'reference' (embedded PyTorch DSpark engine). Use `acceptscope live`/`ingest` for SGLang."


def register(app: typer.Typer) -> None:
    @app.command(
        "run",
        help=(
            "Serve a prompt mix with the reference DSpark engine and stream telemetry into DuckDB.\n\n"
            "Example:  acceptscope run --engine reference --arm cap-accept --workload mixed --db runs.duckdb"
        ),
    )
    def run_cmd(
        engine: str = typer.Option("reference", "--engine", help=ENGINE_HELP),
        arm: str = typer.Option("cap-accept", "--arm", help="Verify mode: compact | cap-accept | static."),
        workload: str = typer.Option(
            "mixed", "--workload",
            help="Comma list of math, code, chat, poetry, 'mixed' (= the four), shared prompt sets (gsm8k, ...) or {\"turns\":[...]} JSONL paths.",
        ),
        db: Path = typer.Option(Path("acceptscope.duckdb"), "--db", help="DuckDB telemetry file."),
        requests: int = typer.Option(240, "--requests", min=1, help="Number of requests."),
        max_new_tokens: int = typer.Option(64, "--max-new-tokens", min=1, help="Generated tokens per request (cap)."),
        max_prompt_tokens: int = typer.Option(192, "--max-prompt-tokens", min=1, help="Keep the last N prompt tokens."),
        temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="Sampling temperature (0 = greedy)."),
        seed: int = typer.Option(0, "--seed", help="Run seed (per-request generators derive from it)."),
        gamma: Optional[int] = typer.Option(None, "--gamma", min=1, help="Draft block size (<= the drafter's)."),
        batch: int = typer.Option(32, "--batch", "--max-running-requests", min=1, help="Max running requests."),
        sts: Optional[Path] = typer.Option(None, "--sts", help="SGLang STS calibration JSON."),
        sps: str = typer.Option("default", "--sps", help="SGLang SPS table JSON (either format); 'default' = shipped "
                                "reference table, 'none' = no table (verify-all)."),
        cost_profile: Optional[str] = typer.Option(None, "--cost-profile", help="Serve on a GPU cost profile (a "
                                                   "shipped name such as h200-qwen3-8b, or an SPS table path): the "
                                                   "planner uses it instead of --sps and steps are timed on its "
                                                   "virtual clock."),
        prompt_offset: int = typer.Option(0, "--prompt-offset", min=0, help="Skip the first N prompts of every "
                                          "workload (a split disjoint from another run's prompts)."),
        lag_steps: int = typer.Option(2, "--lag-steps", min=1, help="Confidence lag for the budget (decode steps)."),
        no_per_position: bool = typer.Option(False, "--no-per-position", help="Do not record per-position lists."),
        target: str = typer.Option("fixtures/models/target", "--target", help="Target model directory."),
        drafter: str = typer.Option("fixtures/models/drafter", "--drafter", help="Drafter model directory."),
        run_id: Optional[str] = typer.Option(None, "--run-id", help="Run id (default: generated)."),
        audit_group: Optional[str] = typer.Option(None, "--audit-group", help="Audit group id shared by arms."),
        threads: Optional[int] = typer.Option(None, "--threads", min=1, help="torch intra-op threads (default 1: tiny models on shared cores lose to oversubscription)."),
        json_out: bool = JsonOption,
    ) -> None:
        if engine != "reference":
            console.print(f"[red]--engine {engine!r}: only 'reference' runs in-process; "
                          "use `acceptscope live` or `acceptscope ingest` for SGLang[/red]")
            raise typer.Exit(EXIT_USAGE)
        check_names(arm=arm, workload=workload, cost_profile=cost_profile)  # before any model loads
        require_extra("run", "engine")
        # imported here, not at the top: torch is the optional [engine] extra (and ~2 s to import)
        from acceptscope.engine import EngineConfig, run_engine

        cfg = EngineConfig(
            arm=arm, target=target, drafter=drafter, workload=workload, num_requests=requests,
            max_new_tokens=max_new_tokens, max_prompt_tokens=max_prompt_tokens, temperature=temperature, seed=seed,
            gamma=gamma, max_running_requests=batch, sts=str(sts) if sts else None, sps=sps, lag_steps=lag_steps,
            per_position=not no_per_position, db=str(db), run_id=run_id, audit_group=audit_group, threads=threads,
            cost_profile=cost_profile, prompt_offset=prompt_offset,
        )
        with Progress(
            TextColumn(f"[bold]{arm}[/bold]"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
            TextColumn("{task.fields[tok]} tok"), TimeElapsedColumn(), console=console, transient=False,
        ) as prog:
            task = prog.add_task("run", total=requests, tok=0)
            tokens = [0]

            def on_progress(n_done: int, n_tok: int) -> None:
                tokens[0] += n_tok
                prog.update(task, advance=n_done, tok=tokens[0])

            try:
                summary = run_engine(cfg, progress=on_progress)
            except (FileNotFoundError, ValueError) as e:
                console.print(f"[red]{safe(e)}[/red]")
                raise typer.Exit(EXIT_USAGE)
        if json_out:
            emit_json(summary.to_dict())
            return
        t = Table(title=f"run {safe(summary.run_id)} ({summary.arm}, gamma {summary.gamma})")
        t.add_column("workload")
        t.add_column("requests", justify="right")
        t.add_column("tokens", justify="right")
        t.add_column(glossary.FIGURES["accept_length_per_step"].label, justify="right")  # not the per-block figure
        for w, d in sorted(summary.by_workload.items()):
            al = d["accept_length"]
            t.add_row(w, str(d["requests"]), str(d["tokens"]), f"{al:.2f}" if al else "-")
        t.add_row("[bold]all[/bold]", str(summary.requests), str(summary.completion_tokens),
                  f"{summary.mean_accept_length:.2f}")
        console.print(t)
        if summary.modeled_s is not None:
            console.print(f"virtual clock ({cost_profile}): {summary.modeled_s:.3f} s of decode steps, "
                          f"{summary.modeled_tokens_per_s:.0f} tok/s")
        console.print(
            f"wall {summary.wall_s:.1f}s  {summary.tokens_per_s:.1f} tok/s  decode steps {summary.decode_steps}  "
            f"mean window {summary.mean_window:.2f}  verify tokens scheduled {summary.scheduled_verify_tokens} / "
            f"executed {summary.executed_verify_tokens}  db {summary.db}"
        )
