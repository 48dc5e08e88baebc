"""Presence, frequency and repetition penalties: the engine (a mask decoder, requests with and without penalties in
one batch) against the naive reference, which applies them by plain arithmetic token by token; only the committed
response is counted unless penalize_prompt; generation_config.json gives defaults; bad values are one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.decoding.penalties import Penalized
from diffuserve.errors import RequestError
from diffuserve.reference.reference_decode import reference_generate
from diffuserve.reference.reference_model import load_reference

BASE = SamplingParams(max_tokens=20, ignore_eos=True)
FAVOURITES = [246, 160, 77]
"""Tokens the tiny model (tiny_model_dir) writes again and again when nothing stops it."""


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> LLM:
    return LLM(str(tiny_model_dir), num_pages=128, max_num_seqs=8)


def _check_batch(llm: LLM, model_dir: Path, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    """Generates `prompts` in one batch; each answer must be the reference's. Returns the answers."""
    reference = load_reference(model_dir)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    answers = [o.outputs[0].token_ids for o in outputs]
    for prompt, p, answer in zip(prompts, params, answers):
        assert answer == reference_generate(reference, prompt, p).token_ids, p
    return answers


def test_penalties_match_the_plain_arithmetic_reference_batched_with_requests_without(llm, tiny_model_dir):
    prompts = [[(i * 37 + j * 11) % 300 + 1 for j in range(n)] for i, n in enumerate([3, 6, 9, 5, 7, 2])]
    params = [
        BASE,
        BASE.replace(presence_penalty=1.5, frequency_penalty=0.5),
        BASE.replace(repetition_penalty=2.0),
        BASE.replace(decoder="fixed", steps=2),
        BASE.replace(frequency_penalty=1.25, repetition_penalty=1.5, decoder="entropy"),
        BASE.replace(presence_penalty=-0.5, frequency_penalty=0.75, threshold=0.5),
    ]
    answers = _check_batch(llm, tiny_model_dir, prompts, params)
    unpenalised = [BASE.replace(**_decoding(p)) for p in params]
    plain = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], unpenalised)]
    changed = [a != b for a, b in zip(answers, plain)]
    assert changed == [False, True, True, False, True, True]


def _decoding(params: SamplingParams) -> dict:
    return {k: getattr(params, k) for k in ("decoder", "steps", "threshold")}


def test_a_request_without_penalties_is_not_wrapped(llm):
    decoding = llm.engine.runner.decoding
    assert not isinstance(decoding.resolve(BASE.with_defaults({})), Penalized)
    assert isinstance(decoding.resolve(BASE.replace(presence_penalty=0.1).with_defaults({})), Penalized)
    assert not isinstance(decoding.resolve(BASE.replace(repetition_penalty=1.0).with_defaults({})), Penalized)


def test_only_the_response_counts_unless_penalize_prompt(llm, tiny_model_dir):
    """The prompt holds the model's favourite tokens: counting them changes the first block already."""
    prompt = FAVOURITES * 2 + [5]
    params = [BASE.replace(frequency_penalty=2.0, presence_penalty=2.0, penalize_prompt=flag) for flag in (False, True)]
    response_only, with_prompt = _check_batch(llm, tiny_model_dir, [prompt, prompt], params)
    assert response_only[:4] != with_prompt[:4]


def test_generation_config_penalties_are_the_defaults(tiny_model_dir, tmp_path):
    model_dir = Path(shutil.copytree(tiny_model_dir, tmp_path / "penalised"))
    generation = {"repetition_penalty": 2.0, "frequency_penalty": 0.5}
    (model_dir / "generation_config.json").write_text(json.dumps(generation))
    llm = LLM(str(model_dir), num_pages=64, max_num_seqs=4)
    prompts = [[3, 14, 15], [9, 26, 5, 35]]
    params = [BASE, BASE.replace(repetition_penalty=1.0, frequency_penalty=0.0)]  # the second turns them off
    answers = _check_batch(llm, model_dir, prompts, params)
    assert answers[0] != _check_batch(llm, model_dir, prompts[:1], params[1:])[0]


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("presence_penalty", 2.5, "in [-2, 2]"),
        ("frequency_penalty", -3.0, "in [-2, 2]"),
        ("repetition_penalty", 0.0, "> 0"),
    ],
)
def test_out_of_range_penalties_are_one_line_errors(field, value, words):
    with pytest.raises(RequestError) as info:
        SamplingParams(**{field: value})
    assert info.value.param == field and words in str(info.value) and "\n" not in str(info.value)


def test_sampled_penalised_requests_are_the_same_batched_and_alone(llm):
    """The penalties and the per-request counts are per request: sampling (seeded) does not depend on the batch."""
    prompts = [[(i * 7 + j * 3) % 300 + 1 for j in range(3 + 4 * i)] for i in range(4)]
    params = [
        BASE.replace(temperature=0.8, seed=10 + i, frequency_penalty=0.5 * i, repetition_penalty=1.0 + 0.25 * i)
        for i in range(4)
    ]
    batched = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
    alone = [llm.generate({"prompt_token_ids": p}, q)[0].outputs[0].token_ids for p, q in zip(prompts, params)]
    assert batched == alone
