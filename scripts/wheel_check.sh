#!/usr/bin/env bash
# The wheel on its own: builds the sdist and the wheel (`python -m build`, the wheel from the sdist), installs the
# wheel into a fresh virtual environment under /tmp and, from a directory outside the repository, runs the bundled
# model: `diffuserve generate "What is 27+15?"` must print 42, and `diffuserve serve` on a free loopback port must
# answer one chat request (42 again) and serve the console page at `/`. It does this twice: with the lowest
# `transformers` that pyproject.toml claims (read from it, so the two stay in step), then with the newest.
#   bash scripts/wheel_check.sh        (PYTHON picks the interpreter of the fresh environment; default python3)
# Exits non-zero, saying which check failed, on the first failure.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
work="$(mktemp -d /tmp/diffuserve-wheel.XXXXXX)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "wheel check: FAILED: $*" >&2; exit 1; }

low="$(sed -n 's/^ *"transformers>=\([0-9][0-9.]*\)[",;].*/\1/p' "$repo/pyproject.toml")"
[ -n "$low" ] || fail "no \"transformers>=X\" requirement in pyproject.toml"

echo "== building the sdist and the wheel"
"$PY" -m venv "$work/build-env"
"$work/build-env/bin/python" -m pip install --quiet build
"$work/build-env/bin/python" -m build --outdir "$work/dist" "$repo" >"$work/build.log" 2>&1 \
  || { tail -30 "$work/build.log" >&2; fail "python -m build"; }
wheel="$(ls "$work"/dist/diffuserve-*.whl)"
ls "$work"/dist/diffuserve-*.tar.gz >/dev/null || fail "no sdist in $work/dist"
echo "built $(cd "$work/dist" && ls)"
"$work/build-env/bin/python" - "$wheel" <<'EOF' || fail "the wheel lacks the bundled model or the console"
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
needed = ["diffuserve/assets/default-model/model.safetensors", "diffuserve/assets/default-model/tokenizer.json",
          "diffuserve/assets/default-model/config.json", "diffuserve/server/console/static/console.html"]
missing = [n for n in needed if n not in names]
sys.exit(f"missing from the wheel: {missing}" if missing else 0)
EOF

echo "== a fresh environment: $work/venv"
"$PY" -m venv "$work/venv"
vpy="$work/venv/bin/python"
if command -v nvidia-smi >/dev/null 2>&1; then
  "$vpy" -m pip install --quiet torch
else
  "$vpy" -m pip install --quiet torch==2.13.0  # the CPU build, as scripts/run.sh installs it
fi
"$vpy" -m pip install --quiet "$wheel" "transformers==$low"
mkdir -p "$work/outside" && cd "$work/outside"  # nothing of the repository on the path

free_port() { "$vpy" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# check_serve: starts `diffuserve serve` on a free port, asks one chat question, loads the console, stops it.
check_serve() {
  local port url
  port="$(free_port)"
  url="http://127.0.0.1:$port"
  "$work/venv/bin/diffuserve" serve --host 127.0.0.1 --port "$port" >"$work/serve.log" 2>&1 &
  server_pid=$!
  "$vpy" - "$url" "$server_pid" <<'EOF' || { tail -30 "$work/serve.log" >&2; fail "diffuserve serve"; }
import json, os, sys, time, urllib.request

url, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 180
while True:
    try:
        if urllib.request.urlopen(url + "/health", timeout=5).status == 200:
            break
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit("the server exited before answering /health")
    if time.monotonic() > deadline:
        sys.exit("the server did not answer /health in 180 s")
    time.sleep(0.5)
body = {"model": "default-model", "messages": [{"role": "user", "content": "What is 27+15?"}]}
request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
answer = json.load(urllib.request.urlopen(request, timeout=120))["choices"][0]["message"]["content"]
print(f"POST /v1/chat/completions 'What is 27+15?' -> {answer!r}")
if answer.strip() != "42":
    sys.exit(f"chat answer {answer!r}, expected '42'")
page = urllib.request.urlopen(url + "/", timeout=30)
html = page.read().decode()
print(f"GET / -> {page.status}, {len(html)} bytes")
if page.status != 200 or "<title>diffuserve console</title>" not in html:
    sys.exit(f"console page: status {page.status}, no console title in {html[:200]!r}")
EOF
  kill "$server_pid"
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}

# check_commands LABEL: the three checks on the installed wheel with the transformers now installed.
check_commands() {
  local version answer
  version="$("$vpy" -c 'import transformers; print(transformers.__version__)')"
  echo "== $1: transformers $version, $("$work/venv/bin/diffuserve" --version)"
  answer="$("$work/venv/bin/diffuserve" generate "What is 27+15?" 2>"$work/generate.log")" \
    || { tail -30 "$work/generate.log" >&2; fail "diffuserve generate (transformers $version)"; }
  echo "diffuserve generate 'What is 27+15?' -> $answer"
  [ "$(echo "$answer" | tr -d '[:space:]')" = 42 ] || fail "generate printed '$answer', expected 42"
  check_serve
}

check_commands "lowest claimed (transformers>=$low)"
"$vpy" -m pip install --quiet --upgrade transformers
check_commands "newest"
echo "wheel check: OK"
