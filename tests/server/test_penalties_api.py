"""Penalties over HTTP with the official openai client: `presence_penalty` and `frequency_penalty` are accepted
(no longer a 400) and give the naive reference's tokens; `repetition_penalty` and `penalize_prompt` travel in
`extra_body`."""

from __future__ import annotations

from pathlib import Path

from diffuserve import SamplingParams
from diffuserve.reference.reference_decode import reference_generate
from diffuserve.reference.reference_model import load_reference
from tests.server.conftest import MODEL_NAME, LiveServer

PROMPT = [17, 44, 71, 98, 5]


def _text(live_server: LiveServer, tokens: list[int]) -> str:
    return live_server.post("/detokenize", {"tokens": tokens}).json()["prompt"]


def test_presence_and_frequency_penalties_over_http(live_server: LiveServer, tiny_model_dir: Path):
    client, reference = live_server.client(), load_reference(tiny_model_dir, max_model_len=192)
    base = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 16, "temperature": 0}
    free = {"ignore_eos": True, "skip_special_tokens": False}
    penalised = client.completions.create(**base, presence_penalty=1.5, frequency_penalty=0.5, extra_body=free)
    expected = SamplingParams(max_tokens=16, ignore_eos=True, presence_penalty=1.5, frequency_penalty=0.5)
    tokens = reference_generate(reference, PROMPT, expected).token_ids
    assert penalised.choices[0].text == _text(live_server, tokens)
    plain = reference_generate(reference, PROMPT, SamplingParams(max_tokens=16, ignore_eos=True)).token_ids
    assert tokens != plain
    extra = {**free, "repetition_penalty": 2.0, "penalize_prompt": True}
    repeated = client.completions.create(**base, extra_body=extra)
    expected = SamplingParams(max_tokens=16, ignore_eos=True, repetition_penalty=2.0, penalize_prompt=True)
    assert repeated.choices[0].text == _text(live_server, reference_generate(reference, PROMPT, expected).token_ids)
