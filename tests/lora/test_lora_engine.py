"""LoRA adapters in the engine: exact against transformers + PEFT with the adapter merged (logits, fp32), the
same tokens as the engine serving the merged checkpoint, a batch mixing adapters equal to each run alone, and
the prefix cache keeping adapters apart."""

from __future__ import annotations

import pytest
import torch

from diffuserve import LLM, LoRARequest, SamplingParams
from diffuserve.model.layers.attention import DenseAttentionInputs, block_causal_mask
from diffuserve.model.loader import load_args, load_model
from diffuserve.model.lora.layer import lora_context
from diffuserve.model.lora.slots import LoRASlots
from diffuserve.model.step_inputs import StepInputs
from tests.lora.adapters import write_adapter, write_base
from tests.model.test_hf_parity import BLOCK, SHAPE

transformers = pytest.importorskip("transformers")
PROMPTS = [[(i * 13 + j * 7) % 90 + 1 for j in range(3 + i * 4)] for i in range(4)]
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module", params=["dense", "moe"])
def models(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"lora-{request.param}")
    first = write_adapter(root, request.param, "first", seed=1)
    second = write_adapter(root, request.param, "second", seed=2, rank=2, use_rslora=True)
    return request.param, write_base(root, request.param), first, second


def _logits(model, ids: torch.Tensor, slot: int | None) -> torch.Tensor:
    length = ids.shape[1]
    positions = torch.arange(length)[None].expand(ids.shape[0], -1)
    mask = block_causal_mask(torch.arange(length), length, BLOCK)[None, None]
    slots = None if slot is None else torch.full((ids.numel(),), slot)
    with torch.no_grad(), lora_context(slots):
        return model.compute_logits(model(ids, positions, StepInputs(DenseAttentionInputs(mask))))


def test_logits_equal_transformers_peft_merged(models):
    _, base, (first, first_merged), (second, second_merged) = models
    family, _ = load_args(base)
    args, ours = load_model(base, dtype="float32")
    slots = LoRASlots(ours, family, args, 3, 8, torch.float32, torch.device("cpu"))
    slots.load(3, "first", first)
    slots.load(1, "second", second)
    ids = torch.randint(0, SHAPE["vocab_size"], (2, 22), generator=torch.Generator().manual_seed(1))
    length = ids.shape[1]
    mask = block_causal_mask(torch.arange(length), length, BLOCK)
    additive = torch.zeros(length, length).masked_fill(~mask, float("-inf"))[None, None].expand(2, 1, -1, -1)
    for slot, merged_dir in ((3, first_merged), (1, second_merged)):
        merged = transformers.AutoModelForCausalLM.from_pretrained(merged_dir, torch_dtype=torch.float32).eval()
        with torch.no_grad():
            positions = torch.arange(length)[None].expand(2, -1)
            expected = merged(input_ids=ids, attention_mask=additive, position_ids=positions).logits
        assert (_logits(ours, ids, slot) - expected).abs().max().item() <= 1e-4
    base_logits = _logits(ours, ids, None)
    assert torch.equal(_logits(ours, ids, 0), base_logits)  # slot 0 adds exactly nothing
    assert (base_logits - expected).abs().max().item() > 1e-2  # the adapters are not no-ops


def _tokens(llm: LLM, lora=None) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, lora_request=lora)
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_engine_with_adapter_equals_engine_on_merged_checkpoint(models):
    _, base, (first, first_merged), (second, second_merged) = models
    llm = LLM(str(base), enable_lora=True, max_loras=2, max_lora_rank=4, num_pages=256)
    with_first = _tokens(llm, LoRARequest("first", 1, str(first)))
    with_second = _tokens(llm, LoRARequest("second", 2, str(second)))
    assert with_first == _tokens(LLM(str(first_merged), num_pages=256))
    assert with_second == _tokens(LLM(str(second_merged), num_pages=256))
    assert with_first != _tokens(llm) != with_second


def test_mixed_batch_equals_each_alone(models):
    _, base, (first, _), (second, _) = models
    llm = LLM(str(base), enable_lora=True, max_loras=2, max_lora_rank=4, num_pages=256)
    requests = [None, LoRARequest("first", 1, str(first)), LoRARequest("second", 2, str(second))]
    alone = {i: _tokens(llm, lora) for i, lora in enumerate(requests)}
    mix = [requests[i % 3] for i in range(len(PROMPTS))]
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, lora_request=mix)
    assert [list(o.outputs[0].token_ids) for o in outputs] == [alone[i % 3][i] for i in range(len(PROMPTS))]


def test_prefix_cache_keeps_adapters_apart(models):
    _, base, (first, _), (second, _) = models
    llm = LLM(str(base), enable_lora=True, max_loras=2, max_lora_rank=4, num_pages=256, page_size=BLOCK)
    prompt = {"prompt_token_ids": PROMPTS[-1]}  # 15 tokens: three full pages
    params = SamplingParams(max_tokens=2, temperature=0.0)

    def cached(lora) -> int:
        return llm.generate([prompt], params, lora_request=lora)[0].num_cached_tokens

    first_req, second_req = LoRARequest("first", 1, str(first)), LoRARequest("second", 2, str(second))
    assert cached(first_req) == 0
    assert cached(first_req) > 0  # the same adapter reuses its pages
    assert cached(second_req) == 0
    assert cached(None) == 0
    assert cached(None) > 0
