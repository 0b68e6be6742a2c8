#!/usr/bin/env bash
# Install what the `browser` test tier needs, only what is missing, and say what it installs:
# Debian's chromium (driven by the playwright *python package* through
# executable_path=/usr/bin/chromium; no browser download) and chromium-driver. Needs root for apt-get.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [[ -x /usr/bin/chromium ]]; then
  echo "browser-deps: chromium already installed ($(/usr/bin/chromium --version 2>/dev/null | head -1))"
else
  echo "browser-deps: installing chromium, chromium-driver, fonts-dejavu-core with apt-get (browser test tier)"
  SUDO=""
  [[ "$(id -u)" == 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver \
    fonts-dejavu-core >/dev/null
  echo "browser-deps: $(/usr/bin/chromium --version 2>/dev/null | head -1)"
fi
# the python driver only (never `playwright install`: the browser is Debian's)
if [[ -x "$ROOT/.venv/bin/python" ]] && ! "$ROOT/.venv/bin/python" -c "import playwright" 2>/dev/null; then
  echo "browser-deps: installing the playwright python package into .venv"
  "$ROOT/.venv/bin/python" -m pip install -q "playwright>=1.45"
fi
