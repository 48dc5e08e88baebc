"""A long mixed run equals the same requests run one at a time.

Clover at block 4 (GDN state, paged attention), one engine: requests arrive over the run's steps, share prompt
prefixes (prefix-cache hits), stop on ids and strings, are preempted (too few pages and state slots for all), have
their prompts spread over steps by a small prefill budget, and use every decoder the family has (threshold, fixed,
entropy, edit, verified, auto; greedy and seeded sampling; penalties, logprobs, structured output). Each request's
tokens, text, finish reason and logprobs equal what a fresh engine gives it alone, with room for everything: the
batch, its order, its arrivals, preemption and the budgets never change a request's output. And a penalised
verified or auto request's logprobs are those of the penalised autoregressive distribution, computed apart from
the engine on the model read whole."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.core.outputs import RequestOutput
from diffuserve.engine.llm_engine import LLMEngine
from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.loader import load_model
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.structured_outputs import StructuredOutputsParams

SHARED = [5, 9, 11, 40, 41, 42, 7, 8, 100, 101, 102, 103, 13, 14, 15, 16, 17, 18]
"""A prefix longer than a page (16 tokens): later requests that share it hit the prefix cache."""


def _requests() -> list[tuple[int, list[int], SamplingParams]]:
    """(arrival step, prompt, params): every decoder, with and without the options each combines with."""
    base = dict(max_tokens=14, ignore_eos=True)
    grammar = StructuredOutputsParams(choice=["yes", "no", "maybe"])
    return [
        (0, [*SHARED, 60], SamplingParams(decoder="threshold", threshold=0.5, **base)),
        (0, [3, 4, 5], SamplingParams(decoder="verified", logprobs=2, **base)),
        (1, [*SHARED, 61, 62], SamplingParams(decoder="fixed", steps=2, **base)),
        (1, [20, 21, 22, 23, 24], SamplingParams(decoder="entropy", **base)),
        (2, [*SHARED, 63], SamplingParams(decoder="edit", frequency_penalty=0.3, **base)),
        (3, [30, 31], SamplingParams(decoder="threshold", temperature=0.8, seed=7, **base)),
        (3, [*SHARED, 64, 65, 66], SamplingParams(decoder="verified", presence_penalty=0.5, **base)),
        (4, [50, 51, 52, 53], SamplingParams(decoder="auto", **base)),
        (5, SHARED, SamplingParams(decoder="verified", temperature=0.7, seed=3, logprobs=1, **base)),
        (6, [70, 71, 72], SamplingParams(decoder="fixed", structured_outputs=grammar, max_tokens=6)),
        (7, [*SHARED, 67], SamplingParams(decoder="verified", structured_outputs=grammar, max_tokens=6)),
        (8, [80, 81], SamplingParams(max_tokens=14, stop_token_ids=[17, 55, 100, 3, 200], min_tokens=2)),
        (9, [*SHARED, 68, 69], SamplingParams(decoder="auto", repetition_penalty=1.3, logprobs=1, **base)),
        (10, [90, 91, 92], SamplingParams(max_tokens=14, stop=["a", "e", "o"], decoder="threshold", threshold=0.5)),
    ]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    config = make_clover_moe_config(block_length=4)
    root = tmp_path_factory.mktemp("mixed")
    return write_clover_moe_checkpoint(root / "m", config, seed=12, init_std=0.1, logit_scale=10.0)


def _summary(output: RequestOutput) -> tuple:
    completion = output.outputs[0]
    logprobs = None
    if completion.logprobs is not None:
        logprobs = [{token: lp.logprob for token, lp in step.items()} for step in completion.logprobs]
    return list(completion.token_ids), completion.text, completion.finish_reason, logprobs


def _assert_same(got: tuple, want: tuple, what: str) -> None:
    """Tokens, text and finish reason exactly; logprobs over the same tokens, to float noise (1e-4)."""
    assert got[:3] == want[:3], what
    if want[3] is None:
        assert got[3] is None, what
        return
    assert [step.keys() for step in got[3]] == [step.keys() for step in want[3]], what
    for got_step, want_step in zip(got[3], want[3], strict=True):
        assert all(abs(got_step[t] - want_step[t]) <= 1e-4 for t in want_step), what


def _run_mixed(engine: LLMEngine, requests: list[tuple[int, list[int], SamplingParams]]) -> dict[str, tuple]:
    """Adds each request at its arrival step and steps until all are done -> request id -> its summary."""
    finished: dict[str, tuple] = {}
    step = 0
    while step <= max(arrival for arrival, _, _ in requests) or engine.has_unfinished_requests():
        for i, (arrival, prompt, params) in enumerate(requests):
            if arrival == step:
                engine.add_request(str(i), prompt, params)
        finished |= {out.request_id: _summary(out) for out in engine.step() if out.finished}
        step += 1
    return finished


def test_a_long_mixed_run_equals_each_request_alone(checkpoint):
    requests = _requests()
    probe = LLM(str(checkpoint), max_model_len=64)
    slot = probe.engine.state_pool.slot_bytes
    tight = LLM(
        str(checkpoint),
        max_model_len=64,
        num_pages=9,
        state_cache_memory=6 * slot,
        max_num_seqs=8,
        max_prefill_tokens=8,
        auto_draft_tokens=16,
    )
    mixed = _run_mixed(tight.engine, requests)
    stats = tight.engine.stats()
    assert stats.num_preemptions > 0 and stats.num_prefix_hit_tokens > 0
    alone = {}
    for i, (_, prompt, params) in enumerate(requests):
        (output,) = LLM(str(checkpoint), max_model_len=64).generate([prompt], params)
        alone[str(i)] = _summary(output)
    assert mixed.keys() == alone.keys()
    for request_id, want in alone.items():
        _assert_same(mixed[request_id], want, f"request {request_id} ({requests[int(request_id)][2]})")
    reasons = {summary[2] for summary in alone.values()}
    assert {"stop", "length"} <= reasons


def _penalised_logprobs(checkpoint, prompt: list[int], output: list[int], penalty: float) -> list[float]:
    """Each output token's logprob under the causal row before it, its logits repetition-penalised once by the
    output tokens before it (vLLM's rule; the prompt not counted) and the mask token removed."""
    _, model = load_model(checkpoint)
    with torch.no_grad():
        hidden, _ = DenseClover(model).forward_causal(torch.tensor([prompt + output]))
        logits = model.compute_logits(hidden[0])
    found = []
    for p, token in enumerate(output):
        row = logits[len(prompt) + p - 1].clone()
        row[model.args.mask_token_id] = float("-inf")
        seen = torch.bincount(torch.tensor(output[:p], dtype=torch.long), minlength=row.shape[0]) > 0
        row[seen] = torch.where(row[seen] > 0, row[seen] / penalty, row[seen] * penalty)
        found.append(torch.log_softmax(row, dim=-1)[token].item())
    return found


@pytest.mark.parametrize("decoder, draft_tokens", [("auto", 0), ("auto", 1000), ("verified", None)])
def test_penalised_logprobs_are_the_penalised_autoregressive_distributions(checkpoint, decoder, draft_tokens):
    """Alone, each decoder's rows are the step's logits themselves: a head is decoded, then checked against the
    same row, and penalising that row in place penalised it twice (logprobs off by up to 0.006 here)."""
    _, prompt, params = _requests()[12]
    params = dataclasses.replace(params, decoder=decoder)
    (output,) = LLM(str(checkpoint), max_model_len=64, auto_draft_tokens=draft_tokens).generate([prompt], params)
    completion = output.outputs[0]
    got = [step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids, strict=True)]
    want = _penalised_logprobs(checkpoint, prompt, list(completion.token_ids), params.repetition_penalty)
    assert max(abs(g - w) for g, w in zip(got, want, strict=True)) <= 1e-4
