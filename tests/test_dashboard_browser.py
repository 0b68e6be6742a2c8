"""A real headless Chromium against `acceptscope dashboard` serving a real audit file.

Uses Debian's /usr/bin/chromium driven by the playwright python package
(``executable_path``); never downloads a browser. Install with
``bash .ci/browser-deps.sh``. The screenshot goes to $ACCEPTSCOPE_SCREENSHOT_DIR
(default: the test's tmp dir).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.test_audit import build_audit_db
from tests.test_dashboard_apptest import HEADERS

pytestmark = pytest.mark.browser
CHROMIUM = "/usr/bin/chromium"
CHROME_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: install it with `bash .ci/browser-deps.sh`")
    pytest.importorskip("playwright", reason="the playwright python package is missing (pip install playwright)")
    db, _ = build_audit_db(tmp_path_factory)
    port = _free_port()
    log = tmp_path_factory.mktemp("dash") / "streamlit.log"
    exe = Path(sys.executable).with_name("acceptscope")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from acceptscope.cli import main; main()"]
    with log.open("w") as fh:
        proc = subprocess.Popen([*cmd, "dashboard", "--db", str(db), "--port", str(port)], stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read().strip() == b"ok":
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"dashboard did not come up (rc={proc.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
        yield url, proc
    finally:  # the CLI execs streamlit in its own session: stop that whole process group
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue


def _non_loopback_ipv4() -> str | None:
    """An address of this host other than 127.x (via a UDP 'connect', which sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: routing lookup only
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def test_dashboard_binds_loopback_only(dashboard):
    url, _ = dashboard
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    ip = _non_loopback_ipv4()
    if ip is None:
        pytest.skip("this host has no non-loopback IPv4 address to probe")
    with pytest.raises(OSError):
        socket.create_connection((ip, port), timeout=2).close()


def test_dashboard_renders_in_chromium(dashboard, tmp_path):
    from playwright.sync_api import sync_playwright

    url, _ = dashboard
    shots = Path(os.environ.get("ACCEPTSCOPE_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    shot = shots / "dashboard.png"
    profile = tmp_path / "chromium-profile"
    with sync_playwright() as pw:
        # a fresh profile per test (launch_persistent_context is how playwright takes --user-data-dir)
        ctx = pw.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, headless=True,
                                                    args=CHROME_ARGS, viewport={"width": 1400, "height": 1000})
        try:
            page = ctx.new_page()
            page.goto(url)
            page.wait_for_selector("text=Request drill-down", timeout=60_000)
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 7",
                                   timeout=60_000)
            page.wait_for_function("!document.querySelector('[data-testid=stStatusWidget]')", timeout=30_000)
            assert page.locator("[data-testid=stException]").count() == 0
            headings = [h.inner_text().strip() for h in page.locator("h2").all()]
            for h in HEADERS:
                assert h in headings, headings
            # Streamlit scrolls inside its main container: size the viewport to it for one full picture
            height = page.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
            page.set_viewport_size({"width": 1400, "height": min(int(height) + 50, 12_000)})
            page.wait_for_timeout(1500)
            page.screenshot(path=str(shot), full_page=True)
            # live refresh: the body becomes a fragment that re-probes the file every few seconds
            page.set_viewport_size({"width": 1400, "height": 1000})
            page.get_by_text("live refresh").click()
            page.wait_for_selector("text=· live", timeout=30_000)
            page.wait_for_timeout(4_000)  # at least one timed fragment rerun (refresh every 3 s)
            assert page.locator("[data-testid=stException]").count() == 0
            assert page.locator("h2", has_text="Request drill-down").count() == 1
        finally:
            ctx.close()
    _assert_nontrivial_png(shot)


def _assert_nontrivial_png(path: Path) -> None:
    """Size and pixel variance: a blank or error page fails."""
    import numpy as np
    from PIL import Image

    assert path.stat().st_size > 50_000, path.stat().st_size
    img = np.asarray(Image.open(path).convert("L"), dtype=np.float32)
    assert img.shape[0] > 2000 and img.shape[1] >= 1400, img.shape
    assert img.std() > 10, img.std()
    # many distinct grey levels: plots and text, not a flat colour
    assert len(np.unique(img.astype(np.uint8))) > 64
