"""`diffuserve serve`'s tokens/s for many concurrent completions answered whole (non-streamed) and streamed, over
loopback HTTP: what the server spends around the engine per request-step (handing outputs to the event loop).

    python scripts/serve_whole.py --concurrency 64 --output-tokens 64 --repeats 3

Starts `python -m diffuserve serve MODEL` (the bundled default model unless `--model`) on a free port, with the
package from the Python path (so `scripts/ab_commits.py --script scripts/serve_whole.py` runs it on two revisions),
then per mode: a warm-up round and `--repeats` rounds of `--concurrency` requests sent at once (temperature 0, the
stop token ignored), the fastest kept. Each mode's rows also carry the engine's outputs phase over its rounds, in
microseconds per generated token, from the server's /metrics (`engine_step_phase_seconds`, `generation_tokens`):
the engine's own work for the mode's outputs, without the noise of the wall clock. Prints a table, then a JSON
line (`rows`: per mode, tokens/s and outputs_us_per_token).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from diffuserve.bench.workload import prepare_model

PROMPT = [(7 * i) % 200 + 10 for i in range(32)]
"""32 token ids: a model without a tokenizer (a random shape) is served too."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model: str | None, port: int, threads: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "diffuserve", "serve", *([model] if model else []), "--port", str(port)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.5)
    server.kill()
    raise RuntimeError("the server did not become healthy within 180 s")


async def one_request(client: httpx.AsyncClient, body: dict) -> int:
    """Sends one completion, read to its end -> its completion tokens."""
    if not body["stream"]:
        response = await client.post("/v1/completions", json=body)
        response.raise_for_status()
        return response.json()["usage"]["completion_tokens"]
    tokens = 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage")
                tokens = usage["completion_tokens"] if usage else tokens
    return tokens


async def one_round(url: str, concurrency: int, body: dict) -> float:
    """Every request sent at once -> tokens/s of the round."""
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=concurrency)) as client:
        started = time.perf_counter()
        tokens = await asyncio.gather(*(one_request(client, body) for _ in range(concurrency)))
        return sum(tokens) / (time.perf_counter() - started)


def counter(url: str, name: str, labels: str = "") -> float:
    """A `diffuserve:` counter's total from /metrics (summed over its series that carry `labels`)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    pattern = rf"diffuserve:{name}_total\{{([^}}]*)\}} (\S+)$"
    return sum(float(m.group(2)) for m in re.finditer(pattern, text, re.M) if labels in m.group(1))


def outputs_phase(url: str) -> tuple[float, float]:
    """(seconds of the engine's outputs phase, tokens generated) so far."""
    return counter(url, "engine_step_phase_seconds", 'phase="outputs"'), counter(url, "generation_tokens")


def fastest_round(url: str, concurrency: int, body: dict, repeats: int) -> float:
    """A warm-up round, then `repeats` rounds -> the fastest one's tokens/s."""
    asyncio.run(one_round(url, concurrency, body))
    return max(asyncio.run(one_round(url, concurrency, body)) for _ in range(repeats))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a model directory or a random shape's name (default: bundled)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json-out", type=Path, default=None, help="also write the JSON line here")
    args = parser.parse_args()
    port = free_port()
    server = start_server(str(prepare_model(args.model)) if args.model else None, port, args.threads)
    rows = []
    try:
        for mode, stream in (("whole", False), ("streamed", True)):
            name = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).json()["data"][0]["id"]
            body = {"model": name, "prompt": PROMPT, "max_tokens": args.output_tokens, "stream": stream}
            body |= {"temperature": 0.0, "ignore_eos": True}
            if stream:
                body["stream_options"] = {"include_usage": True}
            url = f"http://127.0.0.1:{port}"
            before = outputs_phase(url)
            best = fastest_round(url, args.concurrency, body, args.repeats)
            (seconds, tokens), (seconds_before, tokens_before) = outputs_phase(url), before
            per_token = round(1e6 * (seconds - seconds_before) / max(tokens - tokens_before, 1), 2)
            rows.append({"row": mode, "tokens_per_s": round(best, 1), "outputs_us_per_token": per_token})
            print(f"{mode:9} {best:9.1f} tokens/s   outputs phase {per_token:6.2f} us per token")
    finally:
        server.terminate()
        server.wait(30)
    line = json.dumps({"script": "serve_whole", "args": vars(args) | {"json_out": None}, "rows": rows})
    if args.json_out is not None:
        args.json_out.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
