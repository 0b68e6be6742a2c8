"""Issue 30's second round of attacks (faults and hostile peers), for ``bench/fuzz.py --attacks``.

Each attack runs through the real entry points (``acceptscope`` processes, ``ingest_paths`` into a
DuckDB file, the live poller and driver against loopback servers that misbehave on purpose) and
returns what was expected, what was observed and whether it held. ``bench/fuzz.py`` runs each in a
child process and adds its wall time and the peak RSS of the child and of the processes it started.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import msgspec

ROOT = Path(__file__).resolve().parents[1]
FX = ROOT / "fixtures" / "sglang"
PROFILE = ROOT / "fixtures" / "profiles" / "h200-qwen3-8b.1d.json"
HOSTILE_ID = '[/]x[/bold]\x1b]0;pwned\x07\x1b[2J<a href="http://evil.example">x</a>'


def cli(*args: str, limit_fsize: int | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``acceptscope ARGS`` in a child process (optionally under ``ulimit -f``)."""
    pre = ""
    if limit_fsize is not None:
        pre = ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
               f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit_fsize}, {limit_fsize})); ")
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100")
    env.pop("ACCEPTSCOPE_DEBUG", None)
    return subprocess.run([sys.executable, "-c", pre + "from acceptscope.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=timeout, errors="surrogateescape")


def one_line(r: subprocess.CompletedProcess) -> bool:
    return len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def strict_json(text: str) -> bool:
    def refuse(tok):
        raise ValueError(tok)
    try:
        json.loads(text, parse_constant=refuse)
        return True
    except ValueError:
        return False


def fixture_db(work: Path, run_id: str | None = None) -> Path:
    db = work / "f.duckdb"
    args = ["ingest", str(FX / "capacc.server_info.json" if run_id else FX), "--db", str(db)]
    r = cli(*args, *(["--run-id", run_id] if run_id else []))
    assert r.returncode == 0, r.stderr[-500:]
    return db


def _incarnation(path: Path, tag: str, startup: float, seed: int) -> Path:
    from acceptscope.ingest.synth import make_server_info

    doc = make_server_info(ranks=1, n_steps=200, bs=4, gamma=4, seed=seed, startup_time=startup)
    path.write_bytes(msgspec.json.encode(doc).replace(b'"d0-', b'"' + tag.encode() + b'-d0-'))
    return path


def _epochs(db: Path) -> tuple[list[str], int, int]:
    """Incarnation tag per epoch (in epoch order), steps, request-steps without their step header."""
    from acceptscope.store import Store

    st = Store(db, read_only=True)
    tags = st.query_df("SELECT epoch, min(split_part(rid, '-', 1)) AS t, count(DISTINCT split_part(rid, '-', 1)) AS k "
                       "FROM request_steps GROUP BY epoch ORDER BY epoch")
    steps = int(st.query_df("SELECT count(*) AS n FROM steps")["n"].iloc[0])
    orphans = int(st.query_df("SELECT count(*) AS n FROM request_steps ANTI JOIN steps "
                              "USING (run_id, rank, epoch, forward_ct)")["n"].iloc[0])
    return [t if k == 1 else "mixed" for t, k in zip(tags["t"], tags["k"])], steps, orphans


def concurrent_ingest(work: Path, first: str) -> dict:
    files = {"early": _incarnation(work / "a.json", "early", 1000.0, 1),
             "late": _incarnation(work / "b.json", "late", 2000.0, 2)}
    db = work / "s.duckdb"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    second = "late" if first == "early" else "early"
    procs = []
    for who in (first, second):
        procs.append(subprocess.Popen([sys.executable, "-c", "from acceptscope.cli import main; main()", "ingest",
                                       str(files[who]), "--db", str(db), "--json"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        time.sleep(0.05)
    codes = [p.wait(timeout=300) for p in procs]
    tags, steps, orphans = _epochs(db)
    return {"expected": "exit 0, 0; epochs [early, late]; 400 steps; 0 re-pointed",
            "observed": f"exit {codes}; epochs {tags}; {steps} steps; {orphans} re-pointed",
            "held": codes == [0, 0] and tags == ["early", "late"] and steps == 400 and orphans == 0}


def reverse_ingest(work: Path) -> dict:
    from acceptscope.ingest import ingest_paths
    from acceptscope.store import Store

    db = work / "s.duckdb"
    for tag, t, seed in (("late", 2000.0, 2), ("mid", 1500.0, 3), ("early", 1000.0, 1)):
        ingest_paths([_incarnation(work / f"{tag}.json", tag, t, seed)], Store(db), progress=False)
    tags, steps, orphans = _epochs(db)
    return {"expected": "epochs [early, mid, late] (startup order); 600 steps",
            "observed": f"epochs {tags}; {steps} steps; {orphans} re-pointed",
            "held": tags == ["early", "mid", "late"] and steps == 600 and orphans == 0}


class Replay:
    """A loopback server answering ``/server_info`` with ``bodies`` in turn (the last repeats)."""

    def __init__(self, bodies: list[bytes]):
        self.bodies, self.i = bodies, 0
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):  # noqa: N802
                body = outer.bodies[min(outer.i, len(outer.bodies) - 1)]
                outer.i += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.srv.shutdown()
        self.srv.server_close()


def _ring(doc: dict, n: int, reqs_null: bool = False) -> bytes:
    import copy

    out = copy.deepcopy(doc)
    for st in out["internal_states"]:
        st["dspark_info_record"]["records"] = st["dspark_info_record"]["records"][:n]
        if reqs_null:
            for rec in st["dspark_info_record"]["records"]:
                rec["reqs"] = None
    return msgspec.json.encode(out)


def live_polls(work: Path, flips: bool) -> dict:
    from collections import Counter

    import pyarrow as pa

    from acceptscope.ingest.synth import make_server_info
    from acceptscope.live.poller import ServerInfoPoller

    a = make_server_info(ranks=2, n_steps=60, bs=3, gamma=4, seed=1, startup_time=1000.0)
    b = make_server_info(ranks=2, n_steps=60, bs=3, gamma=4, seed=2, startup_time=5000.0)
    b["model_path"], b["port"] = "other/model", 31000
    if flips:
        bodies = [_ring(a, 20), _ring(b, 30), _ring(a, 30), _ring(b, 60), _ring(a, 45), _ring(b, 60), _ring(a, 60)]
    else:
        bodies = [_ring(a, 20), _ring(a, 40, reqs_null=True), _ring(a, 40, reqs_null=True), _ring(a, 60)]
    got: list = []
    with Replay(bodies) as srv:
        p = ServerInfoPoller(srv.url, "r", got.append, timeout_s=10)
        for _ in bodies:
            p.poll_once()
    steps = []
    for t in got:
        v = t.get("steps")
        if v is not None:
            steps.extend(v.to_pylist() if isinstance(v, pa.Table) else v)
    dup = max(Counter((s["rank"], s["epoch"], s["forward_ct"]) for s in steps).values())
    restarts = sum(1 for t in got for g in (t.get("gaps") or []) if g["kind"] == "restart")
    return {"expected": "120 step rows of server A, each once; 0 restarts; bad polls rejected",
            "observed": f"{len(steps)} step rows, max {dup} copies; {restarts} restarts; {p.stats.rejects} rejects"
                        + (f"; {p.stats.identity_changes} identity changes refused" if flips else ""),
            "held": len(steps) == 120 and dup == 1 and restarts == 0 and p.stats.rejects >= (3 if flips else 1)}


def poisoned_identity(work: Path, kind: str) -> dict:
    from acceptscope.ingest import ingest_paths
    from acceptscope.ingest.synth import make_server_info
    from acceptscope.store import Store

    doc = make_server_info(ranks=1, n_steps=20, bs=2, gamma=4, seed=5)
    clean = work / "clean.json"
    clean.write_bytes(msgspec.json.encode(doc))
    rec = doc["internal_states"][0]["dspark_info_record"]["records"][3]
    if kind == "lone surrogate in a rid":
        rec["reqs"][0]["rid"] = "SURR"
        data = msgspec.json.encode(doc).replace(b'"SURR"', b'"a\\ud800b"')
    else:
        if kind == "NaN predicted_step_ms":
            rec["predicted_step_ms"] = 0.123456789
        else:
            req = rec["reqs"][0]
            key = next(k for k in req if "conf" in k)
            req[key] = [0.123456789, *req[key][1:]] if isinstance(req[key], list) else 0.123456789
        data = msgspec.json.encode(doc).replace(b"0.123456789", b"NaN")
    bad = work / "capacc.json"
    bad.write_bytes(data)
    store = Store(work / "s.duckdb")
    ingest_paths([clean], store, progress=False)
    n = store.counts()
    s = ingest_paths([bad], store, progress=False)
    runs = int(store.query_df("SELECT count(*) AS n FROM runs")["n"].iloc[0])
    extra = store.counts()["request_steps"] - n["request_steps"]
    return {"expected": "1 run (the launch fields read), 0 rows stored twice",
            "observed": f"{runs} run(s) {s['runs']}; {extra} extra request-steps",
            "held": runs == 1 and extra == 0}


def killed_write(work: Path, what: str) -> dict:
    """Kill the writer when its temporary file appears (or at a fixed time): the old output stays whole."""
    db = fixture_db(work)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if what == "report":
        out = work / "r.html"
        assert cli("report", "--db", str(db), "--out", str(out)).returncode == 0
        old = out.read_bytes()
        args = ["report", "--db", str(db), "--out", str(out)]
    else:
        out = work / "lake"
        assert cli("export", "--all", "--parquet", str(out), "--db", str(db)).returncode == 0
        old = (out / "_acceptscope_export.json").read_bytes()
        args = ["export", "--all", "--parquet", str(out), "--db", str(db)]
    p = subprocess.Popen([sys.executable, "-c", "from acceptscope.cli import main; main()", *args], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    while p.poll() is None and time.monotonic() - t0 < 120:
        if any(x.name.startswith(".") for x in (work.iterdir() if what == "report" else out.iterdir())):
            break  # the new output is being written: kill now
        time.sleep(0.005)
    p.send_signal(signal.SIGKILL)
    p.wait()
    if what == "report":
        now = out.read_bytes()
        whole = now == old or now.rstrip().endswith(b"</html>")
        return {"expected": "the old report, or the whole new one; never torn",
                "observed": f"{len(now):,} bytes, {'old' if now == old else 'new' if whole else 'TORN'}",
                "held": whole}
    from acceptscope.export import read_export

    rows = {t: read_export(out, t).num_rows for t in ("runs", "steps", "request_steps")}
    man = (out / "_acceptscope_export.json").read_bytes()
    return {"expected": "every partition readable, the manifest parses",
            "observed": f"rows {rows}; manifest {'old' if man == old else 'new'}",
            "held": rows["steps"] > 0 and rows["request_steps"] > 0 and strict_json(man.decode())}


def full_disk(work: Path, what: str) -> dict:
    """``ulimit -f`` (the disk-full path): one line, exit != 0, the old output whole."""
    db = fixture_db(work)
    if what == "report":
        out = work / "r.html"
        args = ["report", "--db", str(db), "--out", str(out)]
    elif what == "calibrate":
        run = json.loads(cli("estimate", "--db", str(db), "--json").stdout)
        rid = next(iter(run))
        out = work / "sts.json"
        args = ["calibrate", "--run", rid, "--db", str(db), "--out", str(out), "--force"]
    else:
        out = work / "lake" / "_acceptscope_export.json"
        args = ["export", "--all", "--parquet", str(out.parent), "--db", str(db)]
    r0 = cli(*args)
    assert r0.returncode == 0, r0.stderr[-300:]
    old = out.read_bytes()
    r = cli(*args, limit_fsize=min(4096, len(old) // 2))  # (an STS table is ~1 KB)
    same = out.read_bytes() == old
    return {"expected": "exit != 0, one line, old output intact",
            "observed": f"exit {r.returncode}, {len(r.stderr.strip().splitlines())} line(s), "
                        f"old output {'intact' if same else 'CHANGED'}",
            "held": r.returncode != 0 and one_line(r) and same}


def remote_path(work: Path) -> dict:
    from acceptscope.ingest.synth import make_server_info

    big = work / "big.sps.json"
    with open(big, "wb") as f:
        f.truncate(2 << 30)  # a sparse 2 GB file at the path the server names
    doc = make_server_info(ranks=1, n_steps=10, bs=2, gamma=4)
    doc["speculative_dspark_sps_table_path"] = str(big)
    d = work / "run"
    d.mkdir()
    (d / "server_info.json").write_bytes(msgspec.json.encode(doc))
    r = cli("ingest", str(d / "server_info.json"), "--db", str(work / "s.duckdb"))
    from acceptscope.store import Store

    h = Store(work / "s.duckdb", read_only=True).query_df("SELECT sps_hash FROM runs")["sps_hash"].iloc[0]
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"expected": "the named file is not read: no sps_hash, small peak",
            "observed": f"exit {r.returncode}; sps_hash {h}; ingest peak {peak:.0f} MB",
            "held": r.returncode == 0 and h is None and peak < 1024}


def http_driver(work: Path, mode: str) -> dict:
    from bench.support.hostile_http_server import HostileServer, gzip_bomb

    if mode == "gzip-bomb":
        gzip_bomb()
    with HostileServer({}, default=mode, drip_s=1.0 if mode == "slow-body" else 0.05) as srv:
        t0 = time.monotonic()
        r = cli("live", "drive", "--url", srv.url, "--db", str(work / "d.duckdb"), "--run-id", "r", "-w", "gsm8k",
                "-n", "2", "--max-seconds", "3", timeout=120)
        took = time.monotonic() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"expected": "ends within --max-seconds 3 + 10 s; peak <= 1 GB; no traceback",
            "observed": f"exit {r.returncode} after {took:.1f} s; peak {peak:.0f} MB",
            "held": took < 13 and peak <= 1024 and "Traceback" not in r.stderr}


def long_run_id(work: Path) -> dict:
    """A 130 KB run id: refused in one line by ingest and live attach, before any file is made."""
    rid = "r" * 130_000
    i = cli("ingest", str(FX / "capacc.server_info.json"), "--db", str(work / "i.duckdb"), "--run-id", rid)
    a = cli("live", "attach", "--url", "http://127.0.0.1:9", "--duration", "1", "--db", str(work / "a.duckdb"),
            "--run-id", rid)
    left = sorted(p.name for p in work.iterdir())
    return {"expected": "ingest and live attach: exit 2 in one short line; no file made",
            "observed": f"exits {i.returncode}, {a.returncode}; lines {len(i.stderr.splitlines())}, "
                        f"{len(a.stderr.splitlines())}; longest {max(len(i.stderr), len(a.stderr)):,} chars; left {left}",
            "held": i.returncode == 2 and a.returncode == 2 and one_line(i) and one_line(a)
                    and max(len(i.stderr), len(a.stderr)) < 1000 and not left}


def hostile_run_id(work: Path, what: str) -> dict:
    rid = {"markup": "[/]x[/bold]", "escape": "r\x1b]0;pwned\x07\x1b[2J", "link": '<a href="http://evil.example">x</a>'}[what]
    db = fixture_db(work, rid)
    out = work / "r.html"
    results = {
        "estimate": cli("estimate", "--db", str(db)),
        "calibrate": cli("calibrate", "--run", rid, "--db", str(db), "--out", str(work / "sts.json"), "--json"),
        "report": cli("report", "--db", str(db), "--out", str(out), "--json"),
        "export": cli("export", "--all", "--parquet", str(work / "lake"), "--db", str(db)),
    }
    codes = {k: r.returncode for k, r in results.items()}
    esc = any("\x1b]0;" in r.stderr + r.stdout or "\x1b[2J" in r.stderr + r.stdout for r in results.values())
    tb = any("Traceback" in r.stderr or "MarkupError" in r.stderr for r in results.values())
    html = out.read_text() if out.exists() else ""
    link = '<a href="http://evil.example"' in html or "\\u003ca href=" in html
    return {"expected": "every command exits 0; no escape sequence, traceback or live link",
            "observed": f"exits {codes}; escapes {esc}; tracebacks {tb}; link in report {link}",
            "held": set(codes.values()) == {0} and not esc and not tb and not link}


def small_runs(work: Path, what: str) -> dict:
    from acceptscope.ingest.synth import make_server_info

    doc = make_server_info(ranks=1, n_steps=6, bs=1, gamma=4, seed=3)
    if what == "report on a run with 0 requests":
        for rec in doc["internal_states"][0]["dspark_info_record"]["records"]:
            rec.update(reqs=[], bs=0, num_running_reqs=0)
    (work / "d.json").write_bytes(msgspec.json.encode(doc))
    db = work / "d.duckdb"
    run = json.loads(cli("ingest", str(work / "d.json"), "--db", str(db), "--json").stdout)["runs"][0]
    if what == "report on a run with 0 requests":
        r = cli("report", "--db", str(db), "--out", str(work / "r.html"), "--json")
        return {"expected": "a report (exit 0), strict JSON", "observed": f"exit {r.returncode}; strict "
                f"{strict_json(r.stdout)}", "held": r.returncode == 0 and strict_json(r.stdout)}
    r = cli("calibrate", "--run", run, "--db", str(db), "--out", str(work / "sts.json"))
    return {"expected": "exit 3 (cannot estimate), one line", "observed": f"exit {r.returncode}, "
            f"{len(r.stderr.strip().splitlines())} line(s)", "held": r.returncode == 3 and one_line(r)}


def strict_outputs(work: Path) -> dict:
    db = fixture_db(work)
    est = cli("estimate", "--db", str(db), "--json")
    rep = cli("report", "--db", str(db), "--out", str(work / "r.html"), "--json")
    rid = next(iter(json.loads(est.stdout)))
    cal = cli("calibrate", "--run", rid, "--db", str(db), "--out", str(work / "s.json"), "--json")
    ok = {k: strict_json(r.stdout) for k, r in (("estimate", est), ("report", rep), ("calibrate", cal))}
    return {"expected": "estimate / report / calibrate --json parse as strict JSON (no NaN)",
            "observed": f"strict {ok}", "held": all(ok.values())}


def unwritable_output(work: Path) -> dict:
    db = fixture_db(work)
    blocker = work / "a-file"
    blocker.write_text("x")
    r = cli("report", "--db", str(db), "--out", str(blocker / "r.html"))
    e = cli("export", "--all", "--parquet", str(blocker / "lake"), "--db", str(db))
    return {"expected": "exit != 0, one line each", "observed": f"report exit {r.returncode} "
            f"({len(r.stderr.strip().splitlines())} line); export exit {e.returncode} "
            f"({len(e.stderr.strip().splitlines())} line)",
            "held": r.returncode != 0 and e.returncode != 0 and one_line(r) and one_line(e)}


def failed_attach(work: Path) -> dict:
    db = work / "attach.duckdb"
    r = cli("live", "attach", "--url", "http://127.0.0.1:9", "--duration", "1", "--db", str(db))
    left = sorted(p.name for p in work.iterdir())
    return {"expected": "exit != 0, no file left", "observed": f"exit {r.returncode}; left {left}",
            "held": r.returncode != 0 and not left}


ATTACKS: dict[str, Callable[[Path], dict]] = {
    "concurrent ingest of 2 incarnations (early first)": lambda w: concurrent_ingest(w, "early"),
    "concurrent ingest of 2 incarnations (late first)": lambda w: concurrent_ingest(w, "late"),
    "sequential ingest in reverse time order": reverse_ingest,
    "live: server identity flips behind the URL": lambda w: live_polls(w, True),
    "live: polls with \"reqs\": null": lambda w: live_polls(w, False),
    "NaN confidence in one record": lambda w: poisoned_identity(w, "NaN confidence"),
    "NaN predicted_step_ms in one record": lambda w: poisoned_identity(w, "NaN predicted_step_ms"),
    "lone surrogate in a rid": lambda w: poisoned_identity(w, "lone surrogate in a rid"),
    "report --out killed while writing": lambda w: killed_write(w, "report"),
    "export --parquet killed during a re-export": lambda w: killed_write(w, "export"),
    "report --out on a full disk (ulimit -f)": lambda w: full_disk(w, "report"),
    "calibrate --out under ulimit -f": lambda w: full_disk(w, "calibrate"),
    "export --parquet under ulimit -f": lambda w: full_disk(w, "export"),
    "server names a local 2 GB SPS table": remote_path,
    "gzip bomb (1 MB -> 1 GiB) on /generate": lambda w: http_driver(w, "gzip-bomb"),
    "/generate body trickled, live drive --max-seconds 3": lambda w: http_driver(w, "slow-body"),
    "run id with rich markup": lambda w: hostile_run_id(w, "markup"),
    "run id with ESC sequences": lambda w: hostile_run_id(w, "escape"),
    "run id with <a href>": lambda w: hostile_run_id(w, "link"),
    "130 KB run id": long_run_id,
    "report on a run with 0 requests": lambda w: small_runs(w, "report on a run with 0 requests"),
    "calibrate on a one-request run": lambda w: small_runs(w, "calibrate on a one-request run"),
    "--json output is strict": strict_outputs,
    "output path that cannot be created": unwritable_output,
    "failed live attach": failed_attach,
}


def run_one(name: str, work: Path) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return ATTACKS[name](work)
