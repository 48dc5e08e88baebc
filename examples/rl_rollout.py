"""An RL rollout loop against `diffuserve serve`: sample n completions per prompt with their logprobs (the
rollouts a trainer scores), load the trainer's new weights from disk (`POST /update_weights_from_disk`, SGLang's
body), sample again, and check that the new weights' greedy output is what the server now serves.

    python examples/rl_rollout.py --base-url http://127.0.0.1:8000 --new-weights /ckpt/step-2 [--check]

`--check` also runs the new checkpoint offline (`diffuserve.LLM`) and compares its greedy output with the
server's. Without --base-url the example is self-contained: it writes two tiny random checkpoints (the "policy"
before and after a training step), serves the first with `diffuserve serve` on a free port, and checks.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
from openai import OpenAI

PROMPTS = ["The capital of France is", "2 + 2 =", "Once upon a time"]


def rollouts(client: OpenAI, model: str, n: int) -> list[list[tuple[str, float]]]:
    """Per prompt: n sampled (completion, sum of its token logprobs)."""
    out = []
    for prompt in PROMPTS:
        reply = client.completions.create(
            model=model, prompt=prompt, n=n, max_tokens=16, temperature=1.0, logprobs=1, seed=0
        )
        out.append([(c.text, sum(c.logprobs.token_logprobs or [])) for c in reply.choices if c.logprobs])
    return out


def greedy(client: OpenAI, model: str) -> list[str]:
    return [
        client.completions.create(model=model, prompt=p, max_tokens=16, temperature=0.0).choices[0].text
        for p in PROMPTS
    ]


def offline_greedy(model_dir: str) -> list[str]:
    from diffuserve import LLM, SamplingParams

    outputs = LLM(model_dir).generate(PROMPTS, SamplingParams(max_tokens=16, temperature=0.0))
    return [o.outputs[0].text for o in outputs]


def rollout_loop(base_url: str, new_weights: str, n: int, check: bool) -> None:
    client = OpenAI(base_url=f"{base_url}/v1", api_key=os.environ.get("DIFFUSERVE_API_KEY", "unused"))
    model = client.models.list().data[0].id
    for i, group in enumerate(rollouts(client, model, n)):
        print(f"before  prompt {i}: " + " | ".join(f"{text!r} ({logprob:.2f})" for text, logprob in group))
    before = greedy(client, model)
    reply = httpx.post(f"{base_url}/update_weights_from_disk", json={"model_path": new_weights}, timeout=600)
    reply.raise_for_status()
    print("update:", reply.json()["message"])
    for i, group in enumerate(rollouts(client, model, n)):
        print(f"after   prompt {i}: " + " | ".join(f"{text!r} ({logprob:.2f})" for text, logprob in group))
    after = greedy(client, model)
    print("greedy changed:", after != before)
    if check:
        assert after == offline_greedy(new_weights), "the server does not serve the new weights' greedy output"
        print("the server serves the new weights' greedy output")


def self_contained(n: int) -> None:
    """Two tiny random checkpoints, a server on the first, the loop to the second."""
    from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint

    with tempfile.TemporaryDirectory() as root:
        config = make_config("sdar-moe-tiny", block_length=4)
        old, new = (write_random_checkpoint(Path(root) / name, config, seed=s, logit_scale=40.0)
                    for name, s in (("step-1", 1), ("step-2", 2)))  # fmt: skip
        command = [sys.executable, "-m", "diffuserve", "serve", str(old), "--port", "0", "--device", "cpu",
                   "--uvicorn-log-level", "info"]  # fmt: skip
        server = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        try:
            rollout_loop(f"http://127.0.0.1:{_port(server)}", str(new), n, check=True)
        finally:
            server.terminate()
            server.wait(60)


def _port(server: subprocess.Popen) -> int:
    """The port uvicorn reports it bound (port 0: any free one)."""
    assert server.stderr is not None
    for line in server.stderr:
        match = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
        if match:
            return int(match.group(1))
    raise SystemExit(f"the server exited with {server.wait()} before listening")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", help="a running server, e.g. http://127.0.0.1:8000 (default: start one)")
    parser.add_argument("--new-weights", help="the checkpoint directory to update to (with --base-url)")
    parser.add_argument("--n", type=int, default=4, help="completions per prompt")
    parser.add_argument("--check", action="store_true", help="compare with the new checkpoint run offline")
    args = parser.parse_args()
    if args.base_url is None:
        self_contained(args.n)
    elif args.new_weights is None:
        parser.error("--new-weights is required with --base-url")
    else:
        rollout_loop(args.base_url.rstrip("/"), args.new_weights, args.n, args.check)
