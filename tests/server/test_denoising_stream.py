"""The denoising stream extension (`stream_options.include_denoising`): absent unless asked (the openai client
sees the stream it always saw), present when asked, read with a raw SSE reader. The steps are checked against
what the server reports by other means: one step per forward (usage.num_forwards), and the last write of every
position, replayed, is the answer the stream's text deltas spell."""

from __future__ import annotations

from typing import Any

import httpx

from tests.server.conftest import API_KEY, MODEL_NAME, LiveServer, sse_events

MESSAGES = [{"role": "user", "content": "Once upon 3"}]
FREE = {"ignore_eos": True}


def _stream(live_server: LiveServer, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.stream("POST", live_server.url + path, json=body, headers=headers, timeout=120) as response:
        assert response.status_code == 200, response.read()
        events = list(sse_events(response))
    assert events[-1] == "[DONE]"
    return [e for e in events if isinstance(e, dict)]


def _replay(steps: list[dict[str, Any]]) -> dict[int, int]:
    """Output position -> the token its last write left there."""
    final: dict[int, int] = {}
    for step in steps:
        assert len(step["positions"]) == len(step["token_ids"]) == len(step["tokens"])
        assert all(step["block_start"] <= p < step["block_end"] for p in step["positions"])
        final.update(zip(step["positions"], step["token_ids"]))
    return final


def test_openai_client_sees_no_denoising_unless_asked(live_server: LiveServer):
    client = live_server.client()
    args = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 12, "extra_body": FREE}
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert all("denoising" not in (chunk.model_extra or {}) for chunk in chunks)
    assert all(chunk.choices for chunk in chunks[:-1])  # only the usage chunk has no choices
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks[:-1])
    assert text == client.chat.completions.create(**args).choices[0].message.content


def test_openai_client_reads_the_extension_when_asked(live_server: LiveServer):
    client = live_server.client()
    options: Any = {"include_usage": True, "include_denoising": True}  # an extension: not in the client's types
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME, messages=MESSAGES, max_tokens=12, extra_body=FREE, stream=True, stream_options=options
        )
    )
    denoising = [chunk for chunk in chunks if chunk.model_extra and "denoising" in chunk.model_extra]
    assert denoising and all(chunk.choices == [] for chunk in denoising)
    steps = [step for chunk in denoising for step in chunk.model_extra["denoising"]]
    assert len(steps) == chunks[-1].usage.num_forwards


def test_raw_sse_chat_steps_spell_the_answer(live_server: LiveServer):
    body = {
        "model": MODEL_NAME,
        "messages": MESSAGES,
        "max_tokens": 14,
        "stream": True,
        "stream_options": {"include_usage": True, "include_denoising": True},
        **FREE,
    }
    events = _stream(live_server, "/v1/chat/completions", body)
    steps = [step for e in events for step in e.get("denoising", [])]
    assert all(e["choices"] == [] for e in events if "denoising" in e)
    usage = events[-1]["usage"]
    assert len(steps) == usage["num_forwards"] and {s["index"] for s in steps} == {0}
    final = _replay(steps)
    answer = [final[p] for p in range(usage["completion_tokens"])]
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    detokenized = live_server.post("/detokenize", {"tokens": answer}).json()["prompt"]
    assert detokenized == text
    # a step's number counts up within its block; every block starts at step 1
    for previous, step in zip(steps, steps[1:]):
        assert step["step"] == (previous["step"] + 1 if step["block"] == previous["block"] else 1)


def test_raw_sse_completions_with_two_choices(live_server: LiveServer):
    body = {
        "model": MODEL_NAME,
        "prompt": "Once upon 4",
        "max_tokens": 10,
        "n": 2,
        "temperature": 0.8,
        "seed": 3,
        "stream": True,
        "stream_options": {"include_denoising": True},
        **FREE,
    }
    events = _stream(live_server, "/v1/completions", body)
    steps = [step for e in events for step in e.get("denoising", [])]
    texts = {0: "", 1: ""}
    for e in events:
        for choice in e["choices"]:
            texts[choice["index"]] += choice["text"]
    for index in (0, 1):
        final = _replay([s for s in steps if s["index"] == index])
        answer = [final[p] for p in range(10)]
        assert live_server.post("/detokenize", {"tokens": answer}).json()["prompt"] == texts[index]
    first_denoising = next(i for i, e in enumerate(events) if "denoising" in e)
    first_text = next(i for i, e in enumerate(events) if any(c["text"] for c in e["choices"]))
    assert first_denoising < first_text  # a block's steps come before its text


def test_stream_options_without_stream_is_refused(live_server: LiveServer):
    body = {"model": MODEL_NAME, "messages": MESSAGES, "stream_options": {"include_denoising": True}}
    response = live_server.post("/v1/chat/completions", body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "stream_options"
