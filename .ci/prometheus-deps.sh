#!/usr/bin/env bash
# Install what the Grafana/Prometheus test (tests/test_grafana_prometheus.py) needs, only what is missing, and
# say what it installs: Debian's `prometheus` server (the test starts it on loopback against `acceptscope live
# export-metrics`), and, for the panel screenshot, kaleido (plotly's image export) driving Debian's chromium.
# Idempotent; needs root for apt-get.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
need=()
what=""
command -v prometheus >/dev/null || { need+=(prometheus); what="prometheus (Debian)"; }
[[ -x /usr/bin/chromium ]] || { need+=(chromium fonts-dejavu-core); what="${what:+$what and }chromium with fonts-dejavu-core (the panel screenshot)"; }
if (( ${#need[@]} )); then
  echo "prometheus-deps: installing $what with apt-get for the Grafana test"
  SUDO=""
  [[ "$(id -u)" == 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if [[ -x "$ROOT/.venv/bin/python" ]] && ! "$ROOT/.venv/bin/python" -c "import kaleido" 2>/dev/null; then
  echo "prometheus-deps: installing kaleido into .venv (the panel screenshot)"
  "$ROOT/.venv/bin/python" -m pip install -q "kaleido>=1.0"
fi
echo "prometheus-deps: $(prometheus --version 2>&1 | head -1)"
