"""One engine over two processes (gloo): tensor parallel and expert parallel give the same tokens as one process
at temperature 0, the workers exit cleanly, and sizes that don't divide the model are refused before any process
starts."""

from __future__ import annotations

import pytest

from diffuserve import LLM, SamplingParams

PARAMS = SamplingParams(max_tokens=16, ignore_eos=True, threshold=0.7)


def _prompts() -> list[dict]:
    return [{"prompt_token_ids": [(i * 11 + j * 5) % 250 + 1 for j in range(2 + 6 * i)]} for i in range(5)]


def _tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(_prompts(), PARAMS)]


@pytest.mark.parametrize(("family", "expert_parallel"), [("sdar", False), ("sdar", True), ("llada2", True)])
def test_two_processes_give_the_same_tokens_as_one(request, family, expert_parallel):
    model_dir = str(request.getfixturevalue("tiny_model_dir" if family == "sdar" else "tiny_llada2_dir"))
    expected = _tokens(LLM(model_dir, num_pages=128))
    llm = LLM(
        model_dir, num_pages=128, tensor_parallel_size=2, enable_expert_parallel=expert_parallel, expert_stats=True
    )
    try:
        assert _tokens(llm) == expected
        assert llm.engine.stats().experts.experts_touched_per_step > 0  # routing seen on rank 0
    finally:
        llm.engine.shutdown()
    workers = llm.engine.runner.executor.runtime.processes
    assert len(workers) == 1 and all(not p.is_alive() and p.exitcode == 0 for p in workers)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(tensor_parallel_size=3), "tensor_parallel_size: 3 does not divide the model's 4 attention heads"),
        (dict(tensor_parallel_size=4), "does not divide the model's 2 KV heads"),
        (dict(tensor_parallel_size=3, enable_expert_parallel=True), "3 does not divide the model's 4 attention"),
    ],
)
def test_sizes_that_do_not_divide_the_model_are_refused(tiny_model_dir, options, message):
    with pytest.raises(ValueError, match=message):
        LLM(str(tiny_model_dir), num_pages=16, **options)
