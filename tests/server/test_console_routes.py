"""The web console's routes without a browser: the page behind the API key (sign-in, session cookie, its
origin rule), its static files, --no-web-console, /console/config, and the planner routes, whose `plan` must be
the very document `diffuserve plan --json` prints for the same inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path, PurePosixPath

import httpx
import pytest

from diffuserve.cli.serve import ServerConfig
from diffuserve.server.guards import SESSION_COOKIE
from tests.server.conftest import API_KEY, MODEL_NAME, LiveServer

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "diffuserve" / "server" / "console" / "static"


def _signed_in(live_server: LiveServer) -> httpx.Client:
    client = httpx.Client(base_url=live_server.url, timeout=60)
    response = client.post("/console/sign-in", data={"key": API_KEY})
    assert response.status_code == 303 and response.headers["location"] == "/"
    cookie = response.headers["set-cookie"]
    assert f"{SESSION_COOKIE}=" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert API_KEY not in cookie
    return client


def test_the_page_needs_the_key(live_server: LiveServer):
    page = httpx.get(live_server.url + "/")
    assert page.status_code == 200 and 'action="/console/sign-in"' in page.text and "app.js" not in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    for key, problem in (("wrong", "not this server's API key"), ("", "Enter the server's API key")):
        refused = httpx.post(live_server.url + "/console/sign-in", data={"key": key})
        assert refused.status_code == 401 and problem in refused.text and "set-cookie" not in refused.headers
    client = _signed_in(live_server)
    page = client.get("/")
    assert page.status_code == 200 and '<script type="module" src="/console/assets/app.js">' in page.text
    config = client.get("/console/config").json()
    assert config["model"] == MODEL_NAME and config["block_length"] == 4 and config["api_key_required"]
    assert config["max_model_len"] == 192 and config["defaults"]["decoder"] == "threshold"
    assert httpx.get(live_server.url + "/console/config").status_code == 401
    # the bearer key works on the console's API as on the rest
    bearer = {"Authorization": f"Bearer {API_KEY}"}
    assert httpx.get(live_server.url + "/console/config", headers=bearer).status_code == 200


def test_the_session_cookie_works_from_this_origin_only(live_server: LiveServer):
    client = _signed_in(live_server)
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    own = live_server.url
    assert client.post("/v1/chat/completions", json=body, headers={"Origin": own}).status_code == 200
    for origin in ("http://evil.example", own.replace("127.0.0.1", "localhost"), "null"):
        refused = client.post("/v1/chat/completions", json=body, headers={"Origin": origin})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    forged = httpx.get(live_server.url + "/v1/models", cookies={SESSION_COOKIE: "0" * 64})
    assert forged.status_code == 401


def test_static_files(live_server: LiveServer):
    types = {".js": "text/javascript", ".css": "text/css"}
    for path in STATIC.iterdir():
        response = httpx.get(f"{live_server.url}/console/assets/{path.name}")
        if path.suffix == ".html":
            assert response.status_code == 404  # pages only at their own paths
            continue
        assert response.status_code == 200 and response.content == path.read_bytes()
        assert response.headers["content-type"].startswith(types[path.suffix])
    for name in ("missing.js", "..%2Fapp.py", "%2e%2e%2fguards.py"):
        assert httpx.get(f"{live_server.url}/console/assets/{name}").status_code == 404


def test_the_page_fetches_nothing_from_elsewhere():
    """Every URL the page's files name is this server's own (the CSP enforces it in the browser too)."""
    for path in STATIC.iterdir():
        text = path.read_text()
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text, path
        assert 'src="//' not in text and 'href="//' not in text, path  # protocol-relative URLs


def test_package_data_ships_the_page():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["diffuserve"]
    for path in STATIC.iterdir():
        relative = PurePosixPath(path.relative_to(ROOT / "diffuserve").as_posix())
        assert any(relative.match(pattern) for pattern in patterns), f"{relative} is not in package-data"


def test_no_web_console(tiny_model_dir: Path, single_threaded_torch: None):
    server = LiveServer(tiny_model_dir, ServerConfig(no_web_console=True), num_pages=64).start()
    try:
        for path in ("/", "/console/assets/app.js", "/console/config"):
            assert httpx.get(server.url + path).status_code == 404, path
        assert httpx.post(server.url + "/plan", json={"model": "Clover-35B-A3B"}).status_code == 200
    finally:
        server.stop()


def _cli_plan(*flags: str) -> dict:
    command = [sys.executable, "-m", "diffuserve", "plan", *flags, "--json"]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT).stdout)


@pytest.mark.parametrize(
    ("body", "flags"),
    [
        ({"model": "Clover-35B-A3B", "hardware": "H200", "context_length": 131072}, ["--context-length", "131072"]),
        (
            {"model": "LLaDA2.0-flash", "hardware": "H100-SXM", "tensor_parallel_size": 2, "num_gpus": 4,
             "weight_dtype": "fp8", "kv_cache_dtype": "fp8", "concurrency": 8, "context_length": 16384},
            ["--hardware", "H100-SXM", "-tp", "2", "--num-gpus", "4", "--weight-dtype", "fp8",
             "--kv-cache-dtype", "fp8", "--concurrency", "8", "--context-length", "16384"],
        ),
        (
            {"model": "Clover-35B-A3B", "context_length": 32768, "decoder": "verified", "acceptance_rate": 0.5},
            ["--context-length", "32768", "--decoder", "verified", "--acceptance-rate", "0.5"],
        ),
    ],
    ids=["clover-h200-128k", "llada2-flash-tp2-fp8", "clover-verified"],
)  # fmt: skip
def test_plan_route_equals_the_command(live_server: LiveServer, body: dict, flags: list[str]):
    answer = live_server.post("/plan", body).json()
    expected = _cli_plan(body["model"], *flags)
    assert answer["plan"] == expected
    capacity = expected["capacity"]
    assert answer["sequences_that_fit"] == capacity["max_seqs_by_kv"] * capacity["num_replicas"]
    text = subprocess.run(
        [sys.executable, "-m", "diffuserve", "plan", body["model"], *flags], capture_output=True, text=True, cwd=ROOT
    ).stdout.splitlines()
    assert answer["summary"] == text


def test_plan_route_refusals(live_server: LiveServer):
    cases = [
        ({"model": "Clover-35B-A3B", "context_length": 262144}, "context_length", "exceeds"),
        ({"model": "Clover-35B-A3B", "hardware": "RTX-4090"}, None, "does not fit"),
        ({"model": "Clover-35B-A3B", "hardware": "TPU"}, "hardware", "must be one of"),
        ({"model": "/etc"}, "model", "neither a preset"),
        ({"model": "Clover-35B-A3B", "kv_cache_dtype": "int2"}, "kv_cache_dtype", "must be one of"),
        ({"model": "Clover-35B-A3B", "context_lenght": 4096}, "context_lenght", "Extra inputs"),
        ({"model": "Clover-35B-A3B", "decoder": "speculative"}, "decoder", "must be one of"),
        ({"model": "Clover-35B-A3B", "acceptance_rate": 0.5}, None, "plans verified decoding only"),
    ]
    for body, param, words in cases:
        response = live_server.post("/plan", body)
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == param and words in error["message"], error
    assert httpx.post(live_server.url + "/plan", json={"model": "Clover-35B-A3B"}).status_code == 401


def test_plan_the_served_model_and_the_presets(live_server: LiveServer):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    presets = httpx.get(live_server.url + "/plan/presets", headers=headers).json()
    assert "Clover-35B-A3B" in presets["models"] and "H200" in presets["hardware"]
    assert presets["served_model"] == MODEL_NAME and "auto" in presets["kv_cache_dtypes"]
    answer = live_server.post("/plan", {"model": MODEL_NAME, "context_length": 128}).json()
    assert answer["plan"]["workload"]["block_length"] == 4 and answer["sequences_that_fit"] > 0


def test_metrics_count_kv_pages(live_server: LiveServer):
    assert live_server.metric("kv_cache_pages_total") == live_server.engine.pool.num_pages == 1024
    assert live_server.metric("kv_cache_pages_used") == 0
