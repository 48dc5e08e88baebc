"""Checkpoint loading: sharded and single files, per-expert and fused expert layouts, tied heads, and errors
that name the weight."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from diffuserve.model.loader import load_model
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def config():
    return make_config("sdar-moe-tiny", shared_expert_intermediate_size=24, mlp_only_layers=[1])


def test_sharded_fused_and_per_expert_layouts_load_identically(tmp_path, config):
    single = write_random_checkpoint(tmp_path / "single", config, seed=3)
    sharded = write_random_checkpoint(tmp_path / "sharded", config, seed=3, max_shard_bytes=20_000)
    fused = write_random_checkpoint(tmp_path / "fused", config, seed=3, per_expert=False)
    assert (sharded / "model.safetensors.index.json").is_file()
    assert any("experts.gate_up_proj" in k for k in load_file(fused / "model.safetensors"))
    reference = _params(load_model(single)[1])
    for path in (sharded, fused):
        loaded = _params(load_model(path)[1])
        assert loaded.keys() == reference.keys()
        assert all(torch.equal(loaded[k], reference[k]) for k in reference)


def test_tied_embeddings_share_the_head(tmp_path, config):
    path = write_random_checkpoint(tmp_path / "tied", {**config, "tie_word_embeddings": True})
    _, model = load_model(path)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_dtype_override(tmp_path, config):
    _, model = load_model(write_random_checkpoint(tmp_path / "m", config), dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16


def _rewrite(path, mutate) -> None:
    tensors = load_file(path / "model.safetensors")
    mutate(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def test_missing_weight_is_named(tmp_path, config):
    path = write_random_checkpoint(tmp_path / "m", config)
    _rewrite(path, lambda t: t.pop("model.layers.0.self_attn.k_proj.weight"))
    with pytest.raises(ValueError, match=r"missing weights model\.layers\.0\.self_attn\.qkv_proj\.weight"):
        load_model(path)


def test_unexpected_weight_is_named(tmp_path, config):
    path = write_random_checkpoint(tmp_path / "m", config)
    _rewrite(path, lambda t: t.update({"model.layers.0.mlp.bogus.weight": torch.zeros(2)}))
    with pytest.raises(ValueError, match=r"unexpected weight 'model\.layers\.0\.mlp\.bogus\.weight'"):
        load_model(path)


def test_misshapen_weight_is_named(tmp_path, config):
    path = write_random_checkpoint(tmp_path / "m", config)
    _rewrite(path, lambda t: t.update({"model.norm.weight": torch.zeros(3)}))
    with pytest.raises(ValueError, match=r"'model\.norm\.weight' has shape \[3\], expected \[64\]"):
        load_model(path)


def test_transformers5_config_spellings(tmp_path, config):
    spelled = dict(config)
    spelled["num_local_experts"] = spelled.pop("num_experts")
    spelled["rope_parameters"] = {"rope_type": "default", "rope_theta": spelled.pop("rope_theta")}
    path = write_random_checkpoint(tmp_path / "m", spelled)
    args, _ = load_model(path)
    assert args.num_experts == 4 and args.rope.theta == 10000.0
    assert json.loads((path / "config.json").read_text())["num_local_experts"] == 4
