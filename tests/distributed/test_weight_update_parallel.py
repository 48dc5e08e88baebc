"""Live weight updates under tensor and expert parallelism: after `update_weights` to checkpoint B (a directory, or
a state dict) every rank holds its part of B, so the engine's greedy tokens equal a fresh engine's on B with the
same layout; updating back to A restores A's tokens. An update that reached rank 0 only would mix the two models'
weights across the ranks' shards and change the tokens."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from diffuserve import LLM, SamplingParams
from tests.conftest import tiny_checkpoint

PARAMS = SamplingParams(max_tokens=6, ignore_eos=True, threshold=0.5)
PROMPTS = [{"prompt_token_ids": p} for p in ([5, 9, 14, 2, 7], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3])]


def _tokens(llm: LLM) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, PARAMS)]


@pytest.mark.parametrize("layout", [{}, {"enable_expert_parallel": True}], ids=["tp2", "tp2-ep"])
def test_an_update_reaches_every_rank(tiny_model_dir, tmp_path, layout):
    other = tiny_checkpoint(tmp_path, "other", block_length=4, seed=9)
    with LLM(str(other), tensor_parallel_size=2, **layout) as fresh:
        want = _tokens(fresh)
    with LLM(str(tiny_model_dir), tensor_parallel_size=2, **layout) as llm:
        before = _tokens(llm)
        llm.update_weights(str(other))
        assert _tokens(llm) == want != before
        llm.update_weights(load_file(tiny_model_dir / "model.safetensors"))  # a state dict, by Hub names
        assert _tokens(llm) == before
