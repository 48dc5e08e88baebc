"""The planner's weight bytes for each --weight-dtype are what the engine holds after loading with that
--quantization (scales, zeros and the 16-bit norms, routers and gates included): within 2 %, for every family, on
bf16 models whose widths the default int4 group of 128 divides."""

from __future__ import annotations

import json

import pytest

from diffuserve.model.loader import load_model
from diffuserve.model.quant.scheme import make_scheme
from diffuserve.model.weight_bytes import weight_bytes
from diffuserve.planner.inputs import Deployment
from diffuserve.planner.memory import memory_breakdown
from diffuserve.planner.model_spec import spec_from_config
from diffuserve.planner.params import count_parameters
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.llada2_checkpoint import write_llada2_checkpoint
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint

WIDE = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32, moe_intermediate_size=128)


def _write(root, family: str):
    if family == "sdar":
        config = make_config(
            "sdar-moe-tiny",
            **WIDE,
            intermediate_size=256,
            shared_expert_intermediate_size=128,
            first_k_dense_replace=1,
            vocab_size=512,
            torch_dtype="bfloat16",
        )
        return write_random_checkpoint(root / family, config)
    if family == "llada2":
        config = {**WIDE, "intermediate_size": 256, "vocab_size": 512, "torch_dtype": "bfloat16"}
        return write_llada2_checkpoint(root / family, config)
    config = make_clover_moe_config(
        **WIDE,
        shared_expert_intermediate_size=128,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        vocab_size=512,
        torch_dtype="bfloat16",
    )
    return write_clover_moe_checkpoint(root / family, config)


@pytest.fixture(scope="module")
def wide_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("wide")
    return {family: _write(root, family) for family in ("sdar", "llada2", "clover")}


@pytest.mark.parametrize("weight_dtype", ["bf16", "int8", "int4", "fp8"])
@pytest.mark.parametrize("family", ["sdar", "llada2", "clover"])
def test_engine_weight_bytes_equal_the_planners_within_2_percent(wide_dirs, family, weight_dtype):
    method = None if weight_dtype == "bf16" else weight_dtype
    _, model = load_model(wide_dirs[family], max_model_len=64, quantization=make_scheme(method))
    measured = weight_bytes(model).total
    spec = spec_from_config(json.loads((wide_dirs[family] / "config.json").read_text()), family)
    planned = memory_breakdown(
        spec, count_parameters(spec), Deployment(weight_dtype=weight_dtype), 1 << 34, 0, 4
    ).weight_bytes
    assert abs(planned - measured) / measured < 0.02, (planned, measured)
