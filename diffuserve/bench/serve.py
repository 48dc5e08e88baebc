"""`diffuserve bench serve --base-url URL`: a load generator for any OpenAI-compatible server (ours or
another engine's). Streams every response as a client would and records when each content chunk arrived.

Load: a closed-loop sweep (at most N requests in flight) and an open-loop sweep (requests/s, Poisson or evenly
spaced arrivals, `inf` = all at once), over the same seeded prompts. Prompts are text made of common words
(portable across tokenizers and across /v1/completions and /v1/chat/completions); the server's usage reports
the true token counts. Outputs have a fixed length: `ignore_eos` is sent (vLLM, SGLang and diffuserve honour
it). Metric math: serve_metrics.py. Knows nothing of any engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from typing import Any

from diffuserve.bench.environment import environment, load_average
from diffuserve.bench.report import finish, format_table
from diffuserve.bench.serve_metrics import RequestTrace, parse_slos, summarize

WORDS = (
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "are",
    "with",
    "as",
    "by",
    "at",
    "from",
    "that",
    "this",
    "have",
    "not",
    "but",
    "all",
    "can",
    "had",
    "one",
    "time",
    "year",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
)


TURN_SEPARATOR = "\n\n"
ASSISTANT_REPLY = "Go on."


def chat_messages(prompt: str) -> list[dict[str, str]]:
    """One user message, or for a conversation's turns (TURN_SEPARATOR) the turns as user messages, each but the
    last answered by ASSISTANT_REPLY."""
    messages = []
    for turn in prompt.split(TURN_SEPARATOR):
        messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": ASSISTANT_REPLY}]
    return messages[:-1]


def text_prompts(count: int, num_words: int, seed: int) -> list[str]:
    return [" ".join(random.Random(f"{seed}:{i}").choices(WORDS, k=num_words)) for i in range(count)]


def as_conversations(prompts: list[str], prefix_words: int, groups: int, seed: int) -> list[str]:
    """The prompts as `groups` conversations: prompt i is turn i // groups of conversation i % groups, sent after
    that conversation's shared opening (`prefix_words` words) and all its earlier turns (joined by TURN_SEPARATOR;
    on the chat endpoint each turn is a user message, answered by ASSISTANT_REPLY), as a chat client resends the
    history. Each turn's prompt extends the previous one, so a server whose prefix cache restores state only at a
    cached prompt's end (a hybrid model's state snapshot) hits too. The prompts unchanged when `prefix_words` is 0.
    """
    if prefix_words == 0:
        return prompts
    history = [" ".join(random.Random(f"{seed}:prefix:{g}").choices(WORDS, k=prefix_words)) for g in range(groups)]
    result = []
    for i, prompt in enumerate(prompts):
        history[i % groups] = f"{history[i % groups]}{TURN_SEPARATOR}{prompt}"
        result.append(history[i % groups])
    return result


def arrival_offsets(count: int, rate: float, fixed: bool, seed: int) -> list[float]:
    """Send times (s after the start) for `count` requests at `rate`/s: Poisson (exponential gaps) or fixed."""
    if rate == float("inf"):
        return [0.0] * count
    rng, t, offsets = random.Random(seed), 0.0, []
    for _ in range(count):
        offsets.append(t)
        t += 1 / rate if fixed else rng.expovariate(rate)
    return offsets


class Client:
    """One streaming request at a time per call; shares an httpx.AsyncClient."""

    def __init__(self, http: Any, ns: argparse.Namespace, model: str) -> None:
        self.http, self.ns, self.model = http, ns, model
        self.is_chat = ns.endpoint.endswith("chat/completions")

    def body(self, prompt: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.ns.output_tokens,
            "temperature": self.ns.temperature,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if self.is_chat:
            body["messages"] = chat_messages(prompt)
        else:
            body["prompt"] = prompt
        return body

    def _content(self, choice: dict[str, Any]) -> str:
        if self.is_chat:
            return (choice.get("delta") or {}).get("content") or ""
        return choice.get("text") or ""

    async def send(self, prompt: str) -> RequestTrace:
        trace = RequestTrace(sent_at=time.perf_counter())
        try:
            async with self.http.stream("POST", self.ns.endpoint, json=self.body(prompt)) as response:
                if response.status_code != 200:
                    body = (await response.aread()).decode(errors="replace")[:200]
                    trace.error = f"HTTP {response.status_code}: {body}"
                    return trace
                async for line in response.aiter_lines():
                    if self._read_event(line, trace):
                        break
        except Exception as e:  # any transport failure is one failed request, reported with its type
            trace.error = f"{type(e).__name__}: {e}"
            return trace
        trace.done_at = time.perf_counter()
        if trace.error is None and not trace.chunk_times:
            trace.error = "stream ended without content"
        return trace

    def _read_event(self, line: str, trace: RequestTrace) -> bool:
        """Records one SSE line; True at the end of the stream."""
        if not line.startswith("data:"):
            return False
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return True
        event = json.loads(data)
        if "error" in event:
            trace.error = str(event["error"].get("message", event["error"]))
            return True
        usage = event.get("usage") or {}
        if usage:
            trace.output_tokens = usage.get("completion_tokens")
            trace.prompt_tokens = usage.get("prompt_tokens")
            trace.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        text = "".join(self._content(c) for c in event.get("choices") or [])
        if text:
            trace.chunk_times.append(time.perf_counter())
            trace.chunk_chars.append(len(text))
            trace.chunk_usage_tokens.append(usage.get("completion_tokens"))
        return False


async def closed_loop(client: Client, prompts: list[str], concurrency: int) -> list[RequestTrace]:
    queue = list(enumerate(prompts))
    traces: list[RequestTrace | None] = [None] * len(prompts)

    async def worker() -> None:
        while queue:
            i, prompt = queue.pop(0)
            traces[i] = await client.send(prompt)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(prompts)))))
    return [t for t in traces if t is not None]


async def open_loop(client: Client, prompts: list[str], offsets: list[float]) -> list[RequestTrace]:
    start = time.perf_counter()

    async def at(offset: float, prompt: str) -> RequestTrace:
        await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
        return await client.send(prompt)

    return list(await asyncio.gather(*(at(o, p) for o, p in zip(offsets, prompts))))


async def _sweep(ns: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    import httpx

    slos = parse_slos(ns.goodput)
    api_key = ns.api_key or os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = httpx.Timeout(ns.timeout, connect=30.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(
        base_url=ns.base_url.rstrip("/"), headers=headers, timeout=timeout, limits=limits
    ) as http:
        model = ns.model or await _first_model(http)
        client = Client(http, ns, model)
        prompts = text_prompts(ns.num_prompts, ns.prompt_words, ns.seed)
        prompts = as_conversations(prompts, ns.shared_prefix_words, ns.prefix_groups, ns.seed)
        warm = await client.send(text_prompts(1, ns.prompt_words, ns.seed + 1)[0])
        if warm.error:
            raise ValueError(f"base_url: the warm-up request to {ns.base_url}{ns.endpoint} failed: {warm.error}")
        results = []
        for c in ns.concurrency:
            traces = await closed_loop(client, prompts, c)
            results.append({"load": "concurrency", "concurrency": c, "request_rate": None, **summarize(traces, slos)})
        for rate in ns.request_rate:
            traces = await open_loop(client, prompts, arrival_offsets(len(prompts), rate, ns.fixed_rate, ns.seed))
            results.append(
                {
                    "load": "fixed rate" if ns.fixed_rate else "poisson",
                    "concurrency": None,
                    "request_rate": rate if rate != float("inf") else "inf",
                    **summarize(traces, slos),
                }
            )
    return model, results


async def _first_model(http: Any) -> str:
    response = await http.get("/v1/models")
    if response.status_code != 200:
        raise ValueError(f"base_url: GET /v1/models returned {response.status_code}; pass --model")
    return response.json()["data"][0]["id"]


def table(results: list[dict[str, Any]]) -> str:
    headers = [
        "load",
        "conc/rate",
        "ok",
        "err",
        "out tok/s",
        "req/s",
        "goodput/s",
        "TTFT p50 s",
        "TTFT p99 s",
        "TPOT p50 ms",
        "ITL/chunk p50 ms",
        "ITL/token p50 ms",
        "E2E p50 s",
        "E2E p99 s",
        "tok/chunk",
        "prefix hit",
    ]
    rows = [
        [
            r["load"],
            r["concurrency"] or r["request_rate"],
            r["completed"],
            r["errors"],
            r["output_tokens_per_s"],
            r["request_throughput"],
            r["goodput_requests_per_s"],
            r["ttft_s"]["p50"],
            r["ttft_s"]["p99"],
            _ms(r["tpot_s"]["p50"]),
            _ms(r["itl_chunk_s"]["p50"]),
            _ms(r["itl_token_s"]["p50"]),
            r["e2e_s"]["p50"],
            r["e2e_s"]["p99"],
            r["tokens_per_chunk"],
            r["prefix_hit_rate"],
        ]
        for r in results
    ]
    return format_table(headers, rows)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


def run(ns: argparse.Namespace) -> int:
    if not ns.concurrency and not ns.request_rate:
        raise ValueError("concurrency: give at least one --concurrency or --request-rate")
    if ns.shared_prefix_words < 0:
        raise ValueError(f"shared_prefix_words: got {ns.shared_prefix_words}, must be >= 0")
    if any(r <= 0 for r in ns.request_rate):
        raise ValueError(f"request_rate: every rate must be > 0 (inf = all at once), got {ns.request_rate}")
    started_in = environment()  # before the load: its load average is the machine's at the start
    model, results = asyncio.run(_sweep(ns))
    print(table(results))
    finish(
        {
            "bench": "serve",
            "environment": {**started_in, "load_average_end": load_average()},
            "server": {"base_url": ns.base_url, "endpoint": ns.endpoint, "model": model},
            "workload": {
                "num_prompts": ns.num_prompts,
                "prompt_words": ns.prompt_words,
                "output_tokens": ns.output_tokens,
                "shared_prefix_words": ns.shared_prefix_words,
                "prefix_groups": ns.prefix_groups,
                "temperature": ns.temperature,
                "seed": ns.seed,
                "goodput_ms": ns.goodput,
                "concurrency": ns.concurrency,
                "request_rate": [str(r) for r in ns.request_rate],
            },
            "results": results,
        },
        ns.json_out,
        ns.plot,
    )
    return 1 if any(r["errors"] for r in results) else 0
