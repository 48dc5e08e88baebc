"""`bench serve` against a live `diffuserve serve` (a subprocess on 127.0.0.1, ephemeral port, tiny model):
closed- and open-loop sweeps over both endpoints finish with zero errors and report every metric."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.bench.conftest import plot_args, pngs
from tests.bench.json_schema import SERVE, validate

pytest.importorskip("httpx")


@pytest.fixture(scope="module")
def server_url(bench_model_dir) -> Iterator[str]:
    command = [
        sys.executable,
        "-m",
        "diffuserve",
        "serve",
        str(bench_model_dir),
        "--port",
        "0",
        "--max-model-len",
        "256",
        "--device",
        "cpu",
    ]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    deadline, url = time.monotonic() + 120, None
    log = []
    while url is None and time.monotonic() < deadline and process.poll() is None:
        line = process.stderr.readline()
        log.append(line)
        if match := re.search(r"Uvicorn running on (http://127\.0\.0\.1:\d+)", line):
            url = match[1]
    if url is None:
        process.kill()
        pytest.fail("diffuserve serve did not start:\n" + "".join(log))
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_serve_sweep(server_url, run_bench, endpoint, tmp_path):
    code, result, text = run_bench(
        [
            "serve",
            "--base-url",
            server_url,
            "--endpoint",
            endpoint,
            "--num-prompts",
            "4",
            "--prompt-words",
            "3",
            "--output-tokens",
            "10",
            "--concurrency",
            "1",
            "3",
            "--request-rate",
            "inf",
            "20",
            *plot_args(tmp_path),
        ]
    )
    assert code == 0
    assert validate(result, SERVE) == []
    assert [(r["load"], r["concurrency"], r["request_rate"]) for r in result["results"]] == [
        ("concurrency", 1, None),
        ("concurrency", 3, None),
        ("poisson", None, "inf"),
        ("poisson", None, 20.0),
    ]
    for point in result["results"]:
        assert point["errors"] == 0 and point["completed"] == 4
        assert point["output_tokens"] == 4 * 10  # ignore_eos was honoured
        assert point["chunk_token_counts"] == "usage"  # the server reports running usage
        for metric in ("ttft_s", "tpot_s", "e2e_s"):
            assert point[metric]["p50"] > 0
    assert "ITL/token" in text
    if plot_args(tmp_path):
        assert pngs(tmp_path) == {"serve_throughput.png", "serve_latency_percentiles.png"}
