"""diffusion_gemma config.json / generation_config.json -> ModelArgs and decoding defaults, and the one-line
errors for what diffuserve does not run. Standard library only: no model is built."""

from __future__ import annotations

import json
import re

import pytest

from diffuserve.model.families.diffusion_gemma.config import (
    FULL,
    SLIDING,
    GemmaRope,
    RenoiseDefaults,
    cache_layout,
    diffusion_gemma_args_from_hf,
    gemma_args,
    renoise_defaults,
)
from diffuserve.model.loader import load_args
from diffuserve.model.shapes import PagedKV
from diffuserve.planner.model_presets import DIFFUSION_GEMMA_GENERATION_CONFIG, MODEL_PRESETS

PUBLISHED = MODEL_PRESETS["DiffusionGemma-26B-A4B"].config


def _config(**text) -> dict:
    base = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=6, num_attention_heads=4)
    return {"architectures": ["DiffusionGemmaForBlockDiffusion"], "text_config": {**base, **text}}


def test_the_published_config_reads_as_published():
    """The planner's preset is the published config.json: the engine's parser reads it into the same shape."""
    args = diffusion_gemma_args_from_hf(PUBLISHED)
    gemma = gemma_args(args)
    assert (args.hidden_size, args.num_layers, args.num_heads, args.vocab_size) == (2816, 30, 16, 262144)
    assert (gemma.sliding.num_kv_heads, gemma.sliding.head_dim, gemma.sliding_window) == (8, 256, 1024)
    assert (gemma.full.num_kv_heads, gemma.full.head_dim) == (2, 512)
    assert gemma.layer_types == ((SLIDING,) * 5 + (FULL,)) * 5
    assert gemma.full.rope == GemmaRope("proportional", 1e6, 0.25)
    assert gemma.sliding.rope == GemmaRope("default", 1e4)
    assert (args.num_experts, args.num_experts_per_tok, args.moe_intermediate_size) == (128, 8, 704)
    assert (args.intermediate_size, gemma.canvas_length, args.block_length, gemma.final_logit_softcapping) == (
        2112,
        256,
        256,
        30.0,
    )
    assert gemma.kind_index(29) == 4 and gemma.kind_index(28) == 24


def test_transformers_per_layer_table_reads_like_the_published_fields():
    """save_pretrained writes `per_layer_config` instead of global_head_dim / num_global_key_value_heads."""
    published = _config(num_key_value_heads=2, global_head_dim=16, num_global_key_value_heads=1)
    written = _config(num_key_value_heads=2, per_layer_config={"5": {"head_dim": 16, "num_key_value_heads": 1}})
    assert diffusion_gemma_args_from_hf(published) == diffusion_gemma_args_from_hf(written)


def test_transformers_defaults():
    """No layer_types: every sixth layer full, the last forced full; window 512; full head dim 512, the
    sliding layers' KV heads; proportional RoPE 0.25 on full layers."""
    gemma = gemma_args(diffusion_gemma_args_from_hf(_config(num_hidden_layers=4)))
    assert gemma.layer_types == (SLIDING, SLIDING, SLIDING, FULL)
    assert (gemma.sliding_window, gemma.full.head_dim, gemma.full.num_kv_heads) == (512, 512, 4)
    assert gemma.full.rope == GemmaRope("proportional", 1e6, 0.25)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**_config(), "tie_word_embeddings": False}, "tie_word_embeddings is false"),
        (_config(use_bidirectional_attention="all"), "use_bidirectional_attention is 'all'"),
        (_config(attention_bias=True), "attention_bias is true"),
        (_config(layer_types=[SLIDING] * 5), "`layer_types` has 5 entries, expected num_hidden_layers = 6"),
        (_config(layer_types=[SLIDING] * 5 + ["linear_attention"]), "contains ['linear_attention']"),
        (_config(hidden_activation="silu"), "hidden_activation 'silu' is not supported"),
        (_config(num_key_value_heads=3), "`num_key_value_heads` = 3 does not divide num_attention_heads = 4"),
        (
            _config(rope_parameters={SLIDING: {"rope_type": "yarn"}, FULL: {"rope_type": "default"}}),
            "rope_parameters.sliding_attention",
        ),
        (_config(rope_parameters={SLIDING: {"rope_type": "default"}}), "has no 'full_attention' entry"),
        (
            _config(num_hidden_layers=12, per_layer_config={"5": {"head_dim": 16}, "11": {"head_dim": 32}}),
            "`per_layer_config` gives layers of one kind different shapes",
        ),
    ],
)
def test_unsupported_configs_are_one_line_errors(config, message):
    with pytest.raises(ValueError, match=r"^config\.json: ") as error:
        diffusion_gemma_args_from_hf(config)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_generation_config_defaults():
    assert renoise_defaults(DIFFUSION_GEMMA_GENERATION_CONFIG) == RenoiseDefaults(
        48, 0.1, 0.4, 0.8, 1, 0.005, 256, (1, 106, 50), 0
    )
    # save_pretrained's nulls (and a missing file) mean transformers' global defaults; no EOS from config.json.
    assert renoise_defaults({"max_denoising_steps": None, "t_min": None}) == RenoiseDefaults()


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("max_denoising_steps", 0, "an integer >= 1"),
        ("t_min", 0.9, ">= 0 and below t_max = 0.8"),
        ("stability_threshold", -1, "an integer >= 0"),
        ("confidence_threshold", 0.0, "> 0"),
    ],
)
def test_bad_generation_config_names_the_field(field, value, expected):
    with pytest.raises(
        ValueError, match=re.escape(f"generation_config.json: `{field}` is {value}; expected {expected}")
    ):
        renoise_defaults({field: value})


def test_the_family_declares_its_caches_and_request_defaults(tmp_path):
    """Full layers page K/V of their own shape, sliding layers a window group, a canvas state of C x H beside
    them; generation_config.json's renoise knobs become the request defaults under SamplingParams names."""
    (tmp_path / "config.json").write_text(json.dumps(_config()))
    family, args = load_args(tmp_path)
    assert family.name == "diffusion_gemma" and args.block_length == 256
    layout = cache_layout(args, "bf16")
    gemma = gemma_args(args)
    assert layout.groups == [f"window{gemma.sliding_window}", "kv"]
    assert [s.group == "kv" for s in layout.layers] == [t == FULL for t in gemma.layer_types]
    assert layout.paged("kv")[0] == PagedKV(gemma.full.num_kv_heads, gemma.full.head_dim, "bf16")
    assert layout.canvas is not None and layout.canvas.bytes_per_sequence() == 256 * args.hidden_size * 2
    generation = {"max_denoising_steps": 12, "sampler_config": {"entropy_bound": 0.5}, "t_min": 0.1}
    assert family.generation_defaults is not None
    assert family.generation_defaults(generation) == {
        "decoder": "renoise",
        "steps": 12,
        "entropy_bound": 0.5,
        "t_min": 0.1,
        "t_max": 0.8,
        "stability_threshold": 1,
        "confidence_threshold": 0.005,
    }
