"""64 concurrent streaming requests through one live server: all complete, each identical to its own result when
it ran alone and non-streamed, and the engine really batched them."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.server.conftest import MODEL_NAME, LiveServer

NUM_REQUESTS = 64


def _requests() -> list[dict[str, Any]]:
    """Completions and chats with varied lengths, greedy and seeded sampling, stop strings and length stops."""
    requests = []
    for i in range(NUM_REQUESTS):
        extra: dict[str, Any] = {"ignore_eos": True} if i % 3 == 0 else {}
        args: dict[str, Any] = {"model": MODEL_NAME, "max_tokens": 4 + 4 * (i % 3), "extra_body": extra}
        if i % 4 == 1:
            args.update(temperature=0.8, seed=i)
        if i % 5 == 2:
            args["stop"] = ["=", "M", "<|x265|>"]
        if i % 2:
            args["messages"] = [{"role": "user", "content": f"question {i}: {'why ' * (i % 5)}?"}]
        else:
            args["prompt"] = f"prompt {i} " + "abc" * (i % 7)
        requests.append(args)
    return requests


async def _run(client, args: dict[str, Any], stream: bool) -> tuple[str, str, int, int]:
    """(text, finish_reason, completion_tokens, num_forwards) of one request."""
    is_chat = "messages" in args
    create = client.chat.completions.create if is_chat else client.completions.create
    if not stream:
        response = await create(**args)
        choice = response.choices[0]
        text = choice.message.content if is_chat else choice.text
        return text, choice.finish_reason, response.usage.completion_tokens, response.usage.num_forwards
    parts, finish_reason, usage = [], None, None
    async for chunk in await create(**args, stream=True, stream_options={"include_usage": True}):
        for choice in chunk.choices:
            parts.append((choice.delta.content if is_chat else choice.text) or "")
            finish_reason = choice.finish_reason or finish_reason
        usage = chunk.usage or usage
    return "".join(parts), finish_reason, usage.completion_tokens, usage.num_forwards


def test_64_concurrent_streams_match_their_sequential_results(live_server: LiveServer):
    requests = _requests()

    async def sequential_then_concurrent():
        async with live_server.async_client() as client:
            alone = [await _run(client, args, stream=False) for args in requests]
            steps_alone = live_server.metric("engine_steps_total")
            together = await asyncio.gather(*(_run(client, args, stream=True) for args in requests))
            return alone, together, steps_alone

    steps_before = live_server.metric("engine_steps_total")
    alone, together, steps_mid = asyncio.run(sequential_then_concurrent())
    steps_concurrent = live_server.metric("engine_steps_total") - steps_mid
    for i, (expected, got) in enumerate(zip(alone, together)):
        assert got == expected, f"request {i}: {requests[i]}"
    assert {finish for _, finish, _, _ in alone} == {"stop", "length"}
    assert steps_concurrent < (steps_mid - steps_before) / 4, "the concurrent requests were not batched"
    assert live_server.metric("kv_cache_usage_perc") == 0
