"""``acceptscope profile``: measure the reference engine's step cost and write SGLang-format SPS tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.progress import Progress

from acceptscope.console import safe
from acceptscope.cli._common import EXIT_USAGE, JsonOption, console, emit_json, require_extra


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
            "Examples:\n\n"
            "  acceptscope profile --engine reference --out sps.json   # the tiny fixture pair on this CPU\n\n"
            "  acceptscope profile --device cuda --shape qwen3-8b --out h200-qwen3-8b.json   # GPU, real shape\n\n"
            "  acceptscope profile --from-measurements cells.json --shape qwen3-8b --out p.json   # fit only\n\n"
            "--device cuda times a random-weight Qwen3 decoder of --shape (bf16, CUDA graphs, a --context-len "
            "K/V cache, drafter + compact verify of ragged front-packed windows, batch 1..256) and writes both "
            "SGLang formats plus <out>.manifest.json (GPU, driver, torch/CUDA, shape, context, date, cells, "
            "memory-bandwidth bound ratio) and <stem>.cells.json (the raw measurements)."
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
        device: str = typer.Option("cpu", "--device", help="cpu: profile the reference engine; cuda: a "
                                   "real-shape random-weight decoder (--shape) on the GPU."),
        shape: Optional[str] = typer.Option(None, "--shape", help="qwen3-1.7b | qwen3-8b | qwen3-32b (a real-shape "
                                            "random-weight decoder on --device; 'tiny' for a CPU smoke run)."),
        from_measurements: Optional[Path] = typer.Option(None, "--from-measurements", help="Fit the tables from a "
                                                         "GPU measurement JSON instead of measuring."),
        draft_layers: int = typer.Option(5, "--draft-layers", min=0, help="--device cuda: drafter layers."),
        json_out: bool = JsonOption,
    ) -> None:
        require_extra("profile", "engine")
        if device != "cpu" or from_measurements is not None or shape is not None:
            _gpu_profile(device, shape, from_measurements, out, batch_sizes, fracs, steps, context_len, mbin,
                         gamma, draft_layers, json_out)
            return

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
                console.print(f"[red]{safe(e)}[/red]")
                raise typer.Exit(EXIT_USAGE)
        if json_out:
            emit_json(res)
            return
        for kind, info in res["tables"].items():
            console.print(f"{kind}: {info['path']}  sha256 {info['sha256'][:12]}")
        console.print(f"{len(res['cells'])} cells profiled in {res['wall_s']:.1f}s")


def _gpu_profile(device, shape, from_measurements, out, batch_sizes, fracs, steps, context_len, mbin, gamma,
                 draft_layers, json_out) -> None:
    from acceptscope.engine import profiler

    if from_measurements is not None:
        try:
            doc = json.loads(Path(from_measurements).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            console.print(f"[red]{from_measurements}: {e}[/red]")
            raise typer.Exit(EXIT_USAGE)
    else:
        from acceptscope.engine import gpu_profile as gp

        if shape is None:
            console.print(f"[red]--device {device} needs --shape (qwen3-1.7b, qwen3-8b or qwen3-32b)[/red]")
            raise typer.Exit(EXIT_USAGE)
        bss = batch_sizes if batch_sizes != "1,2,4,8,16,32" else "1,2,4,8,16,32,64,128,256"
        frs = fracs if fracs != "0,0.25,0.5,0.75,1" else "0,0.125,0.25,0.375,0.5,0.625,0.75,0.875,1"
        cells_path = Path(out).with_name(Path(out).name.removesuffix(".json") + ".cells.json")
        argv = ["--shape", shape, "--out", str(cells_path), "--batch-sizes", bss, "--fracs", frs,
                "--context-len", str(context_len if context_len != 64 else 1024), "--device", device,
                "--draft-layers", str(draft_layers), "--reps", str(max(steps, 15))]
        if gamma:
            argv += ["--gamma", str(gamma)]
        try:
            gp.get_shape(shape)
            gp.main(argv)
        except (ValueError, RuntimeError) as e:
            console.print(f"[red]{safe(e)}[/red]")
            raise typer.Exit(EXIT_USAGE)
        doc = json.loads(cells_path.read_text(encoding="utf-8"))
    try:
        man = profiler.write_measured_profile(doc, out, shape=shape, mbin=mbin if mbin != 16 else 32)
    except ValueError as e:
        console.print(f"[red]{safe(e)}[/red]")
        raise typer.Exit(EXIT_USAGE)
    if json_out:
        emit_json({k: v for k, v in man.items() if k != "cells"})
        return
    b = man.get("bound") or {}
    for kind, info in man["tables"].items():
        console.print(f"{kind}: {info['path']}  sha256 {info['sha256'][:12]}  fit median "
                      f"{info['fit']['median_rel_err']:.1%} max {info['fit']['max_rel_err']:.1%}")
    if b:
        console.print(f"batch-1 verify {min(b['batch1_verify_ms'].values()):.2f} ms vs bandwidth bound "
                      f"{b['bound_ms']:.2f} ms (ratio {b['ratio_min']:.2f})")
