"""The planner against transformers' own Qwen3.5-MoE (Clover's trunk) as the reference: a config.json written from
`Qwen3_5MoeTextConfig(...).to_dict()` is planned with the parameter counts of the model transformers builds from
it (on the meta device: no weights). The planner itself never imports transformers or torch."""

from __future__ import annotations

import json

import pytest

from diffuserve.planner.inputs import Deployment
from diffuserve.planner.memory import kv_bytes_per_token
from diffuserve.planner.model_presets import load_model
from diffuserve.planner.params import count_parameters
from diffuserve.planner.recurrent_state import state_bytes_per_sequence
from tests.planner.hybrid_toy import HYBRID_TOY_CONFIG

pytestmark = pytest.mark.hf
torch = pytest.importorskip("torch")
qwen3_5_moe = pytest.importorskip("transformers.models.qwen3_5_moe")

TOY_FIELDS = {
    k: v
    for k, v in HYBRID_TOY_CONFIG.items()
    if k not in ("architectures", "model_type", "full_attention_interval", "block_length")
}


def _reference_counts(config) -> tuple[int, float]:
    """(total, active) of transformers' model: active = all but the routed experts + routed x k / E."""
    with torch.device("meta"):
        model = qwen3_5_moe.Qwen3_5MoeForCausalLM(config)
    total = sum(p.numel() for p in model.parameters())
    routed = sum(p.numel() for name, p in model.named_parameters() if ".mlp.experts." in name)
    return total, total - routed + routed * config.num_experts_per_tok / config.num_experts


def _planned(tmp_path, config_dict: dict):
    (tmp_path / "config.json").write_text(json.dumps(config_dict))
    spec, _ = load_model(str(tmp_path))
    return spec, count_parameters(spec)


def test_default_text_config_is_the_published_shape(tmp_path):
    """`Qwen3_5MoeTextConfig()` (model_type qwen3_5_moe_text, explicit layer_types): 34.66B total, 3.45B active,
    2.44B without embeddings; 10 attention layers, 20 KiB/token, 61.4 MiB of state per sequence."""
    config = qwen3_5_moe.Qwen3_5MoeTextConfig()
    spec, counts = _planned(tmp_path, config.to_dict())
    total, active = _reference_counts(config)
    assert counts.total == total == 34_660_610_688
    assert counts.active(spec) == active
    assert round(counts.active(spec) / 1e9, 2) == 3.45 and round(counts.active_non_embedding(spec) / 1e9, 2) == 2.44
    assert (spec.num_attention_layers, spec.linear_attention.num_layers) == (10, 30)
    assert kv_bytes_per_token(Deployment(), spec.attention[0]) == 20_480
    assert state_bytes_per_sequence(spec, Deployment()) == 64_389_120


@pytest.mark.parametrize("interval", [2, 4])
def test_small_configs_count_exactly_like_transformers(tmp_path, interval):
    config = qwen3_5_moe.Qwen3_5MoeTextConfig(**TOY_FIELDS, full_attention_interval=interval)
    spec, counts = _planned(tmp_path, config.to_dict())
    total, active = _reference_counts(config)
    assert (counts.total, counts.active(spec)) == (total, active)
    assert spec.num_attention_layers == 4 // interval


def test_multimodal_config_plans_its_text_model(tmp_path):
    """`Qwen3_5MoeConfig` nests the text fields under `text_config`; the planner sizes the text model."""
    text = qwen3_5_moe.Qwen3_5MoeTextConfig(**TOY_FIELDS)
    config = qwen3_5_moe.Qwen3_5MoeConfig(text_config=text.to_dict())
    spec, counts = _planned(tmp_path, config.to_dict())
    assert counts.total == _reference_counts(text)[0]
    assert spec.linear_attention.num_layers == 3
