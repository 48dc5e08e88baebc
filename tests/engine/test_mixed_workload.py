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

from diffuserve import LLM
from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.loader import load_model
from tests.engine.mixed_workload import (
    assert_same,
    mixed_requests,
    run_mixed,
    summary,
    tight_llm,
    write_mixed_checkpoint,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_mixed_checkpoint(tmp_path_factory.mktemp("mixed"))


def test_a_long_mixed_run_equals_each_request_alone(checkpoint):
    requests = mixed_requests()
    tight = tight_llm(checkpoint)
    mixed = run_mixed(tight.engine, requests)
    stats = tight.engine.stats()
    assert stats.num_preemptions > 0 and stats.num_prefix_hit_tokens > 0
    alone = {}
    for i, (_, prompt, params) in enumerate(requests):
        (output,) = LLM(str(checkpoint), max_model_len=64).generate([prompt], params)
        alone[str(i)] = summary(output)
    assert mixed.keys() == alone.keys()
    for request_id, want in alone.items():
        assert_same(mixed[request_id], want, f"request {request_id} ({requests[int(request_id)][2]})")
    reasons = {finished[2] for finished in alone.values()}
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
    _, prompt, params = mixed_requests()[12]
    params = dataclasses.replace(params, decoder=decoder)
    (output,) = LLM(str(checkpoint), max_model_len=64, auto_draft_tokens=draft_tokens).generate([prompt], params)
    completion = output.outputs[0]
    got = [step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids, strict=True)]
    want = _penalised_logprobs(checkpoint, prompt, list(completion.token_ids), params.repetition_penalty)
    assert max(abs(g - w) for g, w in zip(got, want, strict=True)) <= 1e-4
