#!/usr/bin/env bash
# Install what the Grafana/Prometheus test (tests/test_grafana_prometheus.py) needs: Debian's `prometheus`
# server (the test starts it on loopback against `acceptscope live export-metrics`), and, for the panel
# screenshot, kaleido (plotly's image export) driving Debian's chromium. Idempotent; needs root for apt-get.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
need=()
command -v prometheus >/dev/null || need+=(prometheus)
[[ -x /usr/bin/chromium ]] || need+=(chromium fonts-dejavu-core)
if (( ${#need[@]} )); then
  SUDO=""
  [[ "$(id -u)" == 0 ]] || SUDO="sudo"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${need[@]}"
fi
if [[ -x "$ROOT/.venv/bin/python" ]]; then
  "$ROOT/.venv/bin/python" -c "import kaleido" 2>/dev/null || "$ROOT/.venv/bin/python" -m pip install -q "kaleido>=1.0"
fi
prometheus --version 2>&1 | head -1
