#!/usr/bin/env bash
# Sets up a virtual environment in .venv (idempotent) and runs one job in it.
#   bash scripts/run.sh serve [ARGS...]   start the OpenAI-compatible server on the bundled default model
#   bash scripts/run.sh test  [ARGS...]   run the lint, the type check and the test suite (in parallel; ARGS go to
#                                          pytest, e.g. `-n 0` for one process, or test paths)
# On a machine without an NVIDIA GPU the CPU build of PyTorch is installed first, so that the package's
# `torch>=2.4` requirement does not pull a multi-GB CUDA build. `test` also installs Debian's chromium and
# chromium-driver, and firefox-esr, for the web console's browser tests when they are missing and it can (root
# with apt-get); a browser's tests are skipped without it, saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
job="${1:-}"; shift || true
PY="${PYTHON:-python3}"

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
if ! "$VPY" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    "$VPY" -m pip install --quiet torch
  else
    "$VPY" -m pip install --quiet torch==2.13.0
  fi
fi
"$VPY" -m pip install --quiet -e ".[test,plot,docs]"

# install_browser COMMAND PACKAGE...: installs the packages unless COMMAND is already there.
install_browser() {
  local command="$1"; shift
  if command -v "$command" >/dev/null 2>&1; then
    return
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing $* for the browser tests" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; } \
      >/dev/null 2>&1 || echo "could not install $*: its browser tests will be skipped" >&2
  else
    echo "no $command (and no root apt-get to install it): its browser tests will be skipped" >&2
  fi
}

case "$job" in
  serve)
    exec .venv/bin/diffuserve serve "$@"
    ;;
  test)
    install_browser chromedriver chromium chromium-driver
    install_browser firefox-esr firefox-esr
    .venv/bin/ruff check .
    .venv/bin/ruff format --check .
    .venv/bin/mypy diffuserve
    # One worker per core this process may use (pytest-xdist; tests/conftest.py gives each one torch thread; not
    # `-n auto`, which counts physical cores: 1 on a 2-vCPU machine); a file's tests stay on one worker (--dist
    # loadfile), so its module fixtures are built once. The 25 slowest tests and the wall time print.
    workers="$(nproc)"
    if [ "$workers" -lt 2 ]; then workers=0; fi  # one core: no worker processes at all
    status=0
    "$VPY" -m pytest -q -n "$workers" --dist loadfile --durations=25 "$@" || status=$?
    if [ "$status" = 5 ]; then
      echo "pytest collected no test (exit 5): check the selection" >&2
    fi
    exit "$status"
    ;;
  *)
    echo "usage: bash scripts/run.sh serve|test [ARGS...]" >&2
    exit 2
    ;;
esac
