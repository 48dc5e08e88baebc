"""The denoising trace (SamplingParams.record_denoising): per step, the output positions it wrote and their
tokens. Checked against the naive reference decode, which shares no decoding code with the engine: each answer
token's last write comes at the forward where the reference made it final, each block takes the reference's
steps, and replaying the writes gives the answer."""

from __future__ import annotations

from collections import Counter

from diffuserve import LLM, SamplingParams
from diffuserve.reference.reference_decode import reference_generate
from diffuserve.reference.reference_model import load_reference

PROMPT = [(j * 7) % 250 + 1 for j in range(10)]  # 2 complete blocks of 4 + 2 prompt tokens in the first block
BLOCK = 4


def test_trace_matches_the_reference_decode(tiny_model_dir):
    params = SamplingParams(max_tokens=26, ignore_eos=True, threshold=0.8, record_denoising=True)
    out = LLM(str(tiny_model_dir), num_pages=64).generate({"prompt_token_ids": PROMPT}, params)[0].outputs[0]
    ref = reference_generate(load_reference(tiny_model_dir), PROMPT, params)
    assert out.token_ids == ref.token_ids
    steps = out.denoising_steps
    assert steps is not None and len(steps) == out.num_forwards == ref.num_forwards
    assert list(Counter(s.block for s in steps).values()) == ref.steps_per_block
    last_write: dict[int, tuple[int, int]] = {}  # output position -> (forward from 1, token)
    for forward, step in enumerate(steps, start=1):
        assert all(step.start <= p < step.end for p, _ in step.writes)
        for position, token in step.writes:
            last_write[position] = (forward, token)
    answer = range(len(ref.token_ids))
    assert [last_write[g][1] for g in answer] == ref.token_ids
    assert [last_write[g][0] for g in answer] == ref.decided_at
    assert len(steps) > len(ref.steps_per_block)  # some block took several steps: the trace has something to show


def test_block_spans_and_step_numbers(tiny_model_dir):
    params = SamplingParams(max_tokens=14, ignore_eos=True, decoder="fixed", steps=2, record_denoising=True)
    out = LLM(str(tiny_model_dir), num_pages=64).generate({"prompt_token_ids": PROMPT}, params)[0].outputs[0]
    steps = out.denoising_steps
    assert steps is not None
    # the prompt's tail (2 tokens) opens block 0 with 2 generated positions; later blocks hold 4
    spans = {s.block: (s.start, s.end) for s in steps}
    assert spans == {0: (0, 2), 1: (2, 6), 2: (6, 10), 3: (10, 14)}
    # fixed with 2 steps accepts block_length // 2 = 2 tokens a step: block 0's two masks take one step
    assert [(s.block, s.step) for s in steps] == [(0, 1)] + [(b, k) for b in (1, 2, 3) for k in (1, 2)]
    assert [len(s.writes) for s in steps] == [BLOCK // 2] * 7


def test_nothing_is_recorded_unless_asked(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), num_pages=64)
    out = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(max_tokens=8))[0].outputs[0]
    assert out.denoising_steps is None
