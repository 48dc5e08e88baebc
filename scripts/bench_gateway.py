"""`diffuserve bench serve` through a gateway at 1, 2 and 3 replicas of the bundled model, per routing policy, and
once straight to one server (the gateway's overhead is the difference). Each point is its own deployment
(`diffuserve serve --replicas N --gateway G --gateway-policy P --port 0`, stopped with SIGTERM after the load),
so no point starts with another one's prefix cache. The workload is 7 conversations of about 7 turns (each turn
resends the conversation's opening and earlier turns: `--shared-prefix-words`, `--prefix-groups`), and the prefix
hit rate is the servers' own count (usage.prompt_tokens_details.cached_tokens / prompt tokens). Chat, not
completions: the bundled model answers only in its chat format (a raw-text prompt gets special tokens, which
stream no text). Prints one JSON line at the end, the results file of docs/benchmarks/throughput.md "Behind a gateway"
(scripts/render_docs.py --record gateway).

    OMP_NUM_THREADS=1 python scripts/bench_gateway.py > /tmp/gateway.out
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diffuserve.bench.environment import environment, load_average  # noqa: E402
from diffuserve.server.processes import answers, free_ports, stop_all  # noqa: E402

POINTS = [
    ("none", "-", 1),
    ("smg", "round_robin", 1),
    ("smg", "round_robin", 2),
    ("smg", "cache_aware", 2),
    ("smg", "round_robin", 3),
    ("smg", "cache_aware", 3),
    ("smg", "power_of_two", 3),
    ("vllm-router", "cache_aware", 3),
]
"""(gateway, policy, replicas); gateway "none" is one server without a gateway."""


def deployment(gateway: str, policy: str, replicas: int, server_flags: list[str]) -> tuple[subprocess.Popen, str]:
    """The deployment's process and its base URL, once it answers."""
    serve = [sys.executable, "-m", "diffuserve", "serve", "--device", "cpu", *server_flags]
    if gateway == "none":
        port = free_ports(1)[0]
        process = subprocess.Popen([*serve, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        while not answers(url + "/health"):
            assert process.poll() is None, "the server exited"
            time.sleep(0.2)
        return process, url
    command = [*serve, "--port", "0", "--replicas", str(replicas), "--gateway", gateway, "--gateway-policy", policy]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        if match := re.match(r"ready: (\S+)/v1", line):
            threading.Thread(target=process.stdout.read, daemon=True).start()  # drain: the pipe never fills
            return process, match[1]
    raise SystemExit(f"the deployment exited with {process.wait()} before it was ready")


def bench(url: str, ns: argparse.Namespace) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [
            *(sys.executable, "-m", "diffuserve", "bench", "serve", "--base-url", url),
            *("--endpoint", "/v1/chat/completions", "--num-prompts", str(ns.num_prompts)),
            *("--prompt-words", str(ns.prompt_words), "--shared-prefix-words", str(ns.shared_prefix_words)),
            *(
                "--prefix-groups",
                str(ns.prefix_groups),
                "--output-tokens",
                str(ns.output_tokens),
                "--concurrency",
                str(ns.concurrency),
            ),
            *("--json-out", out.name),
        ]
        subprocess.run(command, check=False, stdout=subprocess.DEVNULL)
        return json.loads(Path(out.name).read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--prompt-words", type=int, default=12)
    parser.add_argument("--shared-prefix-words", type=int, default=24)
    parser.add_argument(
        "--prefix-groups",
        type=int,
        default=7,
        help="conversations; prime, so that round robin over 2 or 3 "
        "replicas moves each conversation (with 8 over 2 replicas, conversation c would always land on c %% 2)",
    )
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    ns = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started_in = environment()
    points = []
    for gateway, policy, replicas in POINTS:
        process, url = deployment(gateway, policy, replicas, ["--max-num-seqs", str(ns.max_num_seqs)])
        try:
            result = bench(url, ns)
        finally:
            process.send_signal(signal.SIGTERM)
            stop_all([process], 60, groups=False)
        point = result["results"][0]
        points.append({"gateway": gateway, "policy": policy, "replicas": replicas, **point})
        print(
            f"{gateway} {policy} x{replicas}: {point['output_tokens_per_s']:.1f} tok/s, "
            f"TTFT p50 {point['ttft_s']['p50']:.2f} s, prefix hit {point['prefix_hit_rate']}",
            file=sys.stderr,
        )
    workload = {k: v for k, v in vars(ns).items()}
    final = {
        "bench": "gateway",
        "environment": {**started_in, "load_average_end": load_average()},
        "workload": workload,
        "points": points,
    }
    print(json.dumps(final))
    return 0


if __name__ == "__main__":
    sys.exit(main())
