"""The long mixed workload of the engine tests: requests on a tiny Clover at block 4 that arrive over a run's
steps, share a prompt prefix longer than a page, stop on ids and strings, and use every decoder the family has
with the options each combines with; the run itself (`run_steps`, `step_outputs`, `run_mixed`) and how two runs'
outputs are compared (`summary`, `assert_same`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from diffuserve import LLM, SamplingParams
from diffuserve.core.outputs import RequestOutput
from diffuserve.engine.llm_engine import LLMEngine
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.structured_outputs import StructuredOutputsParams

SHARED = [5, 9, 11, 40, 41, 42, 7, 8, 100, 101, 102, 103, 13, 14, 15, 16, 17, 18]
"""A prefix longer than a page (16 tokens): later requests that share it hit the prefix cache."""


def mixed_requests() -> list[tuple[int, list[int], SamplingParams]]:
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


def summary(output: RequestOutput) -> tuple:
    completion = output.outputs[0]
    logprobs = None
    if completion.logprobs is not None:
        logprobs = [{token: lp.logprob for token, lp in step.items()} for step in completion.logprobs]
    return list(completion.token_ids), completion.text, completion.finish_reason, logprobs


def assert_same(got: tuple, want: tuple, what: str) -> None:
    """Tokens, text and finish reason exactly; logprobs over the same tokens, to float noise (1e-4)."""
    assert got[:3] == want[:3], what
    if want[3] is None:
        assert got[3] is None, what
        return
    assert [step.keys() for step in got[3]] == [step.keys() for step in want[3]], what
    for got_step, want_step in zip(got[3], want[3], strict=True):
        assert all(abs(got_step[t] - want_step[t]) <= 1e-4 for t in want_step), what


def run_steps(
    engine: LLMEngine, requests: list[tuple[int, list[int], SamplingParams]]
) -> Iterator[list[RequestOutput]]:
    """Adds each request (id: its index) at its arrival step and steps until all are done, yielding each step's
    outputs as the step returns them."""
    step = 0
    while step <= max(arrival for arrival, _, _ in requests) or engine.has_unfinished_requests():
        for i, (arrival, prompt, params) in enumerate(requests):
            if arrival == step:
                engine.add_request(str(i), prompt, params)
        yield engine.step()
        step += 1


def step_outputs(engine: LLMEngine, requests: list[tuple[int, list[int], SamplingParams]]) -> Iterator[RequestOutput]:
    """Every output the steps of `run_steps` return, in order."""
    for outputs in run_steps(engine, requests):
        yield from outputs


def run_mixed(engine: LLMEngine, requests: list[tuple[int, list[int], SamplingParams]]) -> dict[str, tuple]:
    """The requests run to the end (`step_outputs`) -> request id -> its final output's summary."""
    return {out.request_id: summary(out) for out in step_outputs(engine, requests) if out.finished}


def write_mixed_checkpoint(root: Path) -> Path:
    """The workload's model: a random Clover at block 4 whose greedy tokens are not all one token."""
    config = make_clover_moe_config(block_length=4)
    return write_clover_moe_checkpoint(root / "m", config, seed=12, init_std=0.1, logit_scale=10.0)


def tight_llm(checkpoint: Path, **options: object) -> LLM:
    """An engine too small for the workload at once: 9 pages, 6 state slots, a prefill budget of 2 blocks, so
    requests are preempted and prompts spread over steps (`options`: more engine options)."""
    slot = LLM(str(checkpoint), max_model_len=64).engine.state_pool.slot_bytes
    return LLM(
        str(checkpoint),
        max_model_len=64,
        num_pages=9,
        state_cache_memory=6 * slot,
        max_num_seqs=8,
        max_prefill_tokens=8,
        auto_draft_tokens=16,
        **options,
    )
