"""decoder=auto on tiny random Clover checkpoints (tests/engine/test_verified_decoding.py's): its requests draft while
few are running and decide only their next token while many are (core/draft_switch.py), and every token is checked
against the causal path either way, so the tokens are the autoregressive reading's whichever steps drafted. With
drafts off it is the autoregressive reading exactly: the same forwards and the same query tokens per step."""

from __future__ import annotations

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.core import scheduler
from diffuserve.decoding.registry import DecoderRegistry
from diffuserve.model.interface import StepRules
from tests.engine.test_oracle_mutations import apply_source_mutation
from tests.engine.test_verified_decoding import PROMPTS, _checkpoints, _generate, _greedy
from tests.engine.test_verified_outputs import SPECS, _constrained, _matches

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def block4(tmp_path_factory):
    return _checkpoints(tmp_path_factory.mktemp("auto4"), 4)


def _grow_and_shrink(model_dir, auto_draft_tokens: int) -> tuple[list[list[int]], LLM]:
    """PROMPTS[i] with max_tokens 6 + 3 i, arriving two by two every other step: the running batch grows from
    one request to several and shrinks back as the short ones finish."""
    llm = LLM(str(model_dir), device="cpu", max_model_len=128, auto_draft_tokens=auto_draft_tokens)
    engine = llm.engine
    finished: dict[str, list[int]] = {}

    def step() -> None:
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = list(output.outputs[0].token_ids)

    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, _greedy(6 + 3 * i, decoder="auto"))
        if i % 2:
            step()
            step()
    while engine.has_unfinished_requests():
        step()
    return [finished[str(i)] for i in range(len(PROMPTS))], llm


def test_auto_gives_the_autoregressive_tokens_across_the_switch(block4):
    bd, ar = block4
    want = [_generate(ar, [p], _greedy(6 + 3 * i))[0][0] for i, p in enumerate(PROMPTS)]
    got, llm = _grow_and_shrink(bd, auto_draft_tokens=3 * 2 * 4)  # drafts while at most 3 auto requests run
    assert got == want
    spec = llm.engine.stats().spec_decode
    assert spec.num_auto_drafting_steps > 0 and spec.num_auto_autoregressive_steps > 0  # both sides of the switch
    assert spec.num_drafts > 0


def test_auto_without_drafts_is_the_autoregressive_reading(block4):
    """auto_draft_tokens 0: every step decides each request's head alone, from the last committed row, with the
    block not computed: the forwards and the query tokens of the engine at block length 1."""
    bd, _ = block4
    params = _greedy(12, decoder="auto")
    auto_outputs: list = []
    reading_outputs: list = []
    got, auto = _generate(bd, PROMPTS, params, auto_outputs, auto_draft_tokens=0)
    want, reading = _generate(bd, PROMPTS, _greedy(12), reading_outputs, block_length=1)
    assert got == want
    assert [o.num_forwards for o in auto_outputs] == [o.num_forwards for o in reading_outputs]
    assert auto.engine.stats().num_batched_tokens == reading.engine.stats().num_batched_tokens
    assert auto.engine.stats().spec_decode.num_auto_drafting_steps == 0


def test_a_head_only_step_that_computes_its_block_fails_the_token_count(block4, monkeypatch):
    """The mutation: head-only steps still forward the block's B tokens (only the head is read): the tokens stay
    right, the step's width does not."""
    bd, _ = block4
    apply_source_mutation(
        monkeypatch, scheduler, "head_only = request.params.is_auto and not", "head_only = False and not"
    )
    got, auto = _generate(bd, PROMPTS, _greedy(12, decoder="auto"), auto_draft_tokens=0)
    want, reading = _generate(bd, PROMPTS, _greedy(12), block_length=1)
    assert got == want
    assert auto.engine.stats().num_batched_tokens > reading.engine.stats().num_batched_tokens


def test_auto_backs_off_drafts_that_keep_nothing(block4):
    """Random weights: the drafts are all wrong. Under a draft width that lets every request draft, verified
    decoding drafts every block; auto stops drafting after a draft that keeps nothing, for 1, 2, 4, ... steps
    (core/draft_switch.py), so its steps are far narrower, and its tokens are still the autoregressive reading's."""
    bd, ar = block4
    want, _ = _generate(ar, PROMPTS, _greedy(24))
    verified_outputs: list = []
    _, verified = _generate(bd, PROMPTS, _greedy(24, decoder="verified"), verified_outputs, auto_draft_tokens=1000)
    got, auto = _generate(bd, PROMPTS, _greedy(24, decoder="auto"), auto_draft_tokens=1000)
    assert got == want
    assert verified.engine.stats().spec_decode.num_accepted_tokens == 0  # nothing to gain from drafting
    assert auto.engine.stats().num_batched_tokens < 0.6 * verified.engine.stats().num_batched_tokens
    assert 0 < auto.engine.stats().spec_decode.num_drafts < verified.engine.stats().spec_decode.num_drafts / 2


def test_auto_is_the_models_own_decoder_where_nothing_verifies():
    """No AR shift (SDAR, LLaDA2): auto resolves to the threshold decoder; renoise canvases: to renoise."""
    params = SamplingParams(decoder="auto", max_tokens=4).with_defaults({})
    block = DecoderRegistry(StepRules(), 4, CPU, 32)
    assert block.resolve(params).name == "threshold"
    canvas = DecoderRegistry(StepRules(causal_commits=True, renoise_canvas=True), 4, CPU, 32)
    assert canvas.resolve(params).name == "renoise"
    shifted = DecoderRegistry(StepRules(prediction_shift=True, causal_commits=True), 4, CPU, 32)
    assert shifted.resolve(params).name == "auto"


def test_the_engine_default_decoder_applies_to_requests_that_name_none(block4):
    bd, ar = block4
    want, _ = _generate(ar, PROMPTS[:3], _greedy(8))
    got, llm = _generate(bd, PROMPTS[:3], _greedy(8), default_decoder="auto")
    # the CPU's default draft width (2 x block length: one request) is past three: they decode autoregressively
    assert got == want and llm.engine.stats().spec_decode.num_auto_autoregressive_steps > 0
    with pytest.raises(ValueError, match=r"^default_decoder: must be one of .*auto, got 'fast'$"):
        LLM(str(bd), device="cpu", default_decoder="fast")


def test_auto_structured_output_is_the_constrained_autoregressive_output(block4):
    """Six constrained requests at once are past the CPU's default draft width: each step decides every head alone,
    grammar-walked and checked, under preemption; sampled, the replies still match their grammars."""
    bd, ar = block4
    assert _constrained(bd, "auto", preempting=True) == _constrained(ar, None)
    sampled = _constrained(bd, "auto", temperature=0.9)
    assert all(_matches(SPECS[i % len(SPECS)], text) for i, (text, _) in enumerate(sampled))
