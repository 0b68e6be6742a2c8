"""``acceptscope calibrate``: fit STS temperatures and write an SGLang-loadable JSON."""

from __future__ import annotations

from pathlib import Path

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from acceptscope.cli._common import (
    EXIT_NO_DATA,
    EXIT_NOT_BETTER,
    EXIT_USAGE,
    DbOption,
    JsonOption,
    console,
    emit_json,
    open_store_read_only,
    require_db,
    require_out_dir,
)
from acceptscope.console import plain
from acceptscope.outputs import atomic_write

HELP = """Fit Sequential Temperature Scaling for a run and write SGLang's STS JSON.

Fits on a request split of the run and scores on the other split: ECE (15
equal-width bins, as SGLang logs it), equal-mass and debiased ECE, Brier, NLL
and AUROC, for identity, the table in force, SGLang's grid method and the smooth
alternatives. --method auto (the default) picks the fit with the lowest held-out
--score; the chosen method is refitted on all samples and written to --out
(loadable by --speculative-dspark-confidence-sts-path; extra metadata sits
under an "acceptscope" key that SGLang ignores).

A fit that scores worse on held-out data than the table in force (identity when
the run had none) is not written: the command prints the comparison, says so
in one line and exits 4; --force writes it anyway.

Labels: realized (default; needs a cap-accept or static run: position k is
labelled reached iff k < ceiling) or greedy (SGLang's collector label from
ingested STS shards).

A run served with an STS table (its /server_info names one, and the file was
ingested) recorded post-STS confidences c_k = sigmoid(z_k / T_k): the fit
undoes the table in force (z_k = T_k * logit(c_k)), so --out is the table
SGLang should load next, composed with the one in force.

Exit codes: 0 written; 2 bad arguments; 3 no run / no usable samples;
4 not written (the fit scores worse than the table in force; see --force).

\b
Examples:
  acceptscope calibrate --db audit.duckdb --run ref-cap-1 --out sts.json
  acceptscope calibrate --db audit.duckdb --run sg-cap --out sts.json \\
      --method sequential-ece --label greedy --json
"""


def register(app: typer.Typer) -> None:
    @app.command("calibrate", help=HELP)
    def calibrate(
        db: Path = DbOption,
        run: str = typer.Option(..., "--run", help="Run id holding the calibration samples."),
        out: Path = typer.Option(Path("sts.json"), "--out", "-o", help="STS JSON to write."),
        method: str = typer.Option("auto", "--method", metavar="METHOD",
                                   help="auto | sequential-ece | smooth-nll | smooth-brier"),
        score: str = typer.Option("ece", "--score", metavar="SCORE",
                                  help="Held-out score that chooses: ece | brier | nll (lower is better)."),
        force: bool = typer.Option(False, "--force",
                                   help="Write the fit even when it scores worse than the table in force."),
        label: str = typer.Option("realized", "--label", metavar="LABEL", help="realized | greedy"),
        n_boot: int = typer.Option(200, "--n-boot", min=10, help="Bootstrap replicates for CIs."),
        seed: int = typer.Option(0, "--seed", help="Seed of the split and bootstrap."),
        json_out: bool = JsonOption,
    ) -> None:
        from acceptscope.estimators.calibration import METHODS, SCORES

        for name, value, allowed in (("--method", method, ("auto", *METHODS)), ("--score", score, SCORES),
                                     ("--label", label, ("realized", "greedy"))):
            if value not in allowed:
                console.print(f"{name} must be one of {', '.join(allowed)}, got {value!r}", style="red",
                              markup=False, highlight=False, soft_wrap=True)
                raise typer.Exit(EXIT_USAGE)
        require_db(db)
        require_out_dir(out)
        from acceptscope.estimators import load_run, sts_in_force
        from acceptscope.estimators.calibration import (StsCalibrator, calibration_data, check_sglang_sts, choose,
                                                        compare)

        store = open_store_read_only(db)
        try:
            data = load_run(store, run)
        except KeyError as e:
            console.print(f"[red]{e.args[0]}[/red]")
            raise typer.Exit(EXIT_NO_DATA)
        gamma = int(data["run"]["gamma"])
        try:
            in_force = sts_in_force(data)
            with console.status("preparing samples"):
                # realized labels on post-STS confidences: z = T_k * logit(c_k) undoes the table in force, so the
                # fit is in the head's raw-logit space and its temperatures are what SGLang loads next
                d = calibration_data(data["request_steps"] if label == "realized" else None, label,
                                     sts_samples=data["sts_samples"], temperatures=in_force, gamma=gamma)
        except ValueError as e:
            console.print(f"{db} run {run!r}: {e}", style="red", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_NO_DATA)
        extra_fits = None if in_force is None else {"in-force": [float(x) for x in in_force]}
        try:  # too few requests to split into a fit and a held-out part: cannot estimate, like no data
            tr, te = d.split(seed=seed)
            with console.status("fitting and scoring on the held-out split"):
                res = compare(tr, te, n_boot=n_boot, seed=seed, extra_fits=extra_fits)
        except ValueError as e:
            console.print(f"{plain(db)} run {plain(repr(run))}: cannot calibrate: {plain(e)}", style="red",
                          markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_NO_DATA)
        choice = choose(res, METHODS if method == "auto" else (method,), score)
        chosen = choice["best"]
        write = choice["better"] or force
        verdict = _verdict(choice, write)
        if write:
            final = StsCalibrator(chosen).fit(d.z, d.y)
            extra = {"held_out": {r["method"]: {"ece": r["ece"], "brier": r["brier"], "nll": r["nll"]}
                                  for r in choice["rows"]},
                     "held_out_temperatures": res.temperatures, "notes": d.notes, "run_id": run,
                     "chosen_by": {k: choice[k] for k in ("score", "best_score", "baseline", "baseline_score")}}
            if in_force is not None:
                extra["composed_with"] = {"table_hash": data["run"]["sts_hash"], "path": data.get("sts_named"),
                                          "temperatures": [float(x) for x in in_force],
                                          "relative": [float(a / b) for a, b in zip(final.temperatures_, in_force)]}
            text = final.to_sglang_json(dataset=f"acceptscope:{db.name}:{run}", label=label, extra=extra)
            check_sglang_sts(text, gamma=gamma)
            atomic_write(out, text)  # a kill or ulimit -f leaves the old table whole
        if json_out:
            emit_json({"out": str(out) if write else None, "written": write, "method": chosen, "label": label,
                       "temperatures": final.temperatures_ if write else None,
                       "num_samples": final.num_samples_ if write else len(d.z),
                       "comparison": choice, "verdict": verdict,
                       "held_out": res.to_json()["summary"], "notes": d.notes,
                       "in_force": extra_fits and extra_fits["in-force"]})
        else:
            _print_comparison(res, choice, label)
            console.print(verdict, markup=False, highlight=False, soft_wrap=True)
            if write:
                console.print(f"wrote {out}: T = [{', '.join(f'{x:.3f}' for x in final.temperatures_)}] "
                              f"({chosen}, {label})", markup=False, highlight=False, soft_wrap=True)
                if in_force is not None:
                    console.print("composed with the table in force (T = [" + ", ".join(f"{x:.3f}" for x in in_force)
                                  + "]): the file holds raw-logit temperatures, load it as is", markup=False,
                                  highlight=False, soft_wrap=True)
            for note in d.notes:
                console.print("  " + note, markup=False, highlight=False, soft_wrap=True)
        if not write:
            raise typer.Exit(EXIT_NOT_BETTER)


def _verdict(choice: dict, write: bool) -> str:
    """One line: what was chosen against what, and whether it was written."""
    s, best, base = choice["score"], choice["best"], choice["baseline"]
    cmp = (f"{best} held-out {s} {choice['best_score']:.4f} vs {base} {choice['baseline_score']:.4f}")
    if choice["better"]:
        return f"chose {cmp}"
    if write:
        return f"written under --force: {cmp} (worse than the table in force)"
    return f"not written: {cmp}, worse than the table in force; --force writes it anyway"


def _print_comparison(res, choice: dict, label: str) -> None:
    """The held-out table, every table ranked by the choosing score, the chosen and the baseline marked;
    the two further ECE readings only where the terminal is wide enough (--json has all of them)."""
    cols = [("ECE", "ece"), ("Brier", "brier"), ("NLL", "nll"), ("AUROC", "auroc")]
    if console.width >= 100:
        cols[1:1] = [("ECE mass", "ece_mass"), ("ECE debiased", "ece_debiased")]
    t = Table(title=f"STS held out (label {label}; train {res.n_train}, test {res.n_test}; by {choice['score']})",
              box=box.SIMPLE_HEAD)
    t.add_column("table", no_wrap=True)
    t.add_column("", no_wrap=True)
    for head, _ in cols:
        t.add_column(head, justify="right", no_wrap=True)
    for r in choice["rows"]:
        mark = "chosen" if r["method"] == choice["best"] else "baseline" if r["method"] == choice["baseline"] else ""
        t.add_row(escape(r["method"]), mark, *(f"{r[c]:.4f}" for _, c in cols))
    console.print(t)
