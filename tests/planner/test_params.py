"""Parameter counts: hand-worked on a toy config, and the presets against their published totals.

"Active" counts embeddings and the LM head (the convention of the published figures we compare with)."""

from __future__ import annotations

import pytest

from diffuserve.planner.model_presets import MODEL_PRESETS, load_model
from diffuserve.planner.model_spec import spec_from_config
from diffuserve.planner.params import count_parameters
from tests.planner.toy import TOY_CONFIG, toy_spec


def test_toy_counts_by_hand():
    """attention/layer: q 1024*1024 + k 1024*256 + v 1024*256 + o 1024*1024 + q/k norms 2*128 = 2,621,696;
    x 4 layers = 10,486,784. Experts: 8 * 3 * 1024 * 512 * 4 = 50,331,648. Router 8 * 1024 * 4 = 32,768.
    Embeddings (untied) 2 * 1000 * 1024 = 2,048,000. Norms (2 * 4 + 1) * 1024 = 9,216.
    Total = 62,908,416. Active = 12,576,768 (non-expert) + 50,331,648 * 2/8 = 25,159,680."""
    spec = toy_spec()
    counts = count_parameters(spec)
    assert counts.attention == 10_486_784
    assert counts.routed_experts == 50_331_648
    assert counts.router == 32_768
    assert counts.embeddings == 2_048_000
    assert counts.total == 62_908_416
    assert counts.active(spec) == 25_159_680
    assert counts.active_non_embedding(spec) == 25_159_680 - 2_048_000


def test_tied_embeddings_count_once_and_dense_layers_come_from_first_k_dense_replace():
    """Tied: 1000 * 1024 once. first_k_dense_replace=1: layer 0 runs the dense MLP (3 * 1024 * 4096 =
    12,582,912) and has no router or experts: experts 3 layers * 12,582,912 = 37,748,736."""
    spec = toy_spec(tie_word_embeddings=True, first_k_dense_replace=1)
    counts = count_parameters(spec)
    assert counts.embeddings == 1_024_000 and counts.input_embedding == 0
    assert counts.dense_mlp == 12_582_912
    assert counts.routed_experts == 37_748_736
    assert spec.num_moe_layers == 3


def test_gemma_style_k_eq_v_full_layers_have_no_v_projection():
    """One sliding layer (16 heads x 64, 4 KV heads) and one full layer (2 KV heads x 128, K reused as V),
    hidden 512: sliding 512*(1024 + 256 + 256) + 1024*512 + 128 = 1,310,848; full q 512*2048 + k 512*256 +
    o 2048*512 + 256 = 2,228,480. Dense GeGLU runs beside the experts on both layers: 2 * 3 * 512 * 256."""
    spec = spec_from_config(
        {
            "model_type": "diffusion_gemma",
            "text_config": {
                "model_type": "diffusion_gemma_text",
                "hidden_size": 512,
                "num_hidden_layers": 2,
                "num_attention_heads": 16,
                "num_key_value_heads": 4,
                "head_dim": 64,
                "num_global_key_value_heads": 2,
                "global_head_dim": 128,
                "attention_k_eq_v": True,
                "intermediate_size": 256,
                "num_experts": 4,
                "top_k_experts": 2,
                "moe_intermediate_size": 128,
                "vocab_size": 100,
                "sliding_window": 64,
                "layer_types": ["sliding_attention", "full_attention"],
                "tie_word_embeddings": True,
            },
        }
    )
    counts = count_parameters(spec)
    assert counts.attention == 1_310_848 + 2_228_480
    assert counts.dense_mlp == 2 * 3 * 512 * 256
    assert spec.num_moe_layers == 2
    assert [g.window for g in spec.attention] == [64, None]


@pytest.mark.parametrize("name", ["SDAR-30B-A3B", "LLaDA2.0-mini", "DiffusionGemma-26B-A4B"])
def test_preset_totals_match_published(name):
    """Computed from the config: SDAR 30.53B / 3.35B, LLaDA2.0-mini 16.26B / 1.43B (789.1M without
    embeddings; the card says 789M), DiffusionGemma 25.23B / 3.82B. Clover (34.66B / 3.45B against a rounded
    "35B, ~3B active") is held to transformers' count in test_clover.py."""
    spec, preset = load_model(name)
    counts = count_parameters(spec)
    assert counts.total == pytest.approx(preset.published_total, rel=0.02)
    assert counts.active(spec) == pytest.approx(preset.published_active, rel=0.10)


def test_llada2_flash_against_its_headline_numbers():
    """The dFactory llada2_flash config gives 102.89B total: 31 MoE layers x 256 x 3 x 4096 x 1024 = 99.86B of
    experts + 1.21B attention + 1.29B untied embeddings + 0.39B shared experts + 0.11B dense layer 0. The card's
    "100B" is a rounded headline (2.9% below the config); its 6.1B active (4.8B non-embedding) matches
    6.15B (4.86B). So the total is held to 3%, the active count to the 10% of the others."""
    spec, preset = load_model("LLaDA2.0-flash")
    counts = count_parameters(spec)
    assert counts.total == pytest.approx(102.89e9, rel=1e-3)
    assert counts.total == pytest.approx(preset.published_total, rel=0.03)
    assert counts.active(spec) == pytest.approx(preset.published_active, rel=0.10)
    assert counts.active_non_embedding(spec) == pytest.approx(4.8e9, rel=0.02)


def test_every_preset_parses_like_a_config_json(tmp_path):
    import json

    for name, preset in MODEL_PRESETS.items():
        (tmp_path / "config.json").write_text(json.dumps(preset.config))
        from_file, _ = load_model(str(tmp_path))
        assert count_parameters(from_file).total == count_parameters(load_model(name)[0]).total


def test_missing_field_names_it():
    config = dict(TOY_CONFIG)
    del config["hidden_size"]
    with pytest.raises(ValueError, match="hidden_size"):
        spec_from_config(config)
