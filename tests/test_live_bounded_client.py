"""One bounded HTTP client for every request (issue 30, item 6): a gzip bomb is refused at the cap without
decoding it whole, and a body trickled at a byte per interval cannot keep ``live drive`` past --max-seconds."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from acceptscope.live.driver import DriveConfig, Driver
from acceptscope.live.http import ResponseTooLarge, fetch
from acceptscope.domain.workloads import Prompt
from bench.support.hostile_http_server import HostileServer, gzip_bomb

ROOT = Path(__file__).resolve().parents[1]


def test_gzip_bomb_is_refused_at_the_decoded_cap():
    gzip_bomb()  # (made before the clock starts)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with HostileServer({}, default="gzip-bomb") as srv:
        t0 = time.monotonic()
        with pytest.raises(ResponseTooLarge) as e:
            fetch(srv.url + "/generate", method="POST", json={}, deadline_s=30, max_bytes=16 << 20)
        assert time.monotonic() - t0 < 15
        drv = Driver(DriveConfig(base_url=srv.url, run_id="r", max_response_bytes=16 << 20))
        with pytest.raises(ResponseTooLarge):
            drv.send_one(1, Prompt(workload="w", prompt_index=0, text="hi"))
    assert "decoded" in str(e.value)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024  # (ru_maxrss: KiB on Linux)
    assert grown_mb < 200, grown_mb  # a 1 GiB body decoded whole would add ~1 GB


def test_trickled_generate_cannot_outlive_max_seconds(tmp_path):
    with HostileServer({"/generate": ["slow-body"]}, default="slow-body", drip_s=0.5) as srv:
        env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100")
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-c", "from acceptscope.cli import main; main()", "live", "drive",
                            "--url", srv.url, "--db", str(tmp_path / "d.duckdb"), "--run-id", "r", "-w", "gsm8k",
                            "-n", "2", "--max-seconds", "2"], capture_output=True, text=True, env=env, timeout=60)
        took = time.monotonic() - t0
    assert took < 2 + 10, (took, r.stderr)
    assert "Traceback" not in r.stderr
