"""LLaDA2 logits against transformers' Glm4MoeForCausalLM (the closest in-library BailingMoeV2), fp32, same random
weights written under LLaDA2's Hub names and loaded by our loader, explicit block-causal mask.

Glm4Moe differs from LLaDA2 in four places (models.md §9), each neutralised so the comparison is exact:
- rejected router groups: transformers 4.x masks them with 0.0, LLaDA2 (and transformers 5) with -inf; the two
  agree while every biased score sigmoid + bias is > 0, so the expert biases here are drawn non-negative;
- the expert bias: Glm4Moe keeps it in fp32, LLaDA2 rounds it to the load dtype: identical in fp32;
- the expert combine: Glm4Moe accumulates in the model dtype, LLaDA2 in fp32: identical in fp32;
- Glm4Moe's o_proj has no bias: for `use_bias` its o_proj modules are swapped for biased copies.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from diffuserve.model.layers.attention import DenseAttentionInputs, block_causal_mask
from diffuserve.model.loader import load_model
from diffuserve.model.step_inputs import StepInputs
from diffuserve.reference.llada2_checkpoint import TINY, write_llada2_tokenizer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

BLOCK = 8


def _glm4_moe(config: dict) -> nn.Module:
    hf_config = transformers.Glm4MoeConfig(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config["num_key_value_heads"],
        max_position_embeddings=config["max_position_embeddings"],
        rms_norm_eps=config["rms_norm_eps"],
        rope_parameters={
            "rope_type": "default",
            "rope_theta": config["rope_theta"],
            "partial_rotary_factor": config["partial_rotary_factor"],
        },
        attention_bias=config["use_qkv_bias"],
        moe_intermediate_size=config["moe_intermediate_size"],
        num_experts_per_tok=config["num_experts_per_tok"],
        n_shared_experts=config["num_shared_experts"],
        n_routed_experts=config["num_experts"],
        routed_scaling_factor=config["routed_scaling_factor"],
        n_group=config["n_group"],
        topk_group=config["topk_group"],
        first_k_dense_replace=config["first_k_dense_replace"],
        norm_topk_prob=True,
        use_qk_norm=True,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.Glm4MoeForCausalLM(hf_config).eval()
    if config["use_bias"]:
        for layer in model.model.layers:
            old = layer.self_attn.o_proj
            layer.self_attn.o_proj = nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith("e_score_correction_bias"):
                tensor.uniform_(0.0, 0.3)  # non-negative: see the module docstring
            elif not name.endswith("inv_freq"):
                tensor.normal_(0, 0.1)
    return model


def _to_llada2_names(state: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """transformers 5 Glm4Moe state dict -> LLaDA2 Hub checkpoint tensors."""
    inter = config["moe_intermediate_size"]
    out = {}
    for name, tensor in state.items():
        name = name.replace("model.embed_tokens.", "model.word_embeddings.").replace(".self_attn.", ".attention.")
        name = name.replace(".o_proj.", ".dense.").replace(".q_norm.", ".query_layernorm.")
        name = name.replace(".k_norm.", ".key_layernorm.").replace(".e_score_correction_bias", ".expert_bias")
        if name.endswith("experts.gate_up_proj"):
            for e, fused in enumerate(tensor):
                out[f"{name[: -len('gate_up_proj')]}{e}.gate_proj.weight"] = fused[:inter]
                out[f"{name[: -len('gate_up_proj')]}{e}.up_proj.weight"] = fused[inter:]
        elif name.endswith("experts.down_proj"):
            for e, down in enumerate(tensor):
                out[f"{name[: -len('down_proj')]}{e}.down_proj.weight"] = down
        elif ".attention.q_proj." in name:  # rows [Q | K | V]
            hf_name = name.replace(".attention.", ".self_attn.")
            parts = [state[hf_name.replace("q_proj", proj)] for proj in ("q_proj", "k_proj", "v_proj")]
            out[name.replace("q_proj", "query_key_value")] = torch.cat(parts)
        elif ".attention.k_proj." not in name and ".attention.v_proj." not in name:
            out[name] = tensor
    return {k: v.contiguous() for k, v in out.items()}


def _write(path, hf_model, config: dict) -> None:
    write_llada2_tokenizer(path, config["vocab_size"])
    state = {k: v for k, v in hf_model.state_dict().items() if not k.endswith("inv_freq")}
    tensors = _to_llada2_names(state, config)
    half = len(tensors) // 2
    names = sorted(tensors)
    weight_map = {}
    for i, chunk in enumerate((names[:half], names[half:])):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({k: tensors[k] for k in chunk}, str(path / file))
        weight_map.update(dict.fromkeys(chunk, file))
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (path / "config.json").write_text(json.dumps({**config, "block_length": BLOCK}))


@pytest.mark.parametrize("biases", [False, True], ids=["no-bias", "qkv-and-dense-bias"])
def test_logits_match_glm4_moe(tmp_path, biases):
    config = {**TINY, "use_qkv_bias": biases, "use_bias": biases}
    hf_model = _glm4_moe(config)
    _write(tmp_path, hf_model, config)
    args, ours = load_model(tmp_path, dtype="float32")
    assert args.rope.partial_rotary_factor == 0.5 and args.dense_layer_ids == frozenset({0})
    length = 21  # two full blocks of 8 and a partial one
    ids = torch.randint(0, config["vocab_size"], (2, length), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(length)
    mask = block_causal_mask(positions, length, BLOCK)  # [T, T]
    additive = torch.zeros(length, length).masked_fill(~mask, float("-inf"))[None, None].expand(2, 1, -1, -1)
    with torch.no_grad():
        expected = hf_model(input_ids=ids, attention_mask=additive, position_ids=positions[None].expand(2, -1)).logits
        got = ours.compute_logits(
            ours(ids, positions[None].expand(2, -1), StepInputs(DenseAttentionInputs(mask[None, None])))
        )
    assert got.dtype == torch.float32
    assert (got - expected).abs().max().item() <= 1e-4
