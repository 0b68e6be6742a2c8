#!/usr/bin/env bash
# Install what the `browser` test tier needs: Debian's chromium (driven by the
# playwright *python package* through executable_path=/usr/bin/chromium; no
# browser download) and chromium-driver. Idempotent; needs root for apt-get.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [[ ! -x /usr/bin/chromium ]]; then
  SUDO=""
  [[ "$(id -u)" == 0 ]] || SUDO="sudo"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends chromium chromium-driver \
    fonts-dejavu-core
fi
# the python driver only (never `playwright install`: the browser is Debian's)
if [[ -x "$ROOT/.venv/bin/python" ]]; then
  "$ROOT/.venv/bin/python" -c "import playwright" 2>/dev/null \
    || "$ROOT/.venv/bin/python" -m pip install -q "playwright>=1.45"
fi
/usr/bin/chromium --version
