"""clover_moe causal logits == transformers' Qwen3_5MoeForCausalLM on the same random tiny weights (fp32).

Our writer produces the checkpoint in each Hub layout; transformers reads it through its own conversion
(prefix change, per-expert -> fused experts), so the name mapping is checked from both sides."""

from __future__ import annotations

import json

import pytest
import torch

from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.families.clover_moe.gdn_preview import DIFFUSION_TENSORS
from diffuserve.model.loader import load_model
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

ATOL = 1e-4
OURS_ONLY = ("architectures", "model_type", "torch_dtype", "block_length", "mask_token_id", "text_config")


def _hf_model(model_dir, dtype=torch.float32):
    config = json.loads((model_dir / "config.json").read_text())
    fields = {**{k: v for k, v in config.items() if k not in OURS_ONLY}, **config.get("text_config", {})}
    hf_config = transformers.Qwen3_5MoeTextConfig(**fields)
    model, info = transformers.Qwen3_5MoeForCausalLM.from_pretrained(
        model_dir, config=hf_config, dtype=dtype, output_loading_info=True
    )
    # transformers' Qwen3.5 has no block-diffusion tensors: the only keys it may leave are those.
    unexpected = [k for k in info["unexpected_keys"] if k.rsplit(".", 1)[-1] not in DIFFUSION_TENSORS]
    assert not info["missing_keys"] and not unexpected, info
    return model.eval()


def _max_diff(model_dir, length: int, batch: int = 2, dtype: str = "float32") -> float:
    hf = _hf_model(model_dir, getattr(torch, dtype))
    _, ours = load_model(model_dir, dtype=dtype)
    ids = torch.randint(0, 300, (batch, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(input_ids=ids).logits.float()
        hidden, state = DenseClover(ours).forward_causal(ids)
        got = ours.compute_logits(hidden)
    assert state.length == length
    return (got - expected).abs().max().item()


CASES = {
    "3:1 pattern, fused experts": (dict(num_hidden_layers=8), dict()),
    "explicit layer_types, per-expert, multimodal prefix": (
        dict(
            num_hidden_layers=4,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        ),
        dict(per_expert=True, prefix="model.language_model."),
    ),
    "partial rotary 0.5, GQA 8:1": (
        dict(num_attention_heads=8, num_key_value_heads=1, partial_rotary_factor=0.5, linear_num_key_heads=1),
        {},
    ),
    "sharded, per-expert": (dict(), dict(per_expert=True, max_shard_bytes=60_000)),
    "attention bias, tied head": (dict(attention_bias=True, tie_word_embeddings=True), {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(tmp_path, case):
    config_overrides, layout = CASES[case]
    config = make_clover_moe_config(**config_overrides)
    model_dir = write_clover_moe_checkpoint(tmp_path / "m", config, seed=3, init_std=0.1, diffusion=False, **layout)
    if layout.get("max_shard_bytes"):
        assert len(list(model_dir.glob("*.safetensors"))) > 2
    assert _max_diff(model_dir, length=70) < ATOL  # 70 tokens: two GDN chunks of 64


def test_long_prompt_crosses_several_chunks(tmp_path):
    model_dir = write_clover_moe_checkpoint(
        tmp_path / "m", make_clover_moe_config(), seed=4, init_std=0.1, diffusion=False
    )
    assert _max_diff(model_dir, length=200, batch=1) < ATOL


def test_text_config_layout(tmp_path):
    """The multimodal config.json keeps the text fields under `text_config`."""
    flat = make_clover_moe_config()
    nested = {k: flat[k] for k in ("architectures", "model_type", "torch_dtype", "block_length")}
    nested["text_config"] = {k: v for k, v in flat.items() if k not in nested}
    model_dir = write_clover_moe_checkpoint(tmp_path / "m", nested, seed=5, init_std=0.1, diffusion=False)
    assert _max_diff(model_dir, length=20) < ATOL


def test_bf16_checkpoint(tmp_path):
    config = make_clover_moe_config(torch_dtype="bfloat16")
    model_dir = write_clover_moe_checkpoint(tmp_path / "m", config, seed=6, init_std=0.1, diffusion=False)
    _, model = load_model(model_dir)
    assert model.lm_head.weight.dtype == torch.bfloat16
    assert _max_diff(model_dir, length=70, dtype="bfloat16") < 0.05  # 0.0 in our runs


def test_directory_written_by_transformers(tmp_path):
    """A `Qwen3_5MoeForCausalLM.save_pretrained` directory (its config.json spelling: rope_parameters, layer_types,
    dtype) loads as the autoregressive clover_moe model."""
    config = transformers.Qwen3_5MoeTextConfig(
        vocab_size=300,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        full_attention_interval=2,
    )
    torch.manual_seed(0)
    hf = transformers.Qwen3_5MoeForCausalLM(config).eval()
    with torch.no_grad():
        for param in hf.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    hf.save_pretrained(tmp_path / "m")
    args, ours = load_model(tmp_path / "m")
    assert args.architecture == "Qwen3_5MoeForCausalLM" and args.rope.partial_rotary_factor == 0.25
    assert not ours.has_diffusion
    ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        diff = (
            (ours.compute_logits(DenseClover(ours).forward_causal(ids)[0]) - hf(input_ids=ids).logits)
            .abs()
            .max()
            .item()
        )
    assert diff < ATOL
