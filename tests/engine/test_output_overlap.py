"""Outputs made beside the next step's forward (`overlap_outputs`, engine/output_overlap.py) are the plain order's
outputs, one step later: every request streams the same states and ends the same (tokens, text, finish reason,
logprobs), a stop string found a step late drops the step its request was scheduled for meanwhile, an abort drops
only its own held outputs, and the last step's outputs are not lost. (A failed step beside held outputs:
tests/engine/test_failed_step.py; served through the `openai` client: tests/server/test_output_overlap_server.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.core.outputs import RequestOutput
from diffuserve.engine.llm_engine import LLMEngine
from tests.engine.mixed_workload import (
    assert_same,
    mixed_requests,
    step_outputs,
    summary,
    tight_llm,
    write_mixed_checkpoint,
)

Stream = list[tuple]
"""A request's outputs as a user sees them, each distinct state once: (token ids, text, finish reason)."""


def run_streams(engine: LLMEngine, requests: list[tuple[int, list[int], SamplingParams]]) -> dict[str, Stream]:
    """The requests run to the end (`step_outputs`) -> request id -> its stream."""
    streams: dict[str, Stream] = {}
    for out in step_outputs(engine, requests):
        state = state_of(out)
        stream = streams.setdefault(out.request_id, [])
        if not stream or stream[-1] != state:
            stream.append(state)
    return streams


def state_of(output: RequestOutput) -> tuple:
    completion = output.outputs[0]
    return tuple(completion.token_ids), completion.text, completion.finish_reason


def steps_of(engine: LLMEngine, requests: list[tuple[list[int], SamplingParams]]) -> list[dict[str, tuple]]:
    """Every step's outputs (request id -> summary) of `requests` added at once, stepped to the end."""
    for i, (prompt, params) in enumerate(requests):
        engine.add_request(str(i), prompt, params)
    steps = []
    while engine.has_unfinished_requests():
        steps.append({out.request_id: summary(out) for out in engine.step()})
    return steps


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_mixed_checkpoint(tmp_path_factory.mktemp("overlap"))


def test_the_mixed_workload_streams_what_the_plain_order_streams(checkpoint: Path):
    """Arrivals, prefix hits, preemption, a prefill budget, every decoder, penalties, logprobs, structured
    output, stop ids and stop strings: each request's stream and final output are the plain engine's."""
    requests = mixed_requests()
    plain = run_streams(tight_llm(checkpoint).engine, requests)
    overlapped_llm = tight_llm(checkpoint, overlap_outputs=True)
    overlapped = run_streams(overlapped_llm.engine, requests)
    assert overlapped.keys() == plain.keys() == {str(i) for i in range(len(requests))}
    assert any(stream[-1][2] == "stop" for stream in plain.values())
    for request_id, stream in plain.items():
        assert overlapped[request_id] == stream, request_id
        assert len(stream) > 1, "a stream shows tokens before its end"
    assert overlapped_llm.engine.pool.usage == 0
    overlapped_llm.engine.cache.check_invariants()


def test_each_step_returns_the_plain_steps_outputs_one_step_later(checkpoint: Path):
    """All requests at once in a roomy engine (no preemption, no waiting): step k + 1 with overlap returns what
    step k returns without, whatever stop strings end meanwhile (their extra step is dropped)."""
    base = dict(max_tokens=12, decoder="threshold", threshold=0.5)
    requests = [
        ([90, 91, 92], SamplingParams(stop=["a", "e", "o"], **base)),
        ([30, 31], SamplingParams(stop=["e"], logprobs=2, **base)),
        ([5, 9, 11, 40], SamplingParams(ignore_eos=True, logprobs=1, **base)),
        ([20, 21, 22], SamplingParams(stop_token_ids=[17, 55, 100], **base)),
    ]
    plain = LLM(str(checkpoint), max_model_len=64)
    overlapped = LLM(str(checkpoint), max_model_len=64, overlap_outputs=True)
    plain_steps = steps_of(plain.engine, requests)
    overlapped_steps = steps_of(overlapped.engine, requests)
    assert any(finish == "stop" for step in plain_steps for _, _, finish, _ in step.values())
    assert overlapped_steps[0] == {} and len(overlapped_steps) == len(plain_steps) + 1
    for k, want in enumerate(plain_steps):
        got = overlapped_steps[k + 1]
        assert got.keys() == want.keys(), k
        for request_id in want:
            assert_same(got[request_id], want[request_id], f"step {k}, request {request_id}")
    assert overlapped.engine.pool.usage == 0 and not overlapped.engine.has_unfinished_requests()


def test_an_abort_drops_only_its_own_held_outputs(checkpoint: Path):
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    want = LLM(str(checkpoint), max_model_len=64).generate([{"prompt_token_ids": [5, 6, 7]}], params)[0]
    llm = LLM(str(checkpoint), max_model_len=64, overlap_outputs=True)  # held: its end shuts the engine down
    engine = llm.engine
    engine.add_request("kept", [5, 6, 7], params)
    engine.add_request("aborted", [8, 9, 10], params)
    assert engine.step() == []  # the first step's outputs are held for the next
    engine.abort_request("aborted")
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert {out.request_id for out in outputs} == {"kept"}
    assert outputs[-1].finished and outputs[-1].outputs[0].token_ids == want.outputs[0].token_ids
    assert engine.pool.usage == 0


def test_generate_returns_the_plain_outputs(checkpoint: Path):
    prompts = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [30, 31]}]
    params = SamplingParams(max_tokens=10, stop=["e"], logprobs=1)
    want = LLM(str(checkpoint), max_model_len=64).generate(prompts, params)
    got = LLM(str(checkpoint), max_model_len=64, overlap_outputs=True).generate(prompts, params)
    for g, w in zip(got, want, strict=True):
        assert_same(summary(g), summary(w), g.request_id)
