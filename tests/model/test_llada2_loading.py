"""LLaDA2 directories as they are on the Hub: sharded BailingMoeV2 weights, mask / EOS ids from the tokenizer,
the `<role>` chat template, the reference config defaults; and the planner's LLaDA2.0-mini parameter count
against the model this implementation builds."""

from __future__ import annotations

import json

import pytest
import torch

from diffuserve.model.families.llada2.config import llada2_args_from_hf
from diffuserve.model.families.llada2.model import LLaDA2ForBlockDiffusion
from diffuserve.model.loader import load_model
from diffuserve.planner.model_presets import find_preset
from diffuserve.planner.model_presets import load_model as load_preset
from diffuserve.planner.params import count_parameters
from diffuserve.reference.llada2_checkpoint import TINY, write_llada2_checkpoint
from diffuserve.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    return write_llada2_checkpoint(tmp_path_factory.mktemp("llada2") / "sharded", seed=5, max_shard_bytes=60_000)


def test_sharded_hub_layout_loads_with_ids_from_the_tokenizer(sharded, tmp_path):
    index = json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) > 1
    assert {
        "model.word_embeddings.weight",
        "model.layers.1.attention.query_key_value.weight",
        "model.layers.1.attention.dense.weight",
        "model.layers.1.attention.query_layernorm.weight",
        "model.layers.1.mlp.gate.expert_bias",
        "model.layers.1.mlp.experts.7.down_proj.weight",
        "model.layers.1.mlp.shared_experts.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
    } <= set(index)
    config = json.loads((sharded / "config.json").read_text())
    assert "mask_token_id" not in config and "eos_token_id" not in config  # as the released configs
    args, model = load_model(sharded)
    tokenizer = Tokenizer(sharded)
    assert args.mask_token_id == tokenizer.hf.convert_tokens_to_ids("<|mask|>")
    assert args.eos_token_ids == (tokenizer.hf.convert_tokens_to_ids("<|endoftext|>"),)
    single = write_llada2_checkpoint(tmp_path / "single", seed=5)
    reference = load_model(single)[1].state_dict()
    assert all(torch.equal(t, reference[name]) for name, t in model.state_dict().items())


def test_config_ids_win_over_the_tokenizer_and_a_missing_mask_is_named(tmp_path):
    path = write_llada2_checkpoint(tmp_path / "m", {"mask_token_id": 300, "eos_token_id": [257, 256]})
    args, _ = load_model(path)
    assert args.mask_token_id == 300 and args.eos_token_ids == (257, 256)
    (path / "tokenizer.json").unlink()
    config = json.loads((path / "config.json").read_text())
    del config["mask_token_id"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="mask_token_id"):
        load_model(path)


def test_chat_template_renders_llada2_turns(sharded):
    tokenizer = Tokenizer(sharded)
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "detailed thinking off"}, {"role": "user", "content": "hi"}]
    )
    assert text == (
        "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>hi<|role_end|><role>ASSISTANT</role>"
    )
    ids = tokenizer.encode("ok<|role_end|><|endoftext|>", add_special_tokens=False)
    assert tokenizer.decode(ids) == "ok"  # the turn markers are special tokens


def test_absent_keys_take_the_reference_config_class_defaults():
    minimal = {
        k: TINY[k]
        for k in (
            "architectures",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
            "vocab_size",
        )
    }
    args = llada2_args_from_hf({**minimal, "mask_token_id": 1, "num_key_value_heads": 0})
    assert args.num_kv_heads == args.num_heads and args.head_dim == 16
    assert args.rms_norm_eps == 1e-5 and args.rope.partial_rotary_factor == 0.5 and args.rope.theta == 10000.0
    assert args.extra == {
        "use_qk_norm": True,
        "use_bias": True,
        "n_group": 8,
        "topk_group": 4,
        "routed_scaling_factor": 2.5,
    }
    assert args.dense_layer_ids == frozenset() and args.shared_expert_intermediate_size == 0
    assert args.block_length == 32 and args.max_position_embeddings == 16384


def test_planner_preset_matches_this_implementations_parameter_count():
    """The preset is an excerpt of LLaDA2.0-mini's config.json, whose other fields include `use_bias: false`
    (models.md §1.1) and no mask id (the tokenizer's). The planner counts every weight matrix, the norms and
    the q/k norms, but not the router's expert_bias vector (E per MoE layer)."""
    preset = find_preset("LLaDA2.0-mini")
    args = llada2_args_from_hf({**preset.config, "use_bias": False, "mask_token_id": 156895})
    with torch.device("meta"):
        model = LLaDA2ForBlockDiffusion(args, 1)
    ours = sum(p.numel() for p in model.parameters())
    expert_bias = sum(p.numel() for name, p in model.named_parameters() if name.endswith("expert_bias"))
    assert expert_bias == 19 * 256
    spec, _ = load_preset("LLaDA2.0-mini")
    assert ours - expert_bias == count_parameters(spec).total
    assert abs(ours - preset.published_total) / preset.published_total < 0.03
