"""NFE accounting: the fused commit adds no forward; a separate commit adds exactly one per committed block,
with the same tokens."""

from __future__ import annotations

from diffuserve import LLM, SamplingParams
from diffuserve.reference.reference_decode import reference_generate
from diffuserve.reference.reference_model import load_reference


def test_fused_commit_adds_no_forward(tiny_model_dir):
    prompt = [(j * 7) % 250 + 1 for j in range(10)]  # 2 complete blocks + 2 prompt tokens in the first block
    params = SamplingParams(max_tokens=26, ignore_eos=True, threshold=0.8)  # 10 + 26 = 36: the last block ends it
    fused = LLM(str(tiny_model_dir), num_pages=64)
    separate = LLM(str(tiny_model_dir), num_pages=64, fused_commit=False)
    a = fused.generate({"prompt_token_ids": prompt}, params)[0]
    b = separate.generate({"prompt_token_ids": prompt}, params)[0]
    engine = fused.engine
    ref = reference_generate(load_reference(tiny_model_dir), prompt, params)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids == ref.token_ids
    # every forward of the fused engine was a denoising step of the reference
    assert a.num_forwards == ref.num_forwards
    # blocks 2..8 (7 blocks) were each committed before the next one started; the last block never is
    assert b.num_forwards == a.num_forwards + len(ref.steps_per_block) - 1
    # the engine ran one step per forward (single request): prefill was fused into the first denoising step
    assert engine.stats().num_steps == a.num_forwards


def test_expert_statistics_are_recorded_when_asked(tiny_model_dir):
    prompts = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [9] * 9}]
    default = LLM(str(tiny_model_dir), num_pages=64)
    default.generate(prompts, SamplingParams(max_tokens=12))
    assert default.engine.stats().experts is None  # offline default: no per-step routing copies
    llm = LLM(str(tiny_model_dir), num_pages=64, expert_stats=True)
    llm.generate(prompts, SamplingParams(max_tokens=12))
    experts = llm.engine.stats().experts
    assert experts is not None and experts.num_experts == 4
    assert 1 <= experts.experts_touched_per_block <= experts.num_experts
    assert 1 <= experts.experts_touched_per_step <= experts.num_experts
    assert experts.load_imbalance >= 1.0
