# Sourced by scripts/setup.sh and .ci/sglang-env.sh: `pip_install PY ARGS...` runs
# `PY -m pip install -q` and drops only one line pip prints per package on machines whose
# pip config lists file:// indexes that lack that package ("WARNING: Location 'file://…' is
# ignored: it is neither a file nor a directory."): ~100 lines per set-up, none of them ours.
# Every other warning and every error still shows, and pip's exit status is kept (pipefail).
pip_install() {
  local py="$1"
  shift
  "$py" -m pip install -q --disable-pip-version-check --progress-bar off "$@" 2>&1 \
    | { grep -v -E "^WARNING: Location 'file://[^']*' is ignored: it is neither a file nor a directory\.$" || true; }
}
