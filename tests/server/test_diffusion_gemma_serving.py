"""`diffuserve serve` on a DiffusionGemma directory (renoise canvases, sliding-window pages, the canvas pool), with
the official `openai` client over loopback: a seeded completion equals the offline API's (which the engine parity
tests tie to transformers' `generate`), streamed or not; chat works; the renoise knobs reach the engine; output
logprobs are the committed tokens' under the canvas's last tempered distribution; what the canvas cannot do is a
400 naming the field and why (structured output, prompt scoring, a mask decoder, top_p)."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.reference.diffusion_gemma_checkpoint import (
    make_diffusion_gemma_config,
    write_diffusion_gemma_checkpoint,
)
from diffuserve.server.config import ServerConfig
from tests.server.conftest import LiveServer

NAME = "gemma"
FAST = {"steps": 8, "entropy_bound": 1.0, "confidence_threshold": 2.0}
"""Renoise knobs that end the random model's canvases in a few steps (the defaults take 48)."""
ENGINE = dict(max_num_seqs=4, max_model_len=256, page_size=4, dtype="float32")


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory) -> Path:
    return write_diffusion_gemma_checkpoint(
        tmp_path_factory.mktemp("gemma-serve") / "m", make_diffusion_gemma_config(), seed=5, feedback=0.1
    )


@pytest.fixture(scope="module")
def server(gemma_dir, single_threaded_torch):
    live = LiveServer(gemma_dir, ServerConfig(served_model_name=NAME), **ENGINE).start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def offline(gemma_dir, single_threaded_torch) -> LLM:
    return LLM(str(gemma_dir), device="cpu", **ENGINE)


def _params(**fields) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 20, "seed": 3, "ignore_eos": True, **FAST, **fields})


def test_completion_equals_the_offline_api_streamed_or_not(server, offline):
    client = server.client()
    args = dict(model=NAME, prompt="Hello, world", max_tokens=20, seed=3, extra_body={"ignore_eos": True, **FAST})
    text = client.completions.create(**args).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(**args, stream=True) if c.choices)
    assert text == streamed == offline.generate("Hello, world", _params())[0].outputs[0].text
    assert len(offline.generate("Hello, world", _params())[0].outputs[0].token_ids) == 20


def test_chat_and_knobs_reach_the_engine(server, offline):
    """Another seed or schedule gives another canvas (the knobs are not dropped on the way)."""
    client = server.client()
    chat = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=12, seed=3, extra_body=FAST
    )
    assert chat.choices[0].message.content is not None and chat.usage.completion_tokens > 0
    base = dict(model=NAME, prompt="abc", max_tokens=16, seed=3)
    texts = {
        client.completions.create(**base, extra_body={"ignore_eos": True, **FAST, **knobs}).choices[0].text
        for knobs in ({}, {"t_min": 0.1, "t_max": 2.0}, {"steps": 3})
    }
    assert len(texts) == 3
    hot = _params(max_tokens=16, t_min=0.1, t_max=2.0)
    assert offline.generate("abc", hot)[0].outputs[0].text in texts


def test_logprobs_are_the_committed_tokens_under_the_last_step(server, offline):
    client = server.client()
    response = client.completions.create(
        model=NAME, prompt="xyz", max_tokens=8, seed=4, logprobs=2, extra_body={"ignore_eos": True, **FAST}
    )
    served = response.choices[0].logprobs
    expected = offline.generate("xyz", _params(max_tokens=8, seed=4, logprobs=2))[0].outputs[0]
    assert served is not None and len(served.token_logprobs) == len(expected.token_ids) == 8
    for position, (token, entry) in enumerate(zip(expected.token_ids, expected.logprobs, strict=True)):
        assert served.token_logprobs[position] == pytest.approx(entry[token].logprob, abs=1e-5)
        # the committed token is the last step's argmax: the most likely one (and so among the top 2)
        assert entry[token].rank == 1 and len(entry) == 2


@pytest.mark.parametrize(
    ("extra", "field", "why"),
    [
        ({"response_format": {"type": "json_object"}}, "structured_outputs", "rewrites every position"),
        ({"echo": True, "logprobs": 1, "max_tokens": 1}, "prompt_logprobs", "renoise canvases"),
        ({"decoder": "threshold"}, "decoder", "renoise canvases"),
        ({"top_p": 0.5}, "top_p", "whole tempered distribution"),
    ],
)
def test_what_a_canvas_cannot_do_is_a_400(server, extra, field, why):
    client = server.client()
    body = {"max_tokens": 8, **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(
            model=NAME,
            prompt="abc",
            max_tokens=body.pop("max_tokens"),
            extra_body=body,
        )
    error = caught.value.body
    assert isinstance(error, dict) and error.get("param") == field, error
    assert why in error["message"], error["message"]
