"""``acceptscope calibrate``: fit STS temperatures and write an SGLang-loadable JSON."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from acceptscope.cli._common import (
    EXIT_NO_DATA,
    EXIT_USAGE,
    DbOption,
    JsonOption,
    console,
    emit_json,
    open_store_read_only,
)
from acceptscope.console import plain
from acceptscope.outputs import atomic_write

HELP = """Fit Sequential Temperature Scaling for a run and write SGLang's STS JSON.

Fits on a request split of the run, scores on the other split (ECE 15 equal-width
bins as SGLang logs it, equal-mass and debiased ECE, Brier, NLL, AUROC with
request-clustered bootstrap CIs) for SGLang's grid method and the smooth
alternatives, then refits the chosen method on all samples and writes
--out (loadable by --speculative-dspark-confidence-sts-path; extra metadata sits
under an "acceptscope" key that SGLang ignores).

Labels: realized (default; needs a cap-accept or static run: position k is
labelled reached iff k < ceiling) or greedy (SGLang's collector label from
ingested STS shards).

A run served with an STS table (its /server_info names one, and the file was
ingested) recorded post-STS confidences c_k = sigmoid(z_k / T_k): the fit
undoes the table in force (z_k = T_k * logit(c_k)), so --out is the table
SGLang should load next, composed with the one in force; the held-out
comparison shows identity, the table in force ("in-force") and each fit.

Exit codes: 0 ok; 2 bad arguments; 3 no run / no usable samples.

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
        method: str = typer.Option("smooth-nll", "--method", help="sequential-ece | smooth-nll | smooth-brier"),
        label: str = typer.Option("realized", "--label", help="realized | greedy"),
        n_boot: int = typer.Option(200, "--n-boot", min=10, help="Bootstrap replicates for CIs."),
        seed: int = typer.Option(0, "--seed", help="Seed of the split and bootstrap."),
        json_out: bool = JsonOption,
    ) -> None:
        from acceptscope.estimators.calibration import METHODS

        if method not in METHODS:
            console.print(f"[red]--method must be one of {', '.join(METHODS)}, got {method!r}[/red]")
            raise typer.Exit(EXIT_USAGE)
        if label not in ("realized", "greedy"):
            console.print(f"[red]--label must be realized or greedy, got {label!r}[/red]")
            raise typer.Exit(EXIT_USAGE)
        if not db.exists():
            console.print(f"[red]{db}: no such database file[/red]")
            raise typer.Exit(EXIT_USAGE)
        from acceptscope.estimators import load_run, sts_in_force
        from acceptscope.estimators.calibration import StsCalibrator, calibration_data, check_sglang_sts, compare

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
            final = StsCalibrator(method).fit(d.z, d.y)
        summ = res.summary()
        held = summ.set_index("method")
        extra = {"held_out": {m: {"ece": float(held.loc[m, "ece"]), "brier": float(held.loc[m, "brier"])}
                              for m in held.index},
                 "held_out_temperatures": res.temperatures, "notes": d.notes, "run_id": run}
        if in_force is not None:
            extra["composed_with"] = {"table_hash": data["run"]["sts_hash"], "path": data.get("sts_named"),
                                      "temperatures": [float(x) for x in in_force],
                                      "relative": [float(a / b) for a, b in zip(final.temperatures_, in_force)]}
        text = final.to_sglang_json(dataset=f"acceptscope:{db.name}:{run}", label=label, extra=extra)
        check_sglang_sts(text, gamma=gamma)
        atomic_write(out, text)  # a kill or ulimit -f leaves the old table whole
        if json_out:
            emit_json({"out": str(out), "method": method, "label": label, "temperatures": final.temperatures_,
                       "num_samples": final.num_samples_, "held_out": res.to_json()["summary"], "notes": d.notes,
                       "in_force": extra_fits and extra_fits["in-force"]})
            return
        t = Table(title=f"STS held-out comparison (label: {label}; train {res.n_train}, test {res.n_test})")
        for c in ("method", "ECE(15w)", "ECE mass", "ECE debiased", "Brier", "NLL", "AUROC"):
            t.add_column(c)
        for _, r in summ.iterrows():
            t.add_row(f"{r['method']} ({r['stage']})", *(f"{r[c]:.4f}" for c in ("ece", "ece_mass", "ece_debiased", "brier", "nll", "auroc")))
        console.print(t)
        console.print(f"wrote {out}: T = [{', '.join(f'{x:.3f}' for x in final.temperatures_)}] ({method}, {label})")
        if in_force is not None:
            console.print("composed with the table in force (T = [" + ", ".join(f"{x:.3f}" for x in in_force)
                          + "]): the file holds raw-logit temperatures, load it as is", markup=False, highlight=False,
                          soft_wrap=True)
        for note in d.notes:
            console.print("  " + note, markup=False, highlight=False, soft_wrap=True)
