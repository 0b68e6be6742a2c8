"""``acceptscope train``: train the reference engine's target LM and DSpark drafter, and check acceptance."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from acceptscope.cli._common import EXIT_USAGE, JsonOption, console, emit_json, require_extra

train_app = typer.Typer(
    name="train",
    help=(
        "Train the reference engine's models on text every machine has or we generate.\n\n"
        "Example:  acceptscope train target --out fixtures/models/target --steps 2000 --device cuda\n"
        "          acceptscope train drafter --target fixtures/models/target --out fixtures/models/drafter"
    ),
    no_args_is_help=True,
)


@train_app.callback()
def _needs_engine_extra() -> None:
    require_extra("train", "engine")


def _progress(desc: str):
    prog = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console, transient=False)
    task = prog.add_task(desc, total=None, info="")

    def cb(step: int, total: int, diag: dict) -> None:
        info = " ".join(f"{k}={v:.3f}" for k, v in diag.items() if k in ("loss", "argmax_match", "tau_greedy_tf"))
        prog.update(task, completed=step, total=total, info=info)

    return prog, cb


@train_app.command("target")
def target_cmd(
    out: Path = typer.Option(Path("fixtures/models/target"), "--out", help="Output model directory."),
    steps: int = typer.Option(2000, "--steps", help="Optimizer steps (upper bound if --time-budget)."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    seed: int = typer.Option(0, "--seed"),
    batch_size: int = typer.Option(64, "--batch-size"),
    seq_len: int = typer.Option(256, "--seq-len"),
    lr: float = typer.Option(3e-3, "--lr"),
    corpus_chars: int = typer.Option(4_000_000, "--corpus-chars", help="Characters of training text to build."),
    vocab_size: int = typer.Option(2048, "--vocab-size"),
    hidden_size: int = typer.Option(256, "--hidden-size"),
    num_layers: int = typer.Option(6, "--num-layers"),
    num_heads: int = typer.Option(4, "--num-heads"),
    num_kv_heads: int = typer.Option(2, "--num-kv-heads"),
    head_dim: int = typer.Option(64, "--head-dim"),
    intermediate_size: int = typer.Option(640, "--intermediate-size"),
    save_dtype: str = typer.Option("bfloat16", "--save-dtype", help="float32, bfloat16 or float16."),
    time_budget: Optional[float] = typer.Option(None, "--time-budget", help="Fit the step count to this many seconds."),
    json_out: bool = JsonOption,
) -> None:
    """Build the corpus, train the BPE tokenizer and the Qwen3-architecture target; save to --out.

    Example: acceptscope train target --out /tmp/t --steps 5 --corpus-chars 200000 --hidden-size 64
    """
    from acceptscope.engine.train import TargetTrainConfig, train_target

    if save_dtype not in ("float32", "bfloat16", "float16"):
        console.print(f"[red]--save-dtype {save_dtype!r}: use float32, bfloat16 or float16")
        raise typer.Exit(EXIT_USAGE)
    cfg = TargetTrainConfig(
        steps=steps, device=device, seed=seed, batch_size=batch_size, seq_len=seq_len, lr=lr,
        corpus_chars=corpus_chars, tokenizer_chars=min(3_000_000, corpus_chars), vocab_size=vocab_size,
        hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, intermediate_size=intermediate_size, save_dtype=save_dtype, time_budget_s=time_budget,
    )
    prog, cb = _progress("target")
    with prog:
        m = train_target(cfg, out, progress=cb)
    console.print(f"target saved to {out}: {m['parameters']:,} parameters, final loss {m['final_loss']:.3f}, "
                  f"held-out loss {m['heldout_loss_per_workload']}")
    if json_out:
        emit_json({k: v for k, v in m.items() if k != "loss_curve_every_10"})


@train_app.command("drafter")
def drafter_cmd(
    target: Path = typer.Option(Path("fixtures/models/target"), "--target", help="Target model directory."),
    out: Path = typer.Option(Path("fixtures/models/drafter"), "--out", help="Output drafter directory."),
    steps: int = typer.Option(2000, "--steps"),
    device: str = typer.Option("cpu", "--device"),
    seed: int = typer.Option(0, "--seed"),
    batch_size: int = typer.Option(32, "--batch-size"),
    seq_len: int = typer.Option(256, "--seq-len"),
    num_anchors: int = typer.Option(32, "--num-anchors", help="Anchor blocks per training sequence."),
    lr: float = typer.Option(2e-3, "--lr"),
    corpus_chars: int = typer.Option(4_000_000, "--corpus-chars"),
    gamma: int = typer.Option(7, "--gamma", help="Draft tokens per block."),
    num_layers: int = typer.Option(3, "--num-layers"),
    num_heads: int = typer.Option(4, "--num-heads"),
    intermediate_size: Optional[int] = typer.Option(None, "--intermediate-size"),
    markov_rank: int = typer.Option(64, "--markov-rank", help="0 disables the Markov head."),
    markov_head: str = typer.Option("vanilla", "--markov-head", help="vanilla (paper default) or rnn."),
    layer_ids: Optional[str] = typer.Option(None, "--layer-ids", help="Target layer taps, e.g. '0,2,4'."),
    onpolicy_sequences: int = typer.Option(0, "--onpolicy-sequences",
                                           help="Target-written training sequences (half greedy, half T=1)."),
    onpolicy_batch: int = typer.Option(512, "--onpolicy-batch"),
    save_dtype: str = typer.Option("bfloat16", "--save-dtype"),
    time_budget: Optional[float] = typer.Option(None, "--time-budget"),
    json_out: bool = JsonOption,
) -> None:
    """Train a DSpark drafter (KV injection, Markov head, confidence head) against --target.

    Example: acceptscope train drafter --target fixtures/models/target --out /tmp/d --steps 5
    """
    from acceptscope.engine.train import DrafterTrainConfig, train_drafter

    if not (target / "config.json").is_file():
        console.print(f"[red]{target}: no config.json (train the target first)")
        raise typer.Exit(EXIT_USAGE)
    if markov_head not in ("vanilla", "rnn"):
        console.print(f"[red]--markov-head {markov_head!r}: use vanilla or rnn")
        raise typer.Exit(EXIT_USAGE)
    ids = None
    if layer_ids:
        try:
            ids = [int(x) for x in layer_ids.split(",")]
        except ValueError:
            console.print(f"[red]--layer-ids {layer_ids!r}: expected comma-separated integers")
            raise typer.Exit(EXIT_USAGE)
    cfg = DrafterTrainConfig(
        steps=steps, device=device, seed=seed, batch_size=batch_size, seq_len=seq_len, num_anchors=num_anchors,
        lr=lr, corpus_chars=corpus_chars, gamma=gamma, num_layers=num_layers, num_heads=num_heads,
        intermediate_size=intermediate_size, markov_rank=markov_rank, markov_head_type=markov_head,
        target_layer_ids=ids, save_dtype=save_dtype,
        time_budget_s=time_budget, onpolicy_sequences=onpolicy_sequences,
        onpolicy_batch=onpolicy_batch,
    )
    prog, cb = _progress("drafter")
    with prog:
        m = train_drafter(target, out, cfg, progress=cb)
    f = m["final"]
    console.print(f"drafter saved to {out}: {m['trainable_parameters']:,} trainable parameters; "
                  f"loss {f.get('loss', float('nan')):.3f}, teacher-forced argmax match {f.get('argmax_match', 0):.3f}")
    if json_out:
        emit_json({k: v for k, v in m.items() if k != "history"})


@train_app.command("eval")
def eval_cmd(
    target: Path = typer.Option(Path("fixtures/models/target"), "--target"),
    drafter: Path = typer.Option(Path("fixtures/models/drafter"), "--drafter"),
    n_prompts: int = typer.Option(24, "--n-prompts", help="Prompts per workload."),
    max_new_tokens: int = typer.Option(96, "--max-new-tokens"),
    device: str = typer.Option("cpu", "--device"),
    prompts: list[str] = typer.Option([], "--prompts", help="Extra prompt set NAME=FILE.jsonl ({'turns': [...]})."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the metrics JSON here."),
    json_out: bool = JsonOption,
) -> None:
    """Greedy block acceptance (mean accepted length incl. bonus) of the drafter per workload.

    Example: acceptscope train eval --n-prompts 8 --prompts gsm8k=../shared/data/workloads/gsm8k.jsonl
    """
    import torch

    from acceptscope.engine.drafter import DSparkDrafter
    from acceptscope.engine.eval_acceptance import evaluate_workloads
    from acceptscope.engine.target import load_target
    from acceptscope.engine.tokenizer import load_tokenizer

    extra = {}
    for spec in prompts:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            console.print(f"[red]--prompts {spec!r}: expected NAME=FILE with an existing file")
            raise typer.Exit(EXIT_USAGE)
        extra[name] = path
    torch.manual_seed(0)
    t = load_target(target, device=device)
    d = DSparkDrafter.from_pretrained(drafter, target=t, device=device)
    tok = load_tokenizer(target)
    res = evaluate_workloads(t, d, tok, n_prompts, max_new_tokens, device=device, extra_prompt_files=extra,
                             progress=lambda n: console.print(f"evaluating {n} ..."))
    tab = Table(title="greedy block acceptance (tau = accepted drafts + 1)")
    for c in ("workload", "prompts", "rounds", "tau", "full-block rate"):
        tab.add_column(c)
    for name, r in res.items():
        tab.add_row(name, str(r["prompts"]), str(r["rounds"]), f"{r['tau_mean']:.3f}" if r["tau_mean"] else "-",
                    f"{r['full_block_rate']:.3f}" if r["full_block_rate"] is not None else "-")
    console.print(tab)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=2) + "\n")
    if json_out:
        emit_json(res)


@train_app.command("pair")
def pair_cmd(
    out: Path = typer.Option(Path("fixtures/models"), "--out",
                             help="Writes OUT/target, OUT/drafter, OUT/metrics.json."),
    device: str = typer.Option("cpu", "--device"),
    seed: int = typer.Option(0, "--seed"),
    target_steps: int = typer.Option(2000, "--target-steps"),
    drafter_steps: int = typer.Option(2000, "--drafter-steps"),
    target_budget: Optional[float] = typer.Option(None, "--target-budget", help="Seconds for target training."),
    drafter_budget: Optional[float] = typer.Option(None, "--drafter-budget", help="Seconds for drafter training."),
    corpus_chars: int = typer.Option(4_000_000, "--corpus-chars", help="Target training text (characters)."),
    drafter_corpus_chars: Optional[int] = typer.Option(None, "--drafter-corpus-chars",
                                                       help="Drafter training text (default: --corpus-chars)."),
    onpolicy_sequences: int = typer.Option(0, "--onpolicy-sequences"),
    onpolicy_batch: int = typer.Option(512, "--onpolicy-batch"),
    target_batch: int = typer.Option(64, "--target-batch"),
    drafter_batch: int = typer.Option(32, "--drafter-batch"),
    num_anchors: int = typer.Option(32, "--num-anchors"),
    eval_prompts: int = typer.Option(24, "--eval-prompts"),
    eval_new_tokens: int = typer.Option(96, "--eval-new-tokens"),
    json_out: bool = JsonOption,
) -> None:
    """Train the target, then the drafter, then measure acceptance per workload (T=0 and T=1).

    Example (the shipped fixture pair, on one H200; see fixtures/models/README.md): acceptscope train pair --out fixtures/models --device cuda --target-steps 3302 --drafter-steps 2112 --corpus-chars 40000000 --drafter-corpus-chars 12000000 --target-batch 128 --drafter-batch 64 --num-anchors 48 --onpolicy-sequences 12288 --onpolicy-batch 1024 --eval-prompts 16 --eval-new-tokens 80
    """
    from acceptscope.engine.train import DrafterTrainConfig, TargetTrainConfig, train_pair

    tcfg = TargetTrainConfig(steps=target_steps, device=device, seed=seed, corpus_chars=corpus_chars,
                             batch_size=target_batch, time_budget_s=target_budget)
    dcfg = DrafterTrainConfig(steps=drafter_steps, device=device, seed=seed,
                              corpus_chars=drafter_corpus_chars or corpus_chars, batch_size=drafter_batch,
                              num_anchors=num_anchors, time_budget_s=drafter_budget,
                              onpolicy_sequences=onpolicy_sequences, onpolicy_batch=onpolicy_batch)
    prog, cb = _progress("train")
    with prog:
        m = train_pair(out, tcfg, dcfg, eval_prompts=eval_prompts, eval_new_tokens=eval_new_tokens, progress=cb,
                       log=lambda s: console.print(s))
    if json_out:
        emit_json(m)


def register(app: typer.Typer) -> None:
    app.add_typer(train_app, name="train")


if __name__ == "__main__":  # lets the GPU box run it without the other command modules' deps
    train_app()
