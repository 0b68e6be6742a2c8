"""``acceptscope profile``: measure the reference engine's step cost and write SGLang-format SPS tables."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from acceptscope.cli._common import EXIT_USAGE, JsonOption, console, emit_json


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def register(app: typer.Typer) -> None:
    @app.command(
        "profile",
        help=(
            "Profile the reference engine's step time over batch size and verify tokens; write SGLang SPS "
            "tables (additive to --out, the 1-D diagonal table next to it as <stem>.1d.json).\n\n"
            "Example:  acceptscope profile --engine reference --out sps.json"
        ),
    )
    def profile_cmd(
        engine: str = typer.Option("reference", "--engine", help="Only 'reference' is profiled in-process."),
        out: Path = typer.Option(Path("sps.json"), "--out", help="Output table path."),
        fmt: str = typer.Option("both", "--format", help="additive | diagonal | both."),
        batch_sizes: str = typer.Option("1,2,4,8,16,32", "--batch-sizes", help="Comma list of batch sizes."),
        fracs: str = typer.Option("0,0.25,0.5,0.75,1", "--fracs", help="Budget fractions per batch size."),
        steps: int = typer.Option(8, "--steps", min=1, help="Timed steps per cell (median kept)."),
        context_len: int = typer.Option(64, "--context-len", min=1, help="Prefilled context per request."),
        mbin: int = typer.Option(16, "--mbin", min=1, help="Verify-token bin width of the additive fit."),
        monotone: bool = typer.Option(True, "--monotone/--no-monotone",
                                      help="Non-decreasing alpha/theta (default); --no-monotone = SGLang's raw OLS."),
        target: str = typer.Option("fixtures/models/target", "--target", help="Target model directory."),
        drafter: str = typer.Option("fixtures/models/drafter", "--drafter", help="Drafter model directory."),
        gamma: Optional[int] = typer.Option(None, "--gamma", min=1, help="Block size (<= the drafter's)."),
        threads: Optional[int] = typer.Option(None, "--threads", min=1, help="torch intra-op threads (default 1)."),
        json_out: bool = JsonOption,
    ) -> None:
        from rich.progress import Progress

        from acceptscope.engine import profile_engine

        if engine != "reference":
            console.print(f"[red]--engine {engine!r}: use SGLang's own dspark_sps_profiler for a server[/red]")
            raise typer.Exit(EXIT_USAGE)
        if fmt not in ("additive", "diagonal", "both"):
            console.print(f"[red]--format {fmt!r}: expected additive, diagonal or both[/red]")
            raise typer.Exit(EXIT_USAGE)
        bss, frs = _ints(batch_sizes), _floats(fracs)
        if fmt in ("diagonal", "both") and 1.0 not in frs:
            frs.append(1.0)
        with Progress(console=console) as prog:
            task = prog.add_task("profiling cells", total=len(bss) * len(frs))
            try:
                res = profile_engine(target, drafter, out, fmt=fmt, batch_sizes=bss, fracs=frs, steps=steps,
                                     context_len=context_len, mbin=mbin, monotone=monotone, gamma=gamma, threads=threads,
                                     progress=lambda: prog.advance(task))
            except (FileNotFoundError, ValueError) as e:
                console.print(f"[red]{e}[/red]")
                raise typer.Exit(EXIT_USAGE)
        if json_out:
            emit_json(res)
            return
        for kind, info in res["tables"].items():
            console.print(f"{kind}: {info['path']}  sha256 {info['sha256'][:12]}")
        console.print(f"{len(res['cells'])} cells profiled in {res['wall_s']:.1f}s")
