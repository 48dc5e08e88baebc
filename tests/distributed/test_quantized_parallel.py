"""Quantized weights over two processes (gloo): each rank holds its slices of the single-process quantized
values, so tensor and expert parallel give one process's tokens."""

from __future__ import annotations

import pytest

from diffuserve import LLM, SamplingParams
from tests.conftest import tiny_checkpoint

PARAMS = SamplingParams(max_tokens=12, ignore_eos=True, threshold=0.7)
PROMPTS = [{"prompt_token_ids": [(i * 11 + j * 5) % 250 + 1 for j in range(2 + 6 * i)]} for i in range(4)]


@pytest.mark.parametrize(("method", "expert_parallel"), [("int8", False), ("int4", True)])
def test_quantized_two_processes_give_the_tokens_of_one(tmp_path, method, expert_parallel):
    model_dir = str(tiny_checkpoint(tmp_path, "m", shared_expert_intermediate_size=64, moe_intermediate_size=64))
    options = dict(num_pages=128, quantization=method, quantization_group_size=32)
    expected = [o.outputs[0].token_ids for o in LLM(model_dir, **options).generate(PROMPTS, PARAMS)]
    llm = LLM(model_dir, tensor_parallel_size=2, enable_expert_parallel=expert_parallel, **options)
    try:
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)] == expected
    finally:
        llm.engine.shutdown()
