"""``acceptscope live ...``: launch, attach to, drive, profile and export live SGLang DSpark servers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.progress import Progress

from acceptscope.console import plain, safe
from acceptscope.cli._common import (EXIT_FAILURE, EXIT_USAGE, DbOption, JsonOption, console, emit_json, require_db,
                                     require_extra)

HELP = """Real SGLang 0.5.23 DSpark servers: launch arms, attach, drive traffic, capture live.

\b
Examples:
  # the exact command line and environment of the compact arm (no GPU needed)
  acceptscope live launch --arm compact --model-path T --draft-model-path D \\
      --block-size 7 --dry-run
\b
  # attach to a running cap-accept server, drive 64 prompts, capture it all
  acceptscope live attach --url http://127.0.0.1:30001 --db run.duckdb \\
      --arm cap-accept --workload gsm8k,mbpp -n 64 --concurrency 1,8
\b
  # serve derived metrics (ceiling, utilization, ECE, cost error) for Grafana
  acceptscope live export-metrics --db run.duckdb --port 9464
"""


def _split_ints(s: str | None) -> list[int] | None:
    if not s:
        return None
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {s!r}") from None


def _split_floats(s: str | None) -> list[float] | None:
    if not s:
        return None
    try:
        return [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated numbers, got {s!r}") from None


live = typer.Typer(help=HELP, no_args_is_help=True)


@live.callback()
def _needs_live_extra() -> None:
    require_extra("live", "live")


@live.command("launch", help="""Start one DSpark arm (python -m sglang.launch_server) and wait until ready.

\b
Example:
  acceptscope live launch --arm cap-accept --model-path T \\
      --draft-model-path D --block-size 7 --port 30001 \\
      --estimator-jsonl est.jsonl --sts-collect-stem sts/cap
""")
def launch(
    arm: str = typer.Option(..., "--arm", help="compact | cap-accept | static"),
    model_path: str = typer.Option(..., "--model-path", help="Target model."),
    draft_model_path: Optional[str] = typer.Option(None, "--draft-model-path", help="DSpark draft checkpoint."),
    block_size: int = typer.Option(7, "--block-size", help="gamma (--speculative-dspark-block-size)."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(30000, "--port"),
    sps_table: Optional[str] = typer.Option(None, "--sps-table", help="SPS cost table JSON."),
    sts_table: Optional[str] = typer.Option(None, "--sts-table", help="STS calibration JSON."),
    tp_size: int = typer.Option(1, "--tp-size"),
    attn_dp_size: Optional[int] = typer.Option(None, "--attn-dp-size", help="Attention DP size (adds --enable-dp-lm-head)."),
    moe_draft: bool = typer.Option(False, "--moe-draft", help="The draft is MoE (dsv4): CUDA graphs allowed under DP."),
    disable_cuda_graph: bool = typer.Option(False, "--disable-cuda-graph"),
    debug_dump: str = typer.Option("core,reqs,step_cpu_time", "--debug-dump", help="SGLANG_DSPARK_DEBUG_DUMP components."),
    estimator_jsonl: Optional[str] = typer.Option(None, "--estimator-jsonl", help="Record the block-accept estimator here."),
    sts_collect_stem: Optional[str] = typer.Option(None, "--sts-collect-stem", help="Collect STS shards {stem}.{k}.pt."),
    log_dir: Path = typer.Option(Path("acceptscope-logs"), "--log-dir", help="Server stdout/stderr logs."),
    ready_timeout: float = typer.Option(900.0, "--ready-timeout", help="Seconds to wait for /health."),
    hold: Optional[float] = typer.Option(None, "--hold", help="Stop the server after this many seconds (default: until Ctrl-C)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and print argv/env; start nothing."),
    entry: Optional[str] = typer.Option(None, "--entry", hidden=True, help="Replace 'python -m sglang.launch_server' (tests)."),
    json_out: bool = JsonOption,
) -> None:
    from acceptscope.live.launcher import ArmSpec, LaunchConfigError, ServerProcess, ServerStartError, SGLangUnavailable

    spec = ArmSpec(arm=arm, target_model=model_path, draft_model=draft_model_path, gamma=block_size, host=host,
                   port=port, sps_table_path=sps_table, sts_table_path=sts_table, tp_size=tp_size,
                   attn_dp_size=attn_dp_size, dense_draft=not moe_draft, disable_cuda_graph=disable_cuda_graph,
                   debug_dump=tuple(t for t in debug_dump.split(",") if t), estimator_path=estimator_jsonl,
                   sts_collect_stem=sts_collect_stem)
    try:
        warnings = spec.validate()
    except LaunchConfigError as e:
        console.print(f"[red]{safe(e)}[/red]")
        raise typer.Exit(EXIT_USAGE)
    for w in warnings:
        console.print(f"[yellow]warning:[/yellow] {safe(w)}")
    entry_argv = entry.split() if entry else None
    if dry_run:
        out = {"argv": spec.argv(entry_argv), "env": spec.env(), "url": spec.base_url, "warnings": warnings}
        if json_out:
            emit_json(out)
        else:
            console.print(" ".join(f"{k}={v}" for k, v in spec.env().items()) + " " + " ".join(spec.argv(entry_argv)))
        return
    proc = ServerProcess(spec, log_dir, entry=entry_argv)
    try:
        proc.start()
        with console.status(f"waiting for {safe(spec.base_url)}/health (logs: {safe(proc.stderr_path)})"):
            proc.wait_ready(ready_timeout)
    except SGLangUnavailable as e:
        console.print(f"[red]{safe(e)}[/red]")
        raise typer.Exit(EXIT_FAILURE)
    except ServerStartError as e:
        proc.stop()
        console.print(f"[red]{safe(e)}[/red]")
        raise typer.Exit(EXIT_FAILURE)
    console.print(f"[green]ready[/green] {spec.base_url} ({arm}); logs in {proc.log_dir}")
    if json_out:
        emit_json({"url": spec.base_url, "pid": proc.proc.pid, "logs": str(proc.stderr_path), "warnings": warnings})
    try:
        deadline = None if hold is None else time.monotonic() + hold
        while proc.alive() and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        code = proc.stop()
        console.print(f"server stopped (exit code {code})")


@live.command("attach", help="""Capture a running server: poll /server_info, tail side files, optionally drive traffic.

\b
Examples:
  acceptscope live attach --url http://127.0.0.1:30000 --db run.duckdb \\
      --arm compact --duration 600
  acceptscope live attach --url http://127.0.0.1:30001 --db run.duckdb \\
      --arm cap-accept --workload mixed -n 128 --concurrency 1,16 \\
      --estimator-jsonl /data/est.jsonl --clear threshold
""")
def attach(
    url: str = typer.Option(..., "--url", help="Base URL of the SGLang server."),
    db: Path = DbOption,
    arm: Optional[str] = typer.Option(None, "--arm", help="Expected verify mode (checked against the server)."),
    duration: Optional[float] = typer.Option(
        None, "--duration", help="Seconds to capture without traffic (a hard stop: no request runs past it)."),
    run_id: Optional[str] = typer.Option(None, "--run-id"),
    audit_group: Optional[str] = typer.Option(None, "--audit-group"),
    poll_interval: float = typer.Option(1.0, "--poll-interval"),
    http_timeout: float = typer.Option(60.0, "--http-timeout",
                                       help="Total seconds one request may take (headers and body)."),
    max_response_mb: float = typer.Option(1024.0, "--max-response-mb",
                                          help="Largest /server_info body read (MiB); a larger one fails its poll."),
    clear: str = typer.Option("never", "--clear", help="Ring clearing: never | every | threshold."),
    clear_threshold: int = typer.Option(50_000, "--clear-threshold", help="Records per rank that trigger a clear."),
    estimator_jsonl: Optional[str] = typer.Option(None, "--estimator-jsonl", help="Tail this estimator JSONL."),
    sts_stem: Optional[str] = typer.Option(None, "--sts-stem", help="Tail STS shards {stem}.{k}.pt."),
    workload: Optional[str] = typer.Option(None, "--workload", "-w", help="Drive this workload (names or .jsonl paths)."),
    num_prompts: int = typer.Option(32, "--num-prompts", "-n"),
    concurrency: str = typer.Option("1", "--concurrency", help="Comma-separated concurrency sweep."),
    api: str = typer.Option("generate", "--api", help="generate | openai"),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens"),
    temperature: float = typer.Option(0.0, "--temperature"),
    seed: int = typer.Option(0, "--seed"),
    max_requests: int = typer.Option(10_000, "--max-requests", help="Hard cap on requests sent."),
    max_seconds: float = typer.Option(3600.0, "--max-seconds", help="Hard cap on driving time."),
    loopback_only: bool = typer.Option(False, "--loopback-only", help="Refuse non-loopback targets."),
    json_out: bool = JsonOption,
) -> None:
    from acceptscope.live.driver import DriveConfig, TargetRefused, WorkloadError, load_prompts
    from acceptscope.live.session import CaptureConfig, CaptureError, capture
    from acceptscope.store import Store

    if workload is None and duration is None:
        console.print("[red]give --workload (drive traffic) or --duration (capture only)[/red]")
        raise typer.Exit(EXIT_USAGE)
    existed = db.exists()
    try:
        prompts = load_prompts(workload, num_prompts) if workload else None
        drive = DriveConfig(base_url=url, run_id="", api=api, concurrency=_split_ints(concurrency) or [1],
                            max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                            max_requests=max_requests, max_seconds=max_seconds, loopback_only=loopback_only) if workload else None
        cfg = CaptureConfig(base_url=url, arm=arm, run_id=run_id, audit_group=audit_group, poll_interval_s=poll_interval,
                            clear=clear, clear_threshold_records=clear_threshold, estimator_path=estimator_jsonl,
                            sts_stem=sts_stem, duration_s=duration, loopback_only=loopback_only,
                            http_timeout_s=http_timeout, max_response_bytes=int(max_response_mb * (1 << 20)))
        with console.status(f"capturing {safe(url)} into {safe(db)}"):
            summary = capture(Store(db), cfg, prompts, drive)
    except (WorkloadError, TargetRefused, ValueError) as e:
        _discard_if_empty(db, existed)
        console.print(f"[red]{safe(e)}[/red]")
        raise typer.Exit(EXIT_USAGE)
    except CaptureError as e:
        _discard_if_empty(db, existed)
        console.print(f"[red]{safe(e)}[/red]")
        raise typer.Exit(EXIT_FAILURE)
    except BaseException:
        _discard_if_empty(db, existed)
        raise
    d = summary.as_dict()
    no_poll = not d["polls"].get("polls") and d["polls"].get("down_polls")
    if json_out:
        emit_json(d)
    else:
        console.print(f"run {safe(summary.run_id)} ({summary.arm}, gamma {summary.gamma}): "
                      f"{d['sink']['rows']} rows; gaps {summary.gaps or 'none'}; rejects {summary.rejects}")
        for w in summary.warnings:
            console.print(f"[yellow]warning:[/yellow] {safe(w)}")
    if no_poll:  # every poll failed (server down, too slow, too large, redirected): nothing was captured
        _discard_if_empty(db, existed)
        console.print(plain(f"no poll of {url}/server_info succeeded ({d['polls']['down_polls']} failed; last: "
                            f"{d['polls'].get('last_error')})"), style="red", markup=False, soft_wrap=True)
        raise typer.Exit(EXIT_FAILURE)


def _discard_if_empty(db: Path, existed: bool) -> None:
    """Remove the database file a failed attach created, when it holds no row (no empty file is left behind)."""
    if existed or not db.exists():
        return
    from acceptscope.store import Store

    try:
        empty = not any(Store(db, read_only=True).counts().values())
    except Exception:  # noqa: BLE001 - unreadable: not ours to judge; leave it
        return
    if empty:
        for p in (db, Path(str(db) + ".wal"), Path(str(db) + ".ingest.lock")):
            try:
                p.unlink()
            except FileNotFoundError:
                pass


@live.command("drive", help="""Send a workload to a server and record per-request meta_info in `requests`.

\b
Example:
  acceptscope live drive --url http://127.0.0.1:30000 --db run.duckdb \\
      --run-id r1 -w gsm8k -n 50 --concurrency 4
""")
def drive_cmd(
    url: str = typer.Option(..., "--url"),
    db: Path = DbOption,
    run_id: str = typer.Option(..., "--run-id", help="Run the request rows belong to."),
    workload: str = typer.Option("mixed", "--workload", "-w"),
    num_prompts: int = typer.Option(32, "--num-prompts", "-n"),
    concurrency: str = typer.Option("1", "--concurrency"),
    api: str = typer.Option("generate", "--api", help="generate | openai"),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens"),
    temperature: float = typer.Option(0.0, "--temperature"),
    seed: int = typer.Option(0, "--seed"),
    max_requests: int = typer.Option(10_000, "--max-requests"),
    max_seconds: float = typer.Option(3600.0, "--max-seconds"),
    loopback_only: bool = typer.Option(False, "--loopback-only"),
    json_out: bool = JsonOption,
) -> None:
    from acceptscope.live.driver import DriveConfig, Driver, TargetRefused, WorkloadError, load_prompts
    from acceptscope.store import Store

    try:
        prompts = load_prompts(workload, num_prompts)
        cfg = DriveConfig(base_url=url, run_id=run_id, api=api, concurrency=_split_ints(concurrency) or [1],
                          max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                          max_requests=max_requests, max_seconds=max_seconds, loopback_only=loopback_only)
    except (WorkloadError, ValueError) as e:
        console.print(f"[red]{safe(e)}[/red]")
        raise typer.Exit(EXIT_USAGE)
    store = Store(db)
    total = min(max_requests, len(prompts) * len(cfg.concurrency))
    with Progress(console=console, transient=True) as prog:
        task = prog.add_task("requests", total=total)

        def on_rows(rows):
            store.append({"requests": rows})
            prog.advance(task, len(rows))

        try:
            res = Driver(cfg, on_rows=on_rows, on_rejects=lambda rows: store.append({"rejects": rows})).run(prompts)
        except TargetRefused as e:
            console.print(f"[red]{safe(e)}[/red]")
            raise typer.Exit(EXIT_USAGE)
    if json_out:
        emit_json(res.summary())
    else:
        console.print(f"{len(res.rows)} requests recorded ({len(res.errors)} errors, stopped by {res.stopped_by})")
    if res.errors and not res.rows:
        raise typer.Exit(EXIT_FAILURE)


@live.command("export-metrics", help="""Serve acceptscope's derived live metrics for Prometheus/Grafana (loopback).

\b
Example:
  acceptscope live export-metrics --db run.duckdb --port 9464
  # then scrape http://127.0.0.1:9464/metrics
""")
def export_metrics(
    db: Path = DbOption,
    port: int = typer.Option(9464, "--port"),
    run_id: Optional[List[str]] = typer.Option(None, "--run-id", help="Restrict to these runs (repeatable)."),
    n_boot: int = typer.Option(200, "--n-boot", min=10, help="Bootstrap replicates (as `estimate --n-boot`)."),
    refresh: float = typer.Option(2.0, "--refresh", help="Seconds between data-version probes (re-estimated when it changed)."),
    duration: Optional[float] = typer.Option(None, "--duration", help="Stop after this many seconds."),
    json_out: bool = JsonOption,
) -> None:
    require_db(db)
    from acceptscope.live.exporter import MetricsExporter

    ex = MetricsExporter(str(db), port, run_ids=run_id, n_boot=n_boot, refresh_s=refresh).start()
    console.print(f"serving {ex.url}")
    if json_out:
        emit_json({"url": ex.url})
    try:
        deadline = None if duration is None else time.monotonic() + duration
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        ex.stop()


@live.command("sps-profile", help="""Profile SPS (steps/s per batch tokens) of a live server into sps_profile_* tables.

\b
Examples:
  # our own sweep over HTTP (server: SGLANG_DSPARK_ENABLE_SPS_RECORD=1)
  acceptscope live sps-profile --url http://127.0.0.1:30000 --db sps.duckdb \\
      --batch-size 1,2,4,8,16 --out sps.json
\b
  # SGLang's profiler as a subprocess (needs sglang); --dry-run prints it
  acceptscope live sps-profile --url http://127.0.0.1:30000 --sglang \\
      --out sps.json --dry-run
""")
def sps_profile(
    url: str = typer.Option(..., "--url"),
    db: Path = DbOption,
    run_id: Optional[str] = typer.Option(None, "--run-id"),
    batch_size: str = typer.Option("1,2,4,8", "--batch-size", help="Per-DP-rank batch sizes."),
    fracs: Optional[str] = typer.Option(None, "--fracs", help="Forced budget fractions (off-diagonal)."),
    repeats: int = typer.Option(1, "--repeats"),
    min_steady_steps: int = typer.Option(32, "--min-steady-steps"),
    round_timeout: float = typer.Option(120.0, "--round-timeout"),
    out: Optional[str] = typer.Option(None, "--out", help="SPS table JSON to write (SGLang format)."),
    sglang: bool = typer.Option(False, "--sglang", help="Run SGLang's dspark_sps_profiler instead of our sweep."),
    dry_run: bool = typer.Option(False, "--dry-run", help="With --sglang: print the command only."),
    loopback_only: bool = typer.Option(False, "--loopback-only"),
    json_out: bool = JsonOption,
) -> None:
    from acceptscope.live.driver import TargetRefused, check_target
    from acceptscope.live.sps import SglangProfilerCommand, SweepConfig, sps_sweep

    try:
        base = check_target(url, loopback_only)
    except TargetRefused as e:
        console.print(f"[red]{safe(e)}[/red]")
        raise typer.Exit(EXIT_USAGE)
    if sglang:
        cmd = SglangProfilerCommand(base_url=base, out=out or "dspark_sps.json", fracs=_split_floats(fracs),
                                    batch_sizes=_split_ints(batch_size), repeats=repeats,
                                    min_steady_steps=min_steady_steps, round_timeout=round_timeout)
        if dry_run:
            if json_out:
                emit_json({"argv": cmd.argv(), "outputs": {k: str(v) for k, v in cmd.outputs().items()}})
            else:
                console.print(" ".join(cmd.argv()))
            return
        from acceptscope.live.launcher import SGLangUnavailable

        try:
            code = cmd.run()
        except SGLangUnavailable as e:
            console.print(f"[red]{safe(e)}[/red]")
            raise typer.Exit(EXIT_FAILURE)
        if code != 0:
            console.print(f"[red]SGLang profiler exited {code}[/red]")
            raise typer.Exit(EXIT_FAILURE)
        from acceptscope.live.sps import ingest_profiler_outputs
        from acceptscope.store import Store

        rid = run_id or f"sps-{time.strftime('%Y%m%dT%H%M%S')}"
        batch = ingest_profiler_outputs(cmd.out, rid)
        batch.write(Store(db))
        if json_out:
            emit_json({"run_id": rid, "rows": batch.counts(), "outputs": {k: str(v) for k, v in cmd.outputs().items()}})
        else:
            console.print(f"SGLang profiler done; ingested {batch.counts()} into {db} as run {rid}")
        return
    from acceptscope.live.sink import StoreSink
    from acceptscope.store import Store

    rid = run_id or f"sps-{time.strftime('%Y%m%dT%H%M%S')}"
    cfg = SweepConfig(base_url=base, run_id=rid, batch_sizes=_split_ints(batch_size) or [1],
                      fracs=_split_floats(fracs), repeats=repeats, min_steady_steps=min_steady_steps,
                      round_timeout_s=round_timeout, out=out)
    with StoreSink(Store(db)) as sink:
        try:
            with console.status("profiling") as st:
                res = sps_sweep(cfg, sink.put, progress=lambda m: st.update(m))
        except RuntimeError as e:
            console.print(f"[red]{safe(e)}[/red]")
            raise typer.Exit(EXIT_FAILURE)
    summary = {"run_id": rid, "rounds": res.rounds, "table": res.table, "failures": res.failures}
    if json_out:
        emit_json(summary)
    else:
        for r in res.rounds:
            console.print(f"bs/rank {r['batch_size_per_rank']:>4} frac {r['frac']}: {r['steps_per_sec']:.1f} steps/s "
                          f"({r['num_steady_steps']} steady steps)")
        for f in res.failures:
            console.print(f"[yellow]{f}[/yellow]")
    if not res.rounds:
        raise typer.Exit(EXIT_FAILURE)


def register(app: typer.Typer) -> None:
    """Mount ``acceptscope live ...`` on the top-level CLI."""
    app.add_typer(live, name="live")
