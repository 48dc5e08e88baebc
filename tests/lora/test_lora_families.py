"""Every family with an adapter on every linear it can adapt (attention, LLaDA2's fused query_key_value, Gated
DeltaNet projections, shared experts, dense MLPs): the engine with the adapter gives the same tokens, and the
same logprobs (1e-4, fp32), as the engine on the checkpoint with the adapter merged into its weights; and
Clover's against transformers' Qwen3.5-MoE with the PEFT adapter merged (`merge_and_unload`)."""

from __future__ import annotations

import json

import pytest
import torch

from diffuserve import LLM, LoRARequest, SamplingParams
from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.loader import load_args, load_model
from diffuserve.model.lora.layer import lora_context
from diffuserve.model.lora.slots import LoRASlots
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.diffusion_gemma_checkpoint import (
    make_diffusion_gemma_config,
    write_diffusion_gemma_checkpoint,
)
from tests.lora.adapters import adapter_for_checkpoint, merge_into_checkpoint

PROMPTS = [{"prompt_token_ids": [(i * 17 + j * 3) % 200 + 5 for j in range(6 + 5 * i)]} for i in range(3)]
PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=3, seed=3)


def _clover(root):
    config = make_clover_moe_config()
    return write_clover_moe_checkpoint(root / "clover", config, seed=12, init_std=0.1, logit_scale=20.0)


def _gemma(root):
    return write_diffusion_gemma_checkpoint(root / "gemma", make_diffusion_gemma_config(), seed=5, feedback=0.1)


@pytest.fixture(params=["sdar", "llada2", "clover", "diffusion_gemma"])
def base(request, tmp_path, tiny_model_dir, tiny_llada2_dir):
    return {"sdar": lambda: tiny_model_dir, "llada2": lambda: tiny_llada2_dir}.get(
        request.param, lambda: {"clover": _clover, "diffusion_gemma": _gemma}[request.param](tmp_path)
    )()


def _run(llm: LLM, lora=None) -> list[tuple[list[int], list[float]]]:
    outputs = llm.generate(PROMPTS, PARAMS, lora_request=lora)
    return [
        (list(c.token_ids), [top[t].logprob for t, top in zip(c.token_ids, c.logprobs)])
        for c in (o.outputs[0] for o in outputs)
    ]


def test_engine_with_adapter_equals_engine_on_merged_weights(base, tmp_path):
    adapter = adapter_for_checkpoint(base, tmp_path / "adapter")
    merged = merge_into_checkpoint(base, adapter, tmp_path / "merged")
    llm = LLM(str(base), enable_lora=True, max_lora_rank=4, dtype="float32")
    got, expected = _run(llm, LoRARequest("a", 1, str(adapter))), _run(LLM(str(merged), dtype="float32"))
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in expected]
    assert max(abs(a - b) for (_, x), (_, y) in zip(got, expected) for a, b in zip(x, y)) <= 1e-4
    assert [tokens for tokens, _ in _run(llm)] != [tokens for tokens, _ in got]  # not a no-op
    modules = {t for t in json.loads((adapter / "adapter_config.json").read_text())["target_modules"]}
    assert modules & {"q_proj", "query_key_value", "in_proj_qkv", "down_proj"}


CLOVER_TARGETS = r".*\.(self_attn\.[qkvo]_proj|linear_attn\.(in_proj_qkv|in_proj_z|in_proj_a|in_proj_b|out_proj)" + (
    r"|shared_expert\.(gate|up|down)_proj)"
)


def test_clover_logits_equal_transformers_peft_merged(tmp_path):
    from tests.model.test_clover_moe_parity import _hf_model

    peft = pytest.importorskip("peft")
    base = write_clover_moe_checkpoint(tmp_path / "m", make_clover_moe_config(), seed=3, init_std=0.1, diffusion=False)
    hf = _hf_model(base)
    torch.manual_seed(4)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=CLOVER_TARGETS, init_lora_weights=False)
    wrapped = peft.get_peft_model(hf, lora)
    wrapped.save_pretrained(tmp_path / "adapter")
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert not saved.get("target_parameters"), saved  # no routed expert targeted
    merged = wrapped.merge_and_unload().eval()
    family, _ = load_args(base)
    args, ours = load_model(base, dtype="float32")
    slots = LoRASlots(ours, family, args, 1, 4, torch.float32, torch.device("cpu"))
    slots.load(1, "a", tmp_path / "adapter")
    assert {"in_proj_qkv", "out_proj", "q_proj", "down_proj"} <= {name.rsplit(".", 1)[-1] for name in slots.layers}
    ids = torch.randint(0, 300, (2, 70), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = merged(input_ids=ids).logits.float()
        with lora_context(torch.ones(ids.numel(), dtype=torch.long)):
            got = ours.compute_logits(DenseClover(ours).forward_causal(ids)[0])
        plain = ours.compute_logits(DenseClover(ours).forward_causal(ids)[0])
    assert (got - expected).abs().max().item() <= 1e-4
    assert (plain - expected).abs().max().item() > 1e-2
