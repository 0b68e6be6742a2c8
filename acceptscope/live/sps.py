"""SPS (steps-per-second) profiling of a live DSpark server.

Two ways, both ending in the ``sps_profile_*`` tables:

* :class:`SglangProfilerCommand` builds the command line of SGLang's own
  profiler (``python -m sglang.benchmark.dspark_sps_profiler run|fit|all``),
  runs it as a subprocess (it needs sglang installed) and the outputs it
  writes next to ``--out`` (``<stem>.records.jsonl``, ``<stem>.rounds.jsonl``,
  ``<out>.manifest.json``) are ingested.
* :func:`sps_sweep` is acceptscope's own equivalent sweep over HTTP. Per cell
  (per-rank batch size, optional forced budget fraction) it pins
  ``dspark_force_budget_frac``, sends ``bs * ranks`` random-token requests with
  ``ignore_eos``, polls ``/server_info`` until enough steady steps (every rank at
  ``num_running_reqs == bs``) and aborts the load. Unlike SGLang's profiler it
  attributes records to DP ranks through the ingestor's rank fingerprinting
  (the ``internal_states`` list is in arrival order, so list index is not a
  rank), and it does not require ``SGLANG_SIMULATE_ACC_LEN=1.0`` (it records
  the value in the manifest instead). It also writes SGLang-format records /
  rounds JSONL so SGLang's own ``fit`` can be run on them, and a 1-D diagonal
  table in SGLang's ``SpsCostTable`` JSON format.
"""

from __future__ import annotations

import importlib.util
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence


from acceptscope.domain.sps import SpsTable1D, table_from_obj, write_sps
from acceptscope.ingest.batch import IngestBatch
from acceptscope.ingest.server_info import ServerInfoIngestor
from acceptscope.ingest.sps_profile import ingest_profile_file
from acceptscope.live.http import FetchError, fetch
from acceptscope.live.launcher import SGLangUnavailable
from acceptscope.outputs import atomic_file, atomic_write

WARMUP_STEPS = 8
PROFILER_MODULE = "sglang.benchmark.dspark_sps_profiler"


@dataclass
class SglangProfilerCommand:
    """Command line of SGLang 0.5.23's ``dspark_sps_profiler`` (pure data; see ``argv``)."""

    subcommand: str = "all"  # run | fit | all
    base_url: str = ""
    out: str = "dspark_sps.json"
    fracs: Sequence[float] | None = None
    batch_sizes: Sequence[int] | None = None
    max_batch_size: int | None = None
    input_len: int | None = None
    temperature: float | None = None
    min_steady_steps: int | None = None
    min_steady_seconds: float | None = None
    round_timeout: float | None = None
    repeats: int | None = None
    max_batch_tokens: int | None = None
    plot: bool = False
    self_check: bool = True
    python: str = sys.executable

    def argv(self) -> list[str]:
        if self.subcommand not in ("run", "fit", "all"):
            raise ValueError(f"subcommand must be run|fit|all, got {self.subcommand!r}")
        if self.subcommand in ("run", "all") and not self.base_url:
            raise ValueError("the profiler's run needs --base-url of a running DSpark server")
        a = [self.python, "-m", PROFILER_MODULE, self.subcommand, "--out", self.out]
        if self.subcommand in ("run", "all"):
            a += ["--base-url", self.base_url]
            if self.fracs:
                a += ["--fracs", *[str(f) for f in self.fracs]]
            if self.batch_sizes:
                a += ["--batch-size", *[str(b) for b in self.batch_sizes]]
            for flag, v in (("--max-batch-size", self.max_batch_size), ("--input-len", self.input_len),
                            ("--temperature", self.temperature), ("--min-steady-steps", self.min_steady_steps),
                            ("--min-steady-seconds", self.min_steady_seconds), ("--round-timeout", self.round_timeout),
                            ("--repeats", self.repeats)):
                if v is not None:
                    a += [flag, str(v)]
        if self.subcommand in ("fit", "all"):
            if self.max_batch_tokens is not None:
                a += ["--max-batch-tokens", str(self.max_batch_tokens)]
            if not self.self_check:
                a.append("--no-self-check")
            if not self.plot:
                a.append("--no-plot")
        return a

    def outputs(self) -> dict[str, Path]:
        """Where the profiler writes (same naming rule as SGLang's ``out_paths``)."""
        p = Path(self.out).expanduser()
        return {
            "table": p,
            "records": p.with_name(p.stem + ".records.jsonl"),
            "rounds": p.with_name(p.stem + ".rounds.jsonl"),
            "manifest": p.with_name(p.name + ".manifest.json"),
        }

    def run(self, timeout_s: float | None = None, log_path: str | Path | None = None) -> int:
        """Run it (sglang must be importable here); returns the exit code."""
        if importlib.util.find_spec("sglang") is None:
            raise SGLangUnavailable("SGLang's SPS profiler needs sglang installed; use `acceptscope live sps-profile` (own sweep) instead")
        out = open(log_path, "ab") if log_path else None
        try:
            return subprocess.run(self.argv(), stdout=out, stderr=out, timeout=timeout_s).returncode
        finally:
            if out:
                out.close()


# ---------------------------------------------------------------------------
# our own sweep
# ---------------------------------------------------------------------------
@dataclass
class SweepConfig:
    base_url: str
    run_id: str
    batch_sizes: Sequence[int] = (1, 2, 4, 8)  # per DP rank
    fracs: Sequence[float] | None = None
    repeats: int = 1
    input_len: int = 16
    temperature: float = 1.0
    min_steady_steps: int = 32
    round_timeout_s: float = 60.0
    poll_interval_s: float = 0.5
    max_new_tokens: int = 4096
    vocab_low: int = 1000
    vocab_high: int = 20000
    seed: int = 42
    out: str | None = None  # write SGLang-format files next to this table path
    http_timeout_s: float = 60.0


@dataclass
class SweepResult:
    rounds: list[dict] = field(default_factory=list)
    records: int = 0
    record_rows: list[dict] = field(default_factory=list)
    table: dict | None = None
    failures: list[str] = field(default_factory=list)
    manifest: dict = field(default_factory=dict)


def _post(url: str, body: Any, timeout: float) -> Any:
    r = fetch(url, method="POST", json=body, deadline_s=timeout, max_bytes=16 << 20)
    try:
        return r.json()
    except ValueError:
        return r.text


def _set_frac(base: str, frac: float | None, timeout: float) -> None:
    out = _post(base + "/set_internal_state", {"server_args": {"dspark_force_budget_frac": frac}}, timeout)
    outs = out if isinstance(out, list) else [out]
    if not outs or not all(bool(o.get("updated")) if isinstance(o, dict) else bool(o) for o in outs):
        raise RuntimeError(f"server refused dspark_force_budget_frac={frac}: {out}")


def diagonal_table(rounds: Sequence[dict]) -> dict | None:
    """SGLang's 1-D ``SpsCostTable`` JSON from diagonal rounds (median SPS per batch_tokens)."""
    by: dict[int, list[float]] = {}
    for r in rounds:
        if r["frac"] is None:
            by.setdefault(int(r["batch_tokens"]), []).append(float(r["steps_per_sec"]))
    if not by:
        return None
    probes = sorted(by)
    # through the one SPS model: a table SGLang would refuse raises here, not at server start
    table = SpsTable1D(probes, [statistics.median(by[p]) for p in probes], probes[-1])
    return json.loads(table.to_json())


def sps_sweep(cfg: SweepConfig, sink: Callable[[dict[str, Any]], None],
              progress: Callable[[str], None] | None = None) -> SweepResult:
    """Profile step time per (bs, frac) cell over HTTP; rows go to ``sink`` (sps_profile_* tables)."""

    base = cfg.base_url.rstrip("/")
    say = progress or (lambda m: None)
    res = SweepResult()
    info = fetch(base + "/server_info", deadline_s=cfg.http_timeout_s).json()
    states = info.get("internal_states") or []
    dumps = [st.get("dspark_info_record") for st in states if isinstance(st, dict)]
    if info.get("speculative_algorithm") != "DSPARK" or not dumps or not all(dumps):
        raise RuntimeError(f"{base}: not a DSpark server with the info dump on every rank")
    comps = set(dumps[0].get("components") or [])
    if not {"core", "step_cpu_time"} <= comps:
        raise RuntimeError(f"{base}: info dump components {sorted(comps)} lack core,step_cpu_time "
                           "(SGLANG_DSPARK_ENABLE_SPS_RECORD=1)")
    modes = {d.get("mode") for d in dumps}
    if cfg.fracs and not modes <= {"compact", "cap-accept"}:
        raise RuntimeError(f"{base}: forced-budget (off-diagonal) cells need compact or cap-accept, server runs {modes}")
    vndt = int(dumps[0]["verify_num_draft_tokens"])
    ranks = len(states)
    ing = ServerInfoIngestor(cfg.run_id, "live")
    ing.feed(info, source=base + "/server_info", line=0)  # watermarks: older records are not this sweep's
    rng = random.Random(cfg.seed)
    cells = [(rep, bs, frac) for rep in range(cfg.repeats) for bs in cfg.batch_sizes for frac in (cfg.fracs or [None])]
    poll_no = 1
    try:
        for rep, bs, frac in cells:
            say(f"cell repeat={rep} bs/rank={bs} frac={frac}")
            if cfg.fracs:
                _set_frac(base, frac, cfg.http_timeout_s)
            try:
                _post(base + "/flush_cache", None, cfg.http_timeout_s)
            except FetchError:
                pass
            n_req = bs * ranks
            body = {"input_ids": [[rng.randrange(cfg.vocab_low, cfg.vocab_high) for _ in range(cfg.input_len)] for _ in range(n_req)],
                    "sampling_params": {"temperature": cfg.temperature, "max_new_tokens": cfg.max_new_tokens, "ignore_eos": True},
                    "stream": False}
            load = threading.Thread(target=lambda: _quiet_post(base + "/generate", body, cfg.round_timeout_s + 60), daemon=True)
            t0 = time.monotonic()
            load.start()
            rows: list[dict] = []
            reached = False
            while time.monotonic() - t0 < cfg.round_timeout_s:
                time.sleep(cfg.poll_interval_s)
                try:
                    payload = fetch(base + "/server_info", deadline_s=cfg.http_timeout_s).json()
                except (FetchError, ValueError, RecursionError):
                    continue
                batch = ing.feed(payload, source=base + "/server_info", line=poll_no)
                poll_no += 1
                rows.extend(batch.rows("steps"))
                if _steady(rows, bs, ranks) >= WARMUP_STEPS + cfg.min_steady_steps:
                    reached = True
                    break
            _post(base + "/abort_request", {"abort_all": True}, cfg.http_timeout_s)
            load.join(timeout=30)
            # the steps between the last poll and the abort belong to this cell, not the next one
            try:
                payload = fetch(base + "/server_info", deadline_s=cfg.http_timeout_s).json()
                rows.extend(ing.feed(payload, source=base + "/server_info", line=poll_no).rows("steps"))
                poll_no += 1
            except (FetchError, ValueError, RecursionError):
                res.failures.append(f"repeat={rep} bs/rank={bs} frac={frac}: closing poll failed; "
                                    "the next cell may start with this cell's last steps")
            wall = time.monotonic() - t0
            rnd, recs = _summarise(cfg, rows, rep, bs, frac, ranks, vndt)
            if rnd is None:
                res.failures.append(f"repeat={rep} bs/rank={bs} frac={frac}: too few aligned steps with step_cpu_ms")
                continue
            rnd["load_info"] = {"num_requests": n_req, "max_new_tokens": cfg.max_new_tokens,
                                "wall_seconds": round(wall, 3), "reached_target": reached}
            res.rounds.append(rnd)
            res.records += len(recs)
            if cfg.out:
                res.record_rows.extend(recs)
            sink({"sps_profile_records": recs, "sps_profile_rounds": [_round_row(cfg.run_id, rnd)]})
    finally:
        if cfg.fracs:
            try:
                _set_frac(base, None, cfg.http_timeout_s)
            except (FetchError, RuntimeError):
                res.failures.append("could not reset dspark_force_budget_frac to null")
    try:
        res.table = diagonal_table(res.rounds)
    except ValueError as e:
        res.failures.append(f"1-D SPS table: {e}")
    res.manifest = {
        "base_url": base, "dp_ranks": ranks, "tp_size": info.get("tp_size"), "dp_size": info.get("dp_size"),
        "verify_num_draft_tokens": vndt, "simulate_acc_len": dumps[0].get("simulate_acc_len"),
        "modes": sorted(m for m in modes if m), "batch_size_per_rank_sweep": list(cfg.batch_sizes),
        "fracs": list(cfg.fracs) if cfg.fracs else None, "repeats": cfg.repeats,
        "settings": {k: v for k, v in asdict(cfg).items() if k not in ("base_url", "run_id")},
        "rank_attribution": "acceptscope ServerInfoIngestor fingerprints (not list index)",
        "round_summaries": res.rounds, "failures": res.failures,
    }
    src = cfg.out or f"{base}#sps_sweep"
    sink({"sps_profile_manifests": [{
        "run_id": cfg.run_id, "source_path": src + ".manifest.json" if cfg.out else src,
        "verify_num_draft_tokens": vndt, "tp_size": info.get("tp_size"), "dp_size": ranks,
        "body_json": json.dumps(res.manifest, default=str),
    }]})
    if cfg.out:
        _write_sglang_files(cfg.out, res)
    return res


def _quiet_post(url: str, body: Any, timeout: float) -> None:
    """The load of one cell (its answer is not read): bounded like every request, so the thread ends by ``timeout``."""
    try:
        fetch(url, method="POST", json=body, deadline_s=timeout, max_bytes=64 << 20)
    except FetchError:
        pass  # aborted load batches may end without a clean response


def _steady(rows: list[dict], bs: int, ranks: int) -> int:
    """Steps at full batch on every rank with a CPU step time (common forward_ct when ranks align)."""
    per: dict[int, set[int]] = {}
    for r in rows:
        if r.get("num_running_reqs") == bs and r.get("step_cpu_ms") is not None:
            per.setdefault(r["rank"], set()).add(r["forward_ct"])
    if len(per) < ranks:
        return 0
    common = set.intersection(*per.values())
    return len(common) if common else min(len(v) for v in per.values())


def _summarise(cfg: SweepConfig, rows: list[dict], rep: int, bs: int, frac: float | None, ranks: int, vndt: int):
    full = [r for r in rows if r.get("num_running_reqs") == bs and r.get("step_cpu_ms") is not None]
    per: dict[int, list[dict]] = {}
    for r in full:
        per.setdefault(r["rank"], []).append(r)
    if len(per) < ranks or any(len(v) <= WARMUP_STEPS for v in per.values()):
        return None, []
    steady = {k: sorted(v, key=lambda r: r["forward_ct"])[WARMUP_STEPS:] for k, v in per.items()}
    common = set.intersection(*[{r["forward_ct"] for r in v} for v in steady.values()])
    if common:  # lockstep ranks (DP attention): mean across ranks per step, then the median
        by = {k: {r["forward_ct"]: r for r in v} for k, v in steady.items()}
        per_step = [statistics.fmean(by[k][c]["step_cpu_ms"] for k in by) / 1e3 for c in sorted(common)]
    else:  # independent ranks: pool the steps
        per_step = [r["step_cpu_ms"] / 1e3 for v in steady.values() for r in v]
    med = statistics.median(per_step)
    window = [r for r in rows if r["rank"] in steady and r.get("num_running_reqs") is not None]
    lo = min(r["forward_ct"] for v in steady.values() for r in v)
    hi = max(r["forward_ct"] for v in steady.values() for r in v)
    inside = [r for r in window if lo <= r["forward_ct"] <= hi]
    match = sum(1 for r in inside if r["num_running_reqs"] == bs) / max(1, len(inside))
    batch_tokens = bs * vndt if frac is None else bs + int(frac * bs * (vndt - 1))
    rnd = {
        "repeat": rep, "batch_size": bs * ranks, "batch_size_per_rank": bs, "frac": frac,
        "batch_tokens": batch_tokens, "steps_per_sec": 1.0 / med, "num_steady_steps": len(per_step),
        "match_fraction": match,
        "per_rank_median_step_time": [statistics.median(r["step_cpu_ms"] / 1e3 for r in steady[k]) for k in sorted(steady)],
    }
    recs = [{
        "run_id": cfg.run_id, "repeat": rep, "batch_size": bs * ranks, "batch_size_per_rank": bs, "frac": frac,
        "dp_rank": r["rank"], "forward_ct": r["forward_ct"], "num_running_reqs": r["num_running_reqs"],
        "num_verify_tokens": r.get("num_verify_tokens"),
        "step_time_s": None if r.get("step_cpu_ms") is None else r["step_cpu_ms"] / 1e3,
    } for r in rows]
    return rnd, recs


def _round_row(run_id: str, rnd: dict) -> dict:
    return {
        "run_id": run_id, "repeat": rnd["repeat"], "batch_size": rnd["batch_size"],
        "batch_size_per_rank": rnd["batch_size_per_rank"], "frac": -1.0 if rnd["frac"] is None else rnd["frac"],
        "batch_tokens": rnd["batch_tokens"], "steps_per_sec": rnd["steps_per_sec"],
        "num_steady_steps": rnd["num_steady_steps"], "match_fraction": rnd["match_fraction"],
        "per_rank_median_step_time": rnd["per_rank_median_step_time"],
        "load_info_json": json.dumps(rnd.get("load_info")),
    }


def ingest_profiler_outputs(out: str | Path, run_id: str):
    """Parse the files SGLang's profiler (or our sweep) wrote next to ``out`` (ingest package parsers)."""

    paths = SglangProfilerCommand(out=str(out)).outputs()
    batch = IngestBatch()
    for key, kind in (("records", "sps_profile_records"), ("rounds", "sps_profile_rounds"), ("manifest", "sps_profile_manifest")):
        if paths[key].exists():
            batch.merge(ingest_profile_file(paths[key], kind, run_id=run_id))
    return batch


def _write_sglang_files(out: str, res: SweepResult) -> None:
    cmd = SglangProfilerCommand(out=out)
    paths = cmd.outputs()
    paths["table"].parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(paths["records"]) as f:  # SGLang keeps only records with a CPU step time
        for r in res.record_rows:
            if r["step_time_s"] is not None and r["num_verify_tokens"] is not None and r["num_running_reqs"] is not None:
                f.write(json.dumps({k: r[k] for k in ("repeat", "batch_size", "batch_size_per_rank", "dp_rank", "forward_ct",
                                                      "num_running_reqs", "num_verify_tokens")}
                                   | {"step_time": r["step_time_s"]}) + "\n")
    with atomic_file(paths["rounds"]) as f:
        for r in res.rounds:
            f.write(json.dumps(r) + "\n")
    atomic_write(paths["manifest"], json.dumps(res.manifest, indent=2, default=str) + "\n")  # last: it says the rest is whole
    if res.table is not None:
        write_sps(table_from_obj(res.table, "diagonal"), paths["table"])  # SGLang's byte convention
