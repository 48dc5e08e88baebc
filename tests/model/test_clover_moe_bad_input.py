"""Bad clover_moe input: each problem is a one-line ValueError naming the field or tensor, the value and what
was expected."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file, save_file

from diffuserve.model.loader import load_model
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint


def _error(model_dir) -> str:
    with pytest.raises(ValueError) as info:
        load_model(model_dir)
    message = str(info.value)
    assert "\n" not in message
    return message


def _write(tmp_path, diffusion=True, **overrides):
    return write_clover_moe_checkpoint(tmp_path / "m", make_clover_moe_config(**overrides), diffusion=diffusion)


def _edit_config(model_dir, **changes):
    config = json.loads((model_dir / "config.json").read_text())
    config.update(changes)
    (model_dir / "config.json").write_text(json.dumps(config))


def _edit_weights(model_dir, edit):
    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def test_layer_types_length(tmp_path):
    model_dir = _write(tmp_path)
    _edit_config(model_dir, layer_types=["linear_attention", "full_attention", "linear_attention"])
    message = _error(model_dir)
    assert "`layer_types` has 3 entries" in message and "num_hidden_layers = 4" in message


def test_unknown_layer_type(tmp_path):
    model_dir = _write(tmp_path)
    _edit_config(model_dir, layer_types=["linear_attention", "sliding_attention", "linear_attention", "full_attention"])
    assert "['sliding_attention']" in _error(model_dir)


def test_no_attention_layer(tmp_path):
    model_dir = _write(tmp_path)
    _edit_config(model_dir, layer_types=["linear_attention"] * 4)
    assert "`layer_types` gives no 'full_attention' layer" in _error(model_dir)
    _edit_config(model_dir, layer_types=None, full_attention_interval=5)
    assert "`full_attention_interval` over 4 layers gives no 'full_attention' layer" in _error(model_dir)


@pytest.mark.parametrize(
    "field, value, other",
    [
        ("num_key_value_heads", 3, "`num_attention_heads` = 4 is not a multiple of `num_key_value_heads` = 3"),
        ("linear_num_key_heads", 3, "`linear_num_value_heads` = 4 is not a multiple of `linear_num_key_heads` = 3"),
    ],
)
def test_head_counts_must_divide(tmp_path, field, value, other):
    model_dir = _write(tmp_path)
    _edit_config(model_dir, **{field: value})
    assert other in _error(model_dir)


def test_missing_gdn_tensor(tmp_path):
    model_dir = _write(tmp_path)
    _edit_weights(model_dir, lambda t: t.pop("model.layers.1.linear_attn.A_log"))
    assert "missing weights model.layers.1.linear_attn.A_log" in _error(model_dir)


def test_diffusion_tensor_of_the_wrong_shape(tmp_path):
    model_dir = _write(tmp_path)
    name = "model.layers.2.linear_attn.bd_softmax_history_bias"
    _edit_weights(model_dir, lambda t: t.update({name: t[name][:3].contiguous()}))
    assert f"weight {name!r} has shape [3], expected [4]" in _error(model_dir)


def test_partial_diffusion_tensors(tmp_path):
    """A checkpoint with some diffusion tensors must have all of them."""
    model_dir = _write(tmp_path)
    _edit_weights(model_dir, lambda t: t.pop("model.layers.0.linear_attn.conv_right_weight"))
    assert "missing weights model.layers.0.linear_attn.conv_right_weight" in _error(model_dir)


def test_diffusion_needs_a_mask_token(tmp_path):
    model_dir = _write(tmp_path)
    config = json.loads((model_dir / "config.json").read_text())
    del config["mask_token_id"]
    (model_dir / "config.json").write_text(json.dumps(config))
    assert "missing field `mask_token_id`" in _error(model_dir)


def test_remote_code_we_do_not_run(tmp_path):
    model_dir = _write(tmp_path, diffusion=False)
    _edit_config(
        model_dir,
        architectures=["CloverMoeV2ModelLM"],
        auto_map={"AutoModelForCausalLM": "modeling_clover_moe_v2.CloverMoeV2ModelLM"},
    )
    message = _error(model_dir)
    assert "'CloverMoeV2ModelLM'" in message and "modeling_clover_moe_v2.CloverMoeV2ModelLM" in message
    assert "trust_remote_code" in message


def test_remote_code_of_a_known_architecture_is_not_needed(tmp_path):
    """The real Clover config carries auto_map (custom code); we run our own implementation of it."""
    model_dir = _write(tmp_path, diffusion=False)
    _edit_config(model_dir, auto_map={"AutoModelForCausalLM": "modeling_clover_moe.CloverMoeModelLM"})
    args, _ = load_model(model_dir)
    assert args.architecture == "CloverMoeModelLM"
