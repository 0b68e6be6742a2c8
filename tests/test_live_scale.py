"""Runs from many servers (TP, DP attention, two nodes behind a router) land in one hive Parquet layout DuckDB reads."""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import duckdb
import requests

from acceptscope.export import duckdb_source, export_parquet
from acceptscope.live.driver import DriveConfig, Driver, load_prompts
from acceptscope.live.session import CaptureConfig, LiveCapture, capture
from acceptscope.store import Store
from tests.fake_sglang_server import FakeConfig, FakeSGLangServer


TABLES = ["runs", "steps", "request_steps", "requests", "gaps"]


class _Router:
    """A minimal round-robin loopback router in front of several servers (like sglang-router for /generate)."""

    def __init__(self, backends):
        cycle = itertools.cycle(backends)
        lock = threading.Lock()

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    target = next(cycle)
                r = requests.post(target + self.path, data=body, headers={"Content-Type": "application/json"}, timeout=60)
                self.send_response(r.status_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_many_servers_one_parquet_layout(tmp_path):
    group = "fleet-1"
    drive = dict(concurrency=(4,), max_new_tokens=16, temperature=0.7, loopback_only=True)
    prompts = load_prompts("gsm8k,mt-bench", 8)
    root = tmp_path / "lake"
    per_db_counts = {}
    cfg_common = dict(audit_group=group, poll_interval_s=0.1, scrape_metrics=False, loopback_only=True)
    # node A: TP=2 (one scheduler per TP group -> one rank); node B: DP attention, 4 ranks answering in shuffled order
    with FakeSGLangServer(FakeConfig(mode="compact", gamma=4, tp_size=2, seed=1)) as a, \
         FakeSGLangServer(FakeConfig(mode="compact", gamma=4, dp_ranks=4, attn_dp=True, shuffle_ranks=True, seed=2)) as b:
        for name, srv in (("tp2", a), ("dpattn4", b)):
            store = Store(tmp_path / f"{name}.duckdb")  # each machine captures into its own file
            capture(store, CaptureConfig(base_url=srv.url, run_id=f"{group}-{name}", **cfg_common), prompts,
                    DriveConfig(base_url=srv.url, run_id="", **drive))
            export_parquet(store, None, root, tables=TABLES)
            per_db_counts[name] = store.counts()
    # nodes C and D behind a router: traffic goes to the router, each node is captured directly
    with FakeSGLangServer(FakeConfig(mode="compact", gamma=4, seed=3)) as c, \
         FakeSGLangServer(FakeConfig(mode="compact", gamma=4, seed=4)) as d, _Router([c.url, d.url]) as router:
        stores = {n: Store(tmp_path / f"{n}.duckdb") for n in ("nodeC", "nodeD")}
        caps = [LiveCapture(stores[n], CaptureConfig(base_url=s.url, run_id=f"{group}-{n}", **cfg_common)).start()
                for n, s in (("nodeC", c), ("nodeD", d))]
        rows = Driver(DriveConfig(base_url=router.url, run_id=f"{group}-router", **drive)).run(prompts).rows
        for cap in caps:
            cap.stop()
        stores["nodeC"].append({"requests": rows})  # the client side is recorded once, under the router run
        for n, st in stores.items():
            export_parquet(st, None, root, tables=TABLES)
            per_db_counts[n] = st.counts()

    # one machine, one DuckDB query over the whole layout
    con = duckdb.connect()
    parts = con.execute(f"SELECT run_id, rank, count(*) FROM {duckdb_source(root, 'steps')} GROUP BY ALL ORDER BY ALL").fetchall()
    ranks = {}
    for run_id, rank, _ in parts:
        ranks.setdefault(run_id, set()).add(rank)
    assert ranks == {f"{group}-tp2": {0}, f"{group}-dpattn4": {0, 1, 2, 3}, f"{group}-nodeC": {0}, f"{group}-nodeD": {0}}
    for table in ("steps", "request_steps"):
        total = con.execute(f"SELECT count(*) FROM {duckdb_source(root, table)}").fetchone()[0]
        assert total == sum(c[table] for c in per_db_counts.values())
    # the directory layout is hive: table/run_id=<id>/rank=<r>/*.parquet (what Spark's reader expects too)
    assert sorted(p.name for p in (root / "steps").iterdir()) == sorted(f"run_id={r}" for r in ranks)
    assert sorted(p.name for p in (root / "steps" / f"run_id={group}-dpattn4").iterdir()) == [f"rank={i}" for i in range(4)]
    # router traffic: requests are keyed by rid, which the nodes echo in their telemetry
    joined = con.execute(f"""
        SELECT q.run_id AS client_run, s.run_id AS node_run, count(DISTINCT q.rid)
        FROM {duckdb_source(root, 'requests')} q JOIN {duckdb_source(root, 'request_steps')} s USING (rid)
        WHERE q.run_id = '{group}-router' GROUP BY ALL ORDER BY ALL""").fetchall()
    assert {r[1] for r in joined} == {f"{group}-nodeC", f"{group}-nodeD"} and sum(r[2] for r in joined) == len(rows) == 8
    runs = con.execute(f"SELECT DISTINCT audit_group FROM {duckdb_source(root, 'runs')}").fetchall()
    assert runs == [(group,)]
    manifest = json.loads((root / "_acceptscope_export.json").read_text())
    assert len(manifest["exports"]) == 4
