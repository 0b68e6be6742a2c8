"""The live capture's HTTP client against a hostile loopback server (issue 11).

Every request has a total deadline (not one per read), a response-size cap and no redirect
following; ``live attach --duration`` is a hard stop; one poisoned value in a polled ring costs
that one record, not the poll.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from acceptscope.cli import app
from acceptscope.live.http import DeadlineExceeded, Redirected, ResponseTooLarge, fetch
from acceptscope.live.poller import ServerInfoPoller
from acceptscope.store import Store
from bench.support.hostile_http_server import HostileServer, poisoned

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sglang" / "capacc.server_info.json"
DEADLINE = 1.0
SLACK = 1.5  # thread start-up and a loaded 2-core box


@pytest.mark.parametrize("mode", ["slow-body", "endless-headers"])
def test_total_deadline_per_request_not_per_read(mode):
    with HostileServer({}, default=mode, drip_s=0.05) as srv:  # a byte every 50 ms: no single read times out
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded) as e:
            fetch(srv.url + "/server_info", deadline_s=DEADLINE)
        took = time.monotonic() - t0
    assert DEADLINE * 0.9 <= took < DEADLINE + SLACK, took
    assert isinstance(e.value, TimeoutError) and "/server_info" in str(e.value)


@pytest.mark.parametrize("mode", ["huge", "huge-declared"])
def test_response_size_cap(mode):
    with HostileServer({}, default=mode) as srv:
        t0 = time.monotonic()
        with pytest.raises(ResponseTooLarge) as e:
            fetch(srv.url + "/server_info", deadline_s=30, max_bytes=4 << 20)
        assert time.monotonic() - t0 < 10
    assert "cap" in str(e.value) and "--max-response-mb" in str(e.value)


def test_redirect_is_reported_as_a_redirect():
    with HostileServer({}, default="redirect") as srv:
        with pytest.raises(Redirected) as e:
            fetch(srv.url + "/server_info", deadline_s=5)
    assert "302" in str(e.value) and "/elsewhere" in str(e.value) and "JSON" not in str(e.value)


def test_poller_counts_hostile_polls_and_goes_on():
    body = FIXTURE.read_bytes()
    plan = {"/server_info": ["redirect", "huge", "slow-body", "ok"]}
    with HostileServer(plan, body=body, drip_s=0.05) as srv:
        got = []
        p = ServerInfoPoller(srv.url, "hostile", got.append, timeout_s=DEADLINE, max_bytes=1 << 20)
        errors = []
        for _ in range(4):
            b = p.poll_once()
            errors.append(p.stats.last_error if b is None else None)
    assert p.stats.down_polls == 3 and p.stats.polls == 1
    assert "Redirected" in errors[0] and "ResponseTooLarge" in errors[1] and "DeadlineExceeded" in errors[2]
    assert sum(len(t.get("request_steps") or []) for t in got) == 720


def test_poisoned_value_in_a_polled_ring_costs_one_record():
    """issue 11: one prefix_len = 2**70 in the ring made every poll store 0 of 720 rows."""
    body = poisoned(FIXTURE.read_text(), "prefix_len", str(2**70))
    with HostileServer({}, default="poison", body=body) as srv:
        got = []
        p = ServerInfoPoller(srv.url, "poison", got.append, timeout_s=10)
        p.poll_once()
    rows = sum(len(t.get("request_steps") or []) for t in got)
    rejects = [r for t in got for r in t.get("rejects") or []]
    assert rows == 719 and len(rejects) == 1
    assert rejects[0]["field"] == "internal_states[0].records[0].reqs[0].prefix_len"
    assert "too large" in rejects[0]["reason"]


def test_attach_duration_is_a_hard_stop(tmp_path):
    """A server that answers the first polls and then trickles forever: `--duration 2` still ends near 2 s,
    with the good polls' rows stored."""
    body = FIXTURE.read_bytes()
    plan = {"/server_info": ["ok", "ok", "slow-body"], "/metrics": ["slow-body"]}
    db = tmp_path / "live.duckdb"
    with HostileServer(plan, body=body, drip_s=0.05) as srv:
        t0 = time.monotonic()
        r = CliRunner().invoke(app, ["live", "attach", "--url", srv.url, "--db", str(db), "--duration", "2",
                                     "--poll-interval", "0.2", "--http-timeout", "60", "--json"])
        took = time.monotonic() - t0
    assert r.exit_code == 0, r.output
    assert took < 2 + 0.5 + 4, took  # duration + grace (25% of it) + start-up and flush
    d = json.loads(r.stdout[r.stdout.index("{"):])
    assert d["polls"]["polls"] >= 1 and d["polls"]["down_polls"] >= 1
    steps = Store(db, read_only=True).query_arrow("SELECT count(*) AS n FROM request_steps").to_pylist()[0]["n"]
    assert steps == 720


def test_attach_whose_every_poll_fails_exits_1_with_rejects(tmp_path):
    """issue 11: under a memory limit every poll ended in MemoryError and the command exited 0."""
    body = FIXTURE.read_bytes()
    plan = {"/server_info": ["ok", "huge"], "/metrics": ["redirect"]}
    db = tmp_path / "live.duckdb"
    with HostileServer(plan, body=body) as srv:
        r = CliRunner().invoke(app, ["live", "attach", "--url", srv.url, "--db", str(db), "--duration", "1",
                                     "--poll-interval", "0.3", "--max-response-mb", "1"], env={"COLUMNS": "80"})
    assert r.exit_code == 1, r.output
    assert "no poll of" in r.output and "ResponseTooLarge" in r.output
    rejects = Store(db, read_only=True).query_arrow("SELECT reason FROM rejects").column(0).to_pylist()
    assert rejects and all(x.startswith("poll refused: ResponseTooLarge") for x in rejects)
