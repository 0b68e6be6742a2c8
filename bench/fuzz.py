"""Fuzz the ingest parsers with poisoned values; and replay issue 11's hostile inputs and faults.

Not run in CI. Two parts:

``python bench/fuzz.py [--n 10000] [--seed 0]`` -- per parser (every JSON artifact kind, on a real
SGLang-produced fixture), ``--n`` generated cases: one ``"key": <scalar>`` site of the artifact takes
one poisoned JSON value (the families of bench/support/poison_values.py: integers past int64 and int32,
lone surrogate escapes, nesting past the recursion limit, NaN/Infinity, wrong types, huge strings).
Each case asserts (bench.support.poison_values.check): no exception escapes the parser or the Arrow
conversion, the rows lost are at most those of the unit holding the site (line / ring record /
response / document) and come with a reject, every reject is storable text. Each parser runs in
its own child process, whose peak RSS (VmHWM) is reported next to its RSS after imports.

``python bench/fuzz.py --digest OUT --n 600`` -- rows and rejects of poisoned /server_info cases, one line
each, for diffing two code trees (a parser change must not change what hostile input stores).

``python bench/fuzz.py --attacks`` -- the hostile inputs and faults of issue 11 (first round) and of
issue 30 (second round, bench/fuzz_attacks.py), each in a child process, through the real entry points
(``ingest_paths`` into a DuckDB store, ``acceptscope`` processes, the live poller and driver against
misbehaving loopback servers). Prints one table: attack / expected / observed / held or broke, with the
wall time and the peak RSS of the child and of the processes it started, then the counts tried / held /
broke. An attack holds when its own check holds, its processes peaked at <= 1 GB and it ended in time.
``--only SUBSTRING`` runs the attacks whose name contains it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.support.memory import status_mb  # noqa: E402  (one /proc/self/status reader for the benches)
from bench.support.corrupt_db import KINDS  # noqa: E402
from bench import fuzz_attacks  # noqa: E402  (issue 30's second round)


def _rss_mb() -> float:
    return status_mb("VmRSS")


# ---------------------------------------------------------------------------
# part 1: generated cases per parser
# ---------------------------------------------------------------------------
RING_RECORDS = 8  # records kept per rank of the server_info fixture: ~12x less to parse per case


def poison(rng: random.Random) -> str:
    """One poisoned JSON value, drawn from the same families as bench.support.poison_values.poison_text."""
    from bench.support.poison_values import FIXED

    r = rng.random()
    if r < 0.45:
        return rng.choice(FIXED)[1]
    if r < 0.6:
        return str(rng.randint(2**63, 2**200) * rng.choice((1, -1)))
    if r < 0.7:
        return str(rng.randint(2**31, 2**63 - 1))
    if r < 0.85:
        d = rng.randint(65, 6000)
        return "[" * d + "]" * d if rng.random() < 0.5 else '{"a":' * d + "1" + "}" * d
    s = rng.choice(["\\ud800", "\\udbff", "\\udc00", "\\udfff"])
    return f'"x{s}y"'


def fuzz_child(spec_i: int, n: int, seed: int) -> dict:
    from bench.support.poison_values import CASE_SPECS, check, load_case

    kind, name, unit = CASE_SPECS[spec_i]
    case = load_case(kind, name, unit, max_records=RING_RECORDS)  # (server_info: 2 ranks x 8 records, 96 rows)
    rng = random.Random(seed * 1000 + spec_i)
    rss0 = _rss_mb()
    escaped = violations = with_reject = lost_total = lost_max = 0
    first_problem = None
    t0 = time.perf_counter()
    for _ in range(n):
        site = rng.randrange(len(case.sites))
        value = poison(rng)
        try:
            lost, rejects = check(case, site, value)
        except AssertionError as e:
            violations += 1
            first_problem = first_problem or f"contract: {str(e)[:300]}"
            continue
        except BaseException as e:  # noqa: BLE001 - counting is the point
            escaped += 1
            first_problem = first_problem or f"{type(e).__name__}: {str(e)[:300]}"
            continue
        with_reject += rejects > 0
        lost_total += lost
        lost_max = max(lost_max, lost)
    return {"parser": kind, "artifact": name, "unit": unit, "cases": n, "sites": len(case.sites),
            "baseline_rows": case.baseline, "exceptions_escaped": escaped, "contract_violations": violations,
            "cases_with_reject": with_reject, "rows_lost_total": lost_total, "rows_lost_max_per_case": lost_max,
            "seconds": round(time.perf_counter() - t0, 1), "rss_after_imports_mb": round(rss0, 1),
            "peak_rss_mb": round(status_mb("VmHWM"), 1), "first_problem": first_problem}


def run_fuzz(n: int, seed: int) -> list[dict]:
    from bench.support.poison_values import CASE_SPECS

    out = []
    for i in range(len(CASE_SPECS)):
        r = subprocess.run([sys.executable, __file__, "--child-fuzz", str(i), "--n", str(n), "--seed", str(seed)],
                           capture_output=True, text=True, cwd=ROOT)
        if r.returncode != 0:
            raise SystemExit(f"child {i} failed:\n{r.stderr[-3000:]}")
        res = json.loads(r.stdout.strip().splitlines()[-1])
        out.append(res)
        print(json.dumps(res), flush=True)
    return out


# ---------------------------------------------------------------------------
# part 2: issue 11's hostile inputs and faults
# ---------------------------------------------------------------------------
FX = ROOT / "fixtures" / "sglang"


def _ingest_counts(files, db: Path) -> tuple[dict, dict]:
    from acceptscope.ingest import ingest_paths
    from acceptscope.store import Store

    store = Store(db)
    s = ingest_paths(files, store, progress=False)
    return {k: v for k, v in store.counts().items() if v}, s


def _data_rows(counts: dict) -> int:
    return sum(v for k, v in counts.items() if k not in ("rejects", "runs", "gaps"))


def attack_child(name: str, work: Path) -> dict:
    """One attack in this process; returns its row of the table."""
    import re

    work.mkdir(parents=True, exist_ok=True)
    import acceptscope.ingest.server_info  # noqa: F401  (the baseline: what every attack imports anyway)
    import acceptscope.store  # noqa: F401

    rss0 = _rss_mb()
    t0 = time.perf_counter()
    row: dict = {"attack": name}
    later = FX / "compact.server_info.json"
    if name in fuzz_attacks.ATTACKS:
        row.update(fuzz_attacks.run_one(name, work), round=2)
    elif name.startswith("poison:"):  # poison:<artifact>:<key>:<value name>
        _, art, key, vname = name.split(":", 3)
        from bench.support.poison_values import FIXED, replace_site, value_sites

        value = dict(FIXED)[vname]
        text = (FX / art).read_text()
        sites = [m for m in value_sites(text) if m.group(1).startswith(f'"{key}"')]
        bad = work / art
        bad.write_text(replace_site(text, sites[0], value))
        clean, _ = _ingest_counts([FX / art, later], work / "clean.duckdb")
        got, s = _ingest_counts([bad, later], work / "bad.duckdb")
        row.update(files=2, rows_clean=_data_rows(clean), rows_stored=_data_rows(got),
                   rejects=s["rejects"]["count"], exit="ok")
    elif name == "1M {} estimator records":
        f = work / "junk.estimator.jsonl"  # one real record (so it is sniffed as estimator JSONL), then 1M {}
        f.write_bytes((FX / "capacc.estimator.jsonl").read_bytes().split(b"\n")[0] + b"\n" + b"{}\n" * 1_000_000)
        got, s = _ingest_counts([f], work / "x.duckdb")
        row.update(files=1, rows_clean=2, rows_stored=_data_rows(got), rejects=s["rejects"]["count"],
                   rejects_stored=got.get("rejects", 0), file_mb=round(f.stat().st_size / 1e6, 1), exit="ok")
    elif name in ("FIFO named like an artifact", "symlink to /dev/zero"):
        f = work / ("a.server_info.json" if "FIFO" in name else "b.estimator.jsonl")
        if "FIFO" in name:
            os.mkfifo(f)
        else:
            f.symlink_to("/dev/zero")
        clean, _ = _ingest_counts([later], work / "clean.duckdb")
        got, s = _ingest_counts([f, later], work / "x.duckdb")
        row.update(files=2, rows_clean=_data_rows(clean), rows_stored=_data_rows(got), rejects=s["rejects"]["count"],
                   message=s["rejects"]["messages"][0][len(str(work)) + 1:], exit="ok")
    elif name == "artifacts behind a symlinked directory":
        real = work / "real"
        real.mkdir()
        (real / "capacc.estimator.jsonl").write_bytes((FX / "capacc.estimator.jsonl").read_bytes())
        top = work / "top"
        top.mkdir()
        (top / "linked").symlink_to(real, target_is_directory=True)
        clean, _ = _ingest_counts([real], work / "clean.duckdb")
        got, s = _ingest_counts([top], work / "x.duckdb")
        row.update(files=1, rows_clean=_data_rows(clean), rows_stored=_data_rows(got), rejects=s["rejects"]["count"],
                   exit="ok")
    elif name == "duplicate top-level key, empty internal_states":
        text = (FX / "capacc.server_info.json").read_text().rstrip()
        f = work / "dup.server_info.json"
        f.write_text(text[:-1] + ', "internal_states": []}')
        got, s = _ingest_counts([f], work / "x.duckdb")
        row.update(files=1, rows_clean=0, rows_stored=_data_rows(got), rejects=s["rejects"]["count"],
                   message=s["rejects"]["messages"][0].split(": ", 1)[1][:90], exit="ok")
    elif name == "rejected step header (bs = 2**40)":
        text = (FX / "capacc.server_info.json").read_text()
        f = work / "h.server_info.json"
        f.write_text(re.sub(r'("bs":\s*)\d+', lambda m: m.group(1) + str(2**40), text, count=1))
        got, s = _ingest_counts([f], work / "x.duckdb")
        from acceptscope.store import Store

        orphans = Store(work / "x.duckdb", read_only=True).query_arrow(
            "SELECT count(*) FROM request_steps ANTI JOIN steps USING (run_id, rank, epoch, forward_ct)")
        row.update(files=1, rows_clean=840, rows_stored=_data_rows(got), rejects=s["rejects"]["count"],
                   orphans=orphans.column(0)[0].as_py(), exit="ok")
    elif name.startswith("http:"):  # http:<mode>
        from acceptscope.live.poller import ServerInfoPoller
        from bench.support.hostile_http_server import HostileServer, poisoned

        mode = name.split(":", 1)[1]
        body = (FX / "capacc.server_info.json").read_bytes()
        if mode == "poison":
            body = poisoned(body.decode(), "prefix_len", str(2**70))
        got: list = []
        with HostileServer({}, default=mode, body=body, drip_s=0.05) as srv:
            p = ServerInfoPoller(srv.url, "attack", got.append, timeout_s=5.0, max_bytes=256 << 20)
            for _ in range(3):
                p.poll_once()
        rows = sum(len(t.get("request_steps") or []) + len(t.get("steps") or []) for t in got)
        row.update(polls=3, down_polls=p.stats.down_polls, rows_clean=840 if mode == "poison" else 0,
                   rows_stored=rows, rejects=p.stats.rejects, message=(p.stats.last_error or "")[:90], exit="ok")
    elif name.startswith("corrupt db:"):
        from typer.testing import CliRunner

        from acceptscope.cli import app
        from acceptscope.ingest import ingest_paths
        from acceptscope.store import Store
        from bench.support.corrupt_db import corrupt

        kind = name.split(":", 1)[1]
        real = work / "real.duckdb"
        ingest_paths([FX / "capacc.server_info.json"], Store(real), progress=False)
        db = corrupt(kind, real, work / f"{kind}.duckdb")
        codes = []
        for cmd in ("estimate", "report"):
            args = [cmd, "--db", str(db)] + (["--out", str(work / "r.html"), "--no-estimators"] if cmd == "report"
                                             else [])
            r = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
            codes.append(f"{cmd} {r.exit_code}, {len(r.output.strip().splitlines())} line")
        row.update(exit="; ".join(codes))
    else:
        raise SystemExit(f"unknown attack {name!r}")
    row["seconds"] = round(time.perf_counter() - t0, 2)
    row["rss_after_imports_mb"] = round(rss0, 1)
    row["peak_rss_mb"] = round(status_mb("VmHWM"), 1)
    row["children_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
    if "held" not in row:
        row.update(_first_round_verdict(row))
    return row


def _first_round_verdict(row: dict) -> dict:
    """Expected / observed / held for a first-round attack (issue 11): rows kept but for the poisoned unit,
    rejects named; a hostile poll costs that poll; a corrupt database is one line, exit 2, per command."""
    if row["attack"].startswith("corrupt db:"):
        parts = [p.strip() for p in row["exit"].split(";")]
        ok = all(p.split()[1].rstrip(",") in ("1", "2", "3") and p.endswith("1 line") for p in parts)
        return {"expected": "estimate, report: exit != 0 in one line", "observed": row["exit"], "held": ok}
    if row["attack"].startswith("http:"):
        mode = row["attack"].split(":", 1)[1]
        want = 840 if mode == "poison" else 0
        ok = row["rows_stored"] >= want - 7 and (mode == "poison" or row["down_polls"] == 3)
        return {"expected": f"{'all rows but one record' if want else 'the poll refused, counted'}",
                "observed": f"{row['rows_stored']} rows, {row['down_polls']} down polls, {row['rejects']} rejects",
                "held": ok}
    ok = row.get("rows_stored", 0) >= row.get("rows_clean", 0) - 7 and row.get("exit") == "ok"
    return {"expected": f">= {max(row.get('rows_clean', 0) - 7, 0)} rows kept (all but one unit), rejects named",
            "observed": f"{row.get('rows_stored')} rows stored, {row.get('rejects')} rejects", "held": ok}


ATTACKS = (
    [f"poison:{art}:{key}:{v}" for art, key in (("capacc.estimator.jsonl", "fct"), ("capacc.server_info.json",
                                                                                   "prefix_len"),
                                                 ("capacc.generate.json", "prompt_tokens"),
                                                 ("spsprof.records.jsonl", "forward_ct"))
     for v in ("int 2**63", "int 2**70", "lone surrogate", "deep list 5000")]
    + ["1M {} estimator records", "FIFO named like an artifact", "symlink to /dev/zero",
       "artifacts behind a symlinked directory", "duplicate top-level key, empty internal_states",
       "rejected step header (bs = 2**40)"]
    + [f"http:{m}" for m in ("slow-body", "endless-headers", "huge", "huge-declared", "redirect", "poison")]
    + [f"corrupt db:{k}" for k in KINDS]
    + list(fuzz_attacks.ATTACKS)
)
PEAK_MB = 1024  # issue 30: peak memory <= 1 GB under every hostile peer
CHILD_LIMIT_S = 600


def run_attacks(work: Path, only: str | None = None) -> list[dict]:
    import shutil

    out = []
    for i, name in enumerate(ATTACKS):
        if only and only not in name:
            continue
        d = work / f"a{i}"
        shutil.rmtree(d, ignore_errors=True)
        try:
            r = subprocess.run([sys.executable, __file__, "--child-attack", name, "--work", str(d)],
                               capture_output=True, text=True, cwd=ROOT, timeout=CHILD_LIMIT_S)
            failed = None if r.returncode == 0 else f"child failed rc={r.returncode}: {r.stderr.strip()[-300:]}"
        except subprocess.TimeoutExpired:
            failed = f"child still running after {CHILD_LIMIT_S} s"
        if failed:
            res = {"attack": name, "expected": "-", "observed": failed, "held": False}
        else:
            res = json.loads(r.stdout.strip().splitlines()[-1])
            peak = max(res.get("peak_rss_mb", 0), res.get("children_peak_rss_mb", 0))
            if peak > PEAK_MB:
                res.update(held=False, observed=f"{res['observed']}; peak {peak:.0f} MB > {PEAK_MB}")
        out.append(res)
        print(json.dumps(res, default=str), flush=True)
    return out


def print_table(rows: list[dict]) -> None:
    """attack | expected | observed | held/broke, then the counts."""
    print()
    print("| attack | expected | observed | s | peak MB | verdict |")
    print("|---|---|---|---:|---:|---|")
    for r in rows:
        peak = max(r.get("peak_rss_mb", 0), r.get("children_peak_rss_mb", 0))
        cell = lambda t: str(t).replace("|", "/").replace("\n", " ")  # noqa: E731
        print(f"| {cell(r['attack'])} | {cell(r.get('expected', ''))} | {cell(r.get('observed', ''))} | "
              f"{r.get('seconds', '')} | {peak:.0f} | {'held' if r.get('held') else 'BROKE'} |")
    held = sum(bool(r.get("held")) for r in rows)
    print(f"\ntried {len(rows)}, held {held}, broke {len(rows) - held}")


def digest_server_info(n: int, seed: int, out: Path) -> None:
    """Rows (a hash per table, in key order) and rejects (field, reason, raw) of ``n`` poisoned /server_info
    cases, one JSON line each: run it under two code trees and diff the files to see whether a change to
    the parser changed what any hostile input stores."""
    import hashlib

    from acceptscope.ingest.server_info import ServerInfoIngestor
    from bench.support.poison_values import load_case, replace_site

    case = load_case("server_info", "capacc.server_info.json", "record", max_records=RING_RECORDS)
    rng = random.Random(seed)
    order = {"steps": ["rank", "forward_ct"], "request_steps": ["rank", "forward_ct", "rid"]}
    with open(out, "w") as f:
        for i in range(n):
            text = replace_site(case.text, case.sites[rng.randrange(len(case.sites))], poison(rng))
            b = ServerInfoIngestor("fuzz", source="file").feed_bytes(text.encode("utf-8", "surrogatepass"),
                                                                     source="f", line=1)
            b.storable("f", "fuzz")
            rows = {}
            for t in ("runs", "steps", "request_steps", "gaps"):
                if b.n(t):
                    tbl = b.arrow(t)
                    if t in order:
                        tbl = tbl.sort_by([(c, "ascending") for c in order[t]])
                    rows[t] = hashlib.sha1(repr(tbl.to_pylist()).encode("utf-8", "surrogatepass")).hexdigest()[:12]
            rej = sorted((r["field"], r["reason"], repr(r["raw"])[:200]) for r in b.rejects)
            f.write(json.dumps({"case": i, "rows": rows, "rejects": rej, "duplicates": dict(b.duplicates),
                                "rejects_total": b.rejects_total()}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000, help="generated cases per parser")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attacks", action="store_true", help="replay issue 11's hostile inputs and faults instead")
    ap.add_argument("--work", default="/tmp/acceptscope-fuzz", help="scratch folder for --attacks")
    ap.add_argument("--only", default=None, help="with --attacks: only the attacks whose name contains this")
    ap.add_argument("--digest", help="write per-case rows/rejects of --n poisoned /server_info cases to this "
                                     "file (to diff two code trees) instead")
    ap.add_argument("--child-fuzz", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-attack", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child_fuzz is not None:
        print(json.dumps(fuzz_child(a.child_fuzz, a.n, a.seed)))
        return
    if a.child_attack is not None:
        print(json.dumps(attack_child(a.child_attack, Path(a.work))))
        return
    if a.digest:
        digest_server_info(a.n, a.seed, Path(a.digest))
        return
    if a.attacks:
        rows = run_attacks(Path(a.work), a.only)
        print_table(rows)
        return
    res = run_fuzz(a.n, a.seed)
    total = sum(r["cases"] for r in res)
    escaped = sum(r["exceptions_escaped"] for r in res)
    viol = sum(r["contract_violations"] for r in res)
    peak = max(r["peak_rss_mb"] for r in res)
    print(f"{total} cases over {len(res)} parsers: {escaped} exceptions escaped, {viol} contract violations, "
          f"peak RSS {peak:.0f} MB")
    assert escaped == 0 and viol == 0, "a parser broke its contract"
    assert peak < 1024, f"peak RSS {peak:.0f} MB"


if __name__ == "__main__":
    main()
