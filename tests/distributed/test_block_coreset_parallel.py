"""Block expert coreset routing under expert parallelism (two processes, gloo): every rank computes the same
coreset from the replicated router and keeps its own experts' rows, so the tokens are the naive reference's."""

from __future__ import annotations

from diffuserve import LLM, SamplingParams
from diffuserve.reference.reference_decode import reference_generate
from diffuserve.reference.reference_model import load_reference
from tests.conftest import tiny_checkpoint

PARAMS = SamplingParams(max_tokens=12, ignore_eos=True)
PROMPTS = [[(i * 37 + j * 11) % 300 + 1 for j in range(n)] for i, n in enumerate([3, 6, 9, 5])]


def test_expert_parallel_coreset_routing_matches_the_reference(tmp_path):
    overrides = {"num_experts": 16, "num_experts_per_tok": 2, "first_k_dense_replace": 0}
    model_dir = tiny_checkpoint(tmp_path, "tiny16", block_length=4, logit_scale=10.0, **overrides)
    llm = LLM(
        str(model_dir), num_pages=128, tensor_parallel_size=2, enable_expert_parallel=True, block_expert_coreset=2
    )
    try:
        answers = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS)]
    finally:
        llm.engine.shutdown()
    reference = load_reference(model_dir, block_expert_coreset=2)
    assert answers == [reference_generate(reference, p, PARAMS).token_ids for p in PROMPTS]
