"""Tensor parallelism with attention biases: the q | k | v bias is split per segment with its heads (column
parallel) and the o_proj bias is added once, after the all-reduce (row parallel). Tiny SDAR-MoE (`attention_bias`)
and LLaDA2 (`use_qkv_bias`, `use_bias`) checkpoints whose biases are scaled up until they move the logits: two
processes give the logits of one, and the same tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from diffuserve import LLM, SamplingParams
from diffuserve.model.layers.attention import SequenceSlice, block_causal_mask
from diffuserve.worker.cache.paged_step import PagedStepMetadata
from diffuserve.worker.cache.step_metadata import StepMetadata
from diffuserve.worker.executor import ForwardInputs
from tests.conftest import tiny_checkpoint, write_llada2_checkpoint

BIAS_SCALE = 25.0
"""The writer's biases are normal(0, 0.02); times 25 they shift q, k, v and the attention output visibly."""
PARAMS = SamplingParams(max_tokens=12, ignore_eos=True, threshold=0.7)
PROMPTS = [{"prompt_token_ids": [(i * 13 + j * 7) % 250 + 1 for j in range(3 + 5 * i)]} for i in range(3)]


def _scale_biases(model_dir: Path) -> Path:
    """Multiplies every linear bias in the checkpoint (not the router's expert_bias) by BIAS_SCALE, in place."""
    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    biases = [n for n in tensors if n.endswith(".bias") and "expert_bias" not in n]
    assert biases, "the checkpoint has no linear biases"
    for name in biases:
        tensors[name] = tensors[name] * BIAS_SCALE
    save_file(tensors, str(path), metadata={"format": "pt"})
    return model_dir


@pytest.fixture(scope="module")
def biased_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("biased")
    sdar = tiny_checkpoint(root, "sdar-bias", attention_bias=True)
    llada2 = write_llada2_checkpoint(
        root / "llada2-bias", {"use_qkv_bias": True, "use_bias": True}, seed=2, logit_scale=40.0
    )
    return {"sdar": _scale_biases(sdar), "llada2": _scale_biases(llada2)}


def _prefill(block_length: int, num_tokens: int) -> ForwardInputs:
    """One sequence of `num_tokens` prompt tokens at positions 0.., its K/V in slots 0.. (block-causal mask)."""
    positions = torch.arange(num_tokens)
    ids = (positions * 37 + 11) % 250 + 1
    sequence = SequenceSlice.of(0, num_tokens, positions, block_causal_mask(positions, num_tokens, block_length))
    return ForwardInputs(ids, positions, StepMetadata({"kv": PagedStepMetadata(positions, (sequence,))}))


@torch.inference_mode()
def _logits(llm: LLM, inputs: ForwardInputs) -> torch.Tensor:
    """[N, V] logits of every position (rank 0 runs the forward with the other ranks)."""
    return llm.engine.runner.model.compute_logits(llm.engine.runner.executor.execute(inputs))


def _tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)]


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_tensor_parallel_with_biases_gives_the_logits_of_one_process(biased_dirs, family):
    model_dir = str(biased_dirs[family])
    single = LLM(model_dir, num_pages=64)
    inputs = _prefill(single.engine.args.block_length, 10)
    expected_tokens, expected = _tokens(single), _logits(single, inputs)
    parallel = LLM(model_dir, num_pages=64, tensor_parallel_size=2)
    try:
        assert _tokens(parallel) == expected_tokens
        torch.testing.assert_close(_logits(parallel, inputs), expected, atol=1e-4, rtol=1e-4)
    finally:
        parallel.engine.shutdown()
    with torch.no_grad():  # the biases matter: without them the logits move far beyond the tolerance
        for name, param in single.engine.runner.model.named_parameters():
            if name.endswith(".bias"):
                param.zero_()
    assert (_logits(single, inputs) - expected).abs().max() > 0.1
