"""``acceptscope audit``: production arm + audit arm, parity, estimators, HTML report."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from acceptscope import glossary
from acceptscope.console import plain, safe
from acceptscope.cli._common import (EXIT_FAILURE, EXIT_USAGE, DbOption, JsonOption, check_names, console, emit_json,
                                     print_run_table, require_extra, require_out_dir)

HELP = """Audit a DSpark deployment end to end.

Runs the production arm (compact) and the audit arm (cap-accept) on the same
workload and seeds, checks that both committed identical tokens (parity),
infers utilization against the ceiling, runs the estimators and writes one
self-contained HTML report.

Exit codes: 0 parity holds; 1 parity broken (per-request findings in the
report and in --json); 2 bad arguments; 3 nothing to audit.

By default the audit serves in the regime DSpark exists for: SGLang's planner
on the H200 Qwen3-8B cost profile (fixtures/profiles) at batch 64, each step
timed on that profile's virtual clock, STS fitted on a cap-accept calibration
split of disjoint prompts and served in both arms; it then runs compact and
static over batch 1..256 on the high- and low-accept workloads (the
throughput curve in the report). --cost-profile none / --sts none /
--curve-batches '' turn those off.

\b
Examples:
  # the main job (a few minutes on 2 CPU cores):
  acceptscope audit --engine reference --workload math,chat,poetry \\
      --db audit.duckdb --out report.html
\b
  # audit 5% of the traffic; ceiling and utilization are inferred with
  # bootstrap intervals (regression on compact's confidence-implied tail):
  acceptscope audit --audit-fraction 0.05 --requests 400 --db audit.duckdb
\b
  # add the static (verify-all) arm; JSON summary on stdout:
  acceptscope audit -w math,chat --with-static --db a.duckdb --json
\b
  # a real SGLang deployment (GPUs, the sglang extra):
  acceptscope audit --engine sglang --workload mixed --db audit.duckdb
"""


def register(app: typer.Typer) -> None:
    @app.command("audit", help=HELP)
    def audit(
        engine: str = typer.Option("reference", "--engine", help="reference | sglang"),
        workload: str = typer.Option("mixed", "--workload", "-w",
                                     help="Workload spec: mixed, math,code,chat,poetry, or a {turns} .jsonl path."),
        db: Path = DbOption,
        out: Optional[Path] = typer.Option(Path("report.html"), "--out", "-o", help="HTML report to write."),
        no_report: bool = typer.Option(False, "--no-report", help="Skip the HTML report."),
        with_static: bool = typer.Option(False, "--with-static", help="Also run the static (verify-all) arm."),
        audit_fraction: float = typer.Option(1.0, "--audit-fraction", min=0.0, max=1.0,
                                             help="Fraction of requests replayed in the audit arm (seeded sample)."),
        sample_seed: int = typer.Option(0, "--sample-seed", help="Seed of the audit sample and the bootstrap."),
        audit_group: Optional[str] = typer.Option(None, "--audit-group", help="Audit group id (default: new)."),
        requests: Optional[int] = typer.Option(None, "--requests", "-n", min=1,
                                               help="Requests in the production arm (engine default 240)."),
        max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", min=1,
                                                     help="Generated tokens per request (cap)."),
        max_prompt_tokens: Optional[int] = typer.Option(None, "--max-prompt-tokens", min=1,
                                                        help="Keep the last N prompt tokens."),
        temperature: Optional[float] = typer.Option(None, "--temperature", help="Sampling temperature (0 = greedy)."),
        seed: Optional[int] = typer.Option(None, "--seed", help="Sampling seed (same in every arm)."),
        gamma: Optional[int] = typer.Option(None, "--gamma", help="Draft block size (default: the drafter's)."),
        batch: Optional[int] = typer.Option(None, "--batch", "--max-running-requests", min=1,
                                            help="Max running requests (default 64)."),
        lag_steps: Optional[int] = typer.Option(None, "--lag-steps", min=1, help="Confidence lag (decode steps)."),
        sts: Optional[str] = typer.Option(None, "--sts", help="STS: 'calibrate' (default: fit on a disjoint "
                                          "cap-accept calibration split, serve both arms with it), 'none', or a JSON path."),
        sps: Optional[str] = typer.Option(None, "--sps", help="SPS cost table JSON ('default', 'none' or a path) on the "
                                          "wall clock; use --cost-profile for the virtual clock."),
        cost_profile: Optional[str] = typer.Option(None, "--cost-profile", help="GPU cost profile the planner uses "
                                                   "and the virtual clock times steps with (default h200-qwen3-8b; "
                                                   "a shipped name, an SPS table path, or 'none' for the wall clock)."),
        calibration_requests: int = typer.Option(0, "--calibration-requests", min=0,
                                                 help="Requests of the STS calibration split (0: half the audit's, "
                                                      "at least 16)."),
        curve_batches: str = typer.Option("1,4,16,64,256", "--curve-batches",
                                          help="Batch sizes of the compact-vs-static throughput curve ('' skips it)."),
        target: Optional[str] = typer.Option(None, "--target", help="Target model directory."),
        drafter: Optional[str] = typer.Option(None, "--drafter", help="Drafter model directory."),
        threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads."),
        urls: Optional[str] = typer.Option(None, "--urls", help="--engine sglang: attach to running servers, "
                                           "e.g. compact=http://127.0.0.1:30000,cap-accept=http://127.0.0.1:30001 "
                                           "(default $ACCEPTSCOPE_SGLANG_URLS; else launch from --target/--drafter)."),
        no_estimators: bool = typer.Option(False, "--no-estimators", help="Report raw-table views only."),
        json_out: bool = JsonOption,
    ) -> None:
        if engine not in ("reference", "sglang"):
            console.print(f"[red]--engine must be reference or sglang, got {engine!r}[/red]")
            raise typer.Exit(EXIT_USAGE)
        check_names(workload=workload, cost_profile=cost_profile if engine == "reference" else None)
        if not no_report:
            require_out_dir(out)  # before minutes of serving, not after
        require_out_dir(db, "--db")
        require_extra("audit", "engine" if engine == "reference" else "live")
        require_extra("audit", "report")
        # imported here, not at the top: the audit pulls torch (the optional [engine] extra)
        from acceptscope.audit import AuditConfig, run_audit

        if not 0 < audit_fraction <= 1:
            console.print(f"[red]--audit-fraction must be in (0, 1], got {audit_fraction}[/red]")
            raise typer.Exit(EXIT_USAGE)
        opts = {k: v for k, v in dict(
            num_requests=requests, max_new_tokens=max_new_tokens, max_prompt_tokens=max_prompt_tokens,
            temperature=temperature, seed=seed, gamma=gamma, max_running_requests=batch, lag_steps=lag_steps,
            sts=sts, sps=sps, cost_profile=cost_profile, target=target, drafter=drafter,
            threads=threads).items() if v is not None}
        try:
            curve = tuple(int(x) for x in curve_batches.split(",") if x.strip())
        except ValueError:
            console.print(f"[red]--curve-batches {curve_batches!r}: expected comma-separated integers[/red]")
            raise typer.Exit(EXIT_USAGE)
        if urls is not None:
            if engine != "sglang":
                console.print("[red]--urls only applies to --engine sglang[/red]")
                raise typer.Exit(EXIT_USAGE)
            opts["urls"] = urls
        cfg = AuditConfig(db=str(db), engine=engine, workload=workload, out=None if no_report else str(out),
                          with_static=with_static, audit_fraction=audit_fraction, sample_seed=sample_seed,
                          audit_group=audit_group, estimators=not no_estimators, engine_options=opts,
                          calibration_requests=calibration_requests, curve_batches=curve)
        with Progress(TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=False) as bar:
            tasks: dict = {}

            def progress(arm: str, n_done: int, total: int | None) -> None:
                if arm not in tasks:
                    tasks[arm] = bar.add_task(arm, total=total)
                bar.update(tasks[arm], advance=n_done, total=total)

            try:
                res = run_audit(cfg, progress=progress, stage=_stage)
            except (ValueError, FileNotFoundError) as e:
                console.print(f"[red]{safe(e)}[/red]")
                raise typer.Exit(EXIT_USAGE)
            except RuntimeError as e:
                console.print(f"[red]{safe(e)}[/red]")
                raise typer.Exit(EXIT_FAILURE)
        _print(res)
        if json_out:
            emit_json(res.to_dict())
        raise typer.Exit(res.exit_code)


def _stage(text: str) -> None:
    """One stage line, ``HH:MM:SS text``: whole at any width (rich's log column would wrap it beside a path)."""
    console.print(f"{time.strftime('%H:%M:%S')} {plain(text)}", markup=False, highlight=False, soft_wrap=True)


def _print(res) -> None:
    def num(r: dict, k: str, fmt: str) -> str:
        v = r.get(k)
        return format(v, fmt) if isinstance(v, (int, float)) else "–"

    from acceptscope.store import Store  # (the audit has run: acceptscope.audit imported it already)

    reader = Store(res.db, read_only=True)
    figs = (res.report.headline.get("figures") or {}) if res.report is not None else {}
    L = glossary.FIGURES

    def fig(rid: str, key: str) -> str:
        v = (figs.get(rid) or {}).get(key) or {}
        return glossary.fmt(key, v.get("estimate"))

    print_run_table(f"audit {res.audit_group}",
                    ("arm", "requests", L["accept_length_per_step"].label, L["realized_accept_length"].label,
                     L["window"].label, "tok/s (CPU)", "tok/s (modeled)", "wall s"),
                    {str(r.get("run_id")): [arm, str(r.get("requests", "–")),
                                            glossary.fmt("accept_length_per_step", glossary.accept_length_per_step(
                                                reader, str(r.get("run_id"))).estimate),
                                            fig(str(r.get("run_id")), "realized_accept_length"),
                                            fig(str(r.get("run_id")), "window"), num(r, "tokens_per_s", ".0f"),
                                            num(r, "modeled_tokens_per_s", ".0f"), num(r, "wall_s", ".1f")]
                     for arm, r in res.runs.items()})
    prod = str(res.runs.get("compact", {}).get("run_id"))
    vals = {k: glossary.Value(v["estimate"], v["lo"], v["hi"]) for k, v in (figs.get(prod) or {}).items()}
    vals.update(glossary.audited_figures(res.sampling))  # (the sample the report was given)
    for key in ("ceiling_drafts", "ceiling_tokens", "utilization", "trimmed", "audited_ceiling_tokens",
                "audited_utilization"):
        v = vals.get(key)
        if v is not None and v.estimate is not None:
            iv = glossary.FIGURES[key].interval
            console.print(f"compact {L[key].label}: {glossary.show(key, v)}"
                          + (f" ({glossary.INTERVALS[iv].label})" if iv and v.lo is not None else ""),
                          markup=False, highlight=False, soft_wrap=True)
    cal = res.calibration
    if cal:
        console.print(f"STS fitted on {cal['samples']} calibration blocks ({cal['run_id']}): {cal['path']}")
        if cal.get("prompts_shared_with_audit"):
            console.print(f"[yellow]{cal['prompts_shared_with_audit']} calibration prompts also occur in the audit "
                          "(a short prompt file is cycled): the calibration split is not fully disjoint[/yellow]")
    if res.curve:
        pts = {(p["workload"], p["batch"], p["arm"]): p["modeled_tokens_per_s"] for p in res.curve}
        for wl in dict.fromkeys(p["workload"] for p in res.curve):
            ratios = [f"b{b}: {pts[(wl, b, 'compact')] / pts[(wl, b, 'static')]:.2f}"
                      for b in dict.fromkeys(p["batch"] for p in res.curve)
                      if pts.get((wl, b, "compact")) and pts.get((wl, b, "static"))]
            console.print(f"compact/static modeled throughput, {wl}: " + ", ".join(ratios))
    p = res.parity
    if p.ok:
        console.print(f"[green]parity holds[/green]: {p.pairs} request pairs committed identical tokens")
    else:
        console.print(f"[red]parity broken[/red]: {len(p.findings)} of {p.pairs} requests diverge {p.counts()}")
        for f in p.findings[:10]:
            console.print(f"  - {f.describe()}")
    s = res.sampling
    if s is not None:
        console.print(f"{s.n_audited}/{s.n_requests} requests audited", markup=False, highlight=False)
    if res.report is not None:
        for f in res.report.findings:
            color = {"ok": "green", "warn": "yellow", "bad": "red"}.get(f.level, "white")
            console.print(f"[{color}]{f.level:>4}[/{color}] {f.area}: {re.sub(r'<[^>]+>', '', f.text)}")
        console.print(f"report: {res.report.path}")
    console.print(f"done in {res.wall_s:.1f} s")
