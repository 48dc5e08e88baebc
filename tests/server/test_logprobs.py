"""Output-token logprobs over HTTP with the official openai client: chat's `logprobs` + `top_logprobs` and the
legacy completions `logprobs: k`, streamed and not. One entry per completion token, ranked alternatives, the
streamed lists equal to the whole ones, and each streamed chunk carrying the logprobs of exactly the text it
carries (a character held back for a stop string holds back its token's logprobs)."""

from __future__ import annotations

import math

from tests.server.conftest import MODEL_NAME, LiveServer

FREE = {"ignore_eos": True}
LETTERS = {"ignore_eos": True, "structured_outputs": {"regex": "[a-z]{40}"}}
"""ASCII letters only: every byte token is one character, so tokens spell the text exactly."""


def test_chat_logprobs_streamed_and_not(live_server: LiveServer):
    client = live_server.client()
    args = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_completion_tokens": 14,
        "logprobs": True,
        "top_logprobs": 3,
        "extra_body": FREE,
    }
    whole = client.chat.completions.create(**args)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens == 14
    for item in content:
        values = [top.logprob for top in item.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        assert item.logprob <= values[0] + 1e-6 and item.bytes == list(item.token.encode())
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-5  # log-probabilities, not logits
        assert all(top.bytes == list(top.token.encode()) for top in item.top_logprobs)
    chunks = list(client.chat.completions.create(**args, stream=True))
    streamed = [item for c in chunks if c.choices and c.choices[0].logprobs for item in c.choices[0].logprobs.content]
    assert [item.model_dump() for item in streamed] == [item.model_dump() for item in content]
    plain = client.chat.completions.create(**{**args, "logprobs": None, "top_logprobs": None})
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == whole.choices[0].message.content


def test_completion_logprobs_streamed_and_not(live_server: LiveServer):
    client = live_server.client()
    args = {"model": MODEL_NAME, "prompt": "Once upon", "max_tokens": 13, "logprobs": 2, "extra_body": LETTERS}
    whole = client.completions.create(**args)
    choice = whole.choices[0]
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == whole.usage.completion_tokens == 13
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(13)]
    for token, value, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert top[token] == value and len(top) <= 3  # the top 2, and the written token (OpenAI's legacy shape)
    chunks = list(client.completions.create(**args, stream=True))
    streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs is not None]
    for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [x for lp in streamed for x in getattr(lp, field)] == getattr(logprobs, field)
    assert client.completions.create(**{**args, "logprobs": None}).choices[0].logprobs is None


def test_streamed_logprobs_follow_the_text_held_back_for_a_stop_string(live_server: LiveServer):
    """A two-letter stop string whose first letter ends a block: that letter is held back from the block's
    chunk, and so are its token's logprobs; the stop string's tokens come with the last chunk."""
    client = live_server.client()
    args = {"model": MODEL_NAME, "prompt": "Once upon", "max_tokens": 24, "logprobs": 0, "extra_body": LETTERS}
    free = client.completions.create(**args)
    text, prompt_tokens = free.choices[0].text, free.usage.prompt_tokens
    block_ends = [g for g in range(len(text) - 1) if (prompt_tokens + g) % 4 == 3]
    g = next(g for g in block_ends if text.find(text[g : g + 2]) == g and g > 0)
    stop = text[g : g + 2]
    whole = client.completions.create(**args, stop=[stop])
    assert whole.choices[0].text == text[:g] and whole.choices[0].logprobs.tokens == list(text[: g + 2])
    chunks = [c.choices[0] for c in client.completions.create(**args, stop=[stop], stream=True)]
    for chunk in chunks[:-1]:
        assert chunk.logprobs is None or "".join(chunk.logprobs.tokens) == chunk.text
    shown = [len("".join(c.text for c in chunks[: i + 1])) for i in range(len(chunks))]
    assert g in shown  # a chunk ended one letter before its block did: the stop string's first letter held back
    assert [t for c in chunks if c.logprobs for t in c.logprobs.tokens] == whole.choices[0].logprobs.tokens
