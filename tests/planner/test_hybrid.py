"""Hybrid models (Gated DeltaNet + gated full attention): parsing, parameters, the two memory terms (KV per token
over the attention layers only, a constant state per sequence), capacity and the roofline, by hand on a toy."""

from __future__ import annotations

import pytest

from diffuserve.planner.hardware import custom_hardware
from diffuserve.planner.inputs import CostInputs, Deployment, Efficiency, Workload
from diffuserve.planner.memory import kv_bytes_per_sequence, memory_breakdown
from diffuserve.planner.model_spec import spec_from_config
from diffuserve.planner.params import count_parameters
from diffuserve.planner.plan import make_plan
from diffuserve.planner.recurrent_state import state_bytes_per_sequence
from diffuserve.planner.units import GiB
from tests.planner.hybrid_toy import HYBRID_TOY_CONFIG, hybrid_toy_spec
from tests.planner.toy import hand_checked_plan, toy_spec

COSTS = CostInputs(gpu_hour_price=1.0, capex_per_gpu=1.0)


def test_layer_pattern_from_full_attention_interval_and_layer_types():
    """Interval 4 over 4 layers: 3 GDN then 1 attention; interval 2: 2 and 2; an explicit list wins."""
    spec = hybrid_toy_spec()
    assert (spec.num_attention_layers, spec.linear_attention.num_layers) == (1, 3)
    assert hybrid_toy_spec(full_attention_interval=2).num_attention_layers == 2
    listed = hybrid_toy_spec(layer_types=["full_attention", "linear_attention", "full_attention", "full_attention"])
    assert (listed.num_attention_layers, listed.linear_attention.num_layers) == (3, 1)


def test_text_fields_under_text_config_read_like_top_level():
    """A multimodal Qwen3.5-MoE config.json nests the text model under `text_config`."""
    nested = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": {**HYBRID_TOY_CONFIG, "model_type": "qwen3_5_moe_text"},
    }
    assert count_parameters(spec_from_config(nested)).total == count_parameters(hybrid_toy_spec()).total


def test_parameters_by_hand():
    """attention (1 layer): q + gate 512 x 1024 + k, v 512 x 128 each + o 512 x 512 + q/k norms 256 = 917,760.
    GDN per layer: in_proj_qkv 512 x 512 + z 512 x 256 + b, a 2 x 512 x 4 + out 256 x 512 + conv 512 x 4
    + A_log, dt_bias 8 + norm 64 = 530,504; x 3 = 1,591,512. Shared expert 3 x 512 x 128 + gate 512 = 197,120;
    x 4 = 788,480. Router 8 x 512 x 4 = 16,384. Experts 4 x 8 x 3 x 512 x 128 = 6,291,456. Embeddings
    2 x 1000 x 512 = 1,024,000. Norms 9 x 512 = 4,608. Total 10,634,200; active 4,342,744 + 6,291,456 / 4."""
    spec = hybrid_toy_spec()
    counts = count_parameters(spec)
    assert counts.attention == 917_760
    assert counts.linear_attention == 1_591_512
    assert counts.shared_experts == 788_480
    assert counts.total == 10_634_200
    assert counts.active(spec) == 4_342_744 + 6_291_456 // 4


def test_state_and_kv_by_hand():
    """State per sequence: 3 GDN layers x (S 4 x 64 x 64 x 4 B = 65,536 + ring 3 x 512 x 2 B = 3,072) = 205,824 B.
    KV per token: 2 x 1 layer x 1 KV head x 128 x 2 B = 512 B; 1000 tokens -> 1008 (pages of 16) x 512.
    tp 2 splits the state by heads; fp32 weights keep the conv ring in fp32 (3 x 512 x 4 B = 6,144)."""
    spec = hybrid_toy_spec()
    assert state_bytes_per_sequence(spec, Deployment()) == 205_824
    assert kv_bytes_per_sequence(spec, Deployment(), 1000, 16) == 1008 * 512
    assert state_bytes_per_sequence(spec, Deployment(num_gpus=2, tensor_parallel_size=2)) == 205_824 / 2
    assert state_bytes_per_sequence(spec, Deployment(weight_dtype="fp32")) == 3 * (65_536 + 6_144)
    memory = memory_breakdown(spec, count_parameters(spec), Deployment(), GiB, 0, 16)
    assert (memory.kv_bytes_per_token, memory.state_bytes_per_sequence) == (512, 205_824)


def test_capacity_counts_kv_and_state_and_compares_with_full_attention():
    """Pool = 1 GiB x 0.5 - weights 10,634,200 x 2 B - activations 15,602,512 = 500,000,000 B. One 4096-token
    sequence: KV 4096 x 512 = 2,097,152 + state 205,824 = 2,302,976 -> 217 sequences (238 if the state were
    forgotten). All 4 layers full attention: 4096 x 2048 = 8,388,608 -> 59."""
    workload = Workload(context_length=4096, prompt_tokens=2048, output_tokens=1024, block_length=16)
    deployment = Deployment(gpu_memory_utilization=0.5, activation_bytes=15_602_512, runtime_overhead_bytes=0)
    plan = make_plan(hybrid_toy_spec(), custom_hardware(GiB, 1e12, 1e14), deployment, workload, Efficiency(), COSTS)
    capacity = plan.capacity
    assert plan.memory.kv_pool_bytes == 500_000_000
    assert (capacity.kv_bytes_per_sequence, capacity.state_bytes_per_sequence) == (2_097_152, 205_824)
    assert capacity.max_seqs_by_kv == 217
    assert (capacity.full_attention_kv_bytes_per_sequence, capacity.full_attention_max_seqs) == (8_388_608, 59)


def test_max_context_leaves_room_for_the_state():
    """217 sequences: (500,000,000 / 217 - 205,824) / 512 = 4098.0 tokens -> 256 pages of 16 = 4096."""
    workload = Workload(context_length=4096, prompt_tokens=2048, output_tokens=1024, block_length=16, concurrency=217)
    deployment = Deployment(
        gpu_memory_utilization=0.5, activation_bytes=15_602_512, runtime_overhead_bytes=0, max_num_seqs=256
    )
    plan = make_plan(hybrid_toy_spec(), custom_hardware(GiB, 1e12, 1e14), deployment, workload, Efficiency(), COSTS)
    assert plan.capacity.max_context_at_concurrency == 4096


def test_decode_forward_reads_and_writes_the_state():
    """4 sequences x S 16 = 64 tokens, experts touched 0.5, mean context 976 + 24 = 1000.
    Bytes: dense (4,342,744 - 1,024,000) x 2 + LM head 1,024,000 + experts 12,582,912 x 0.5 = 13,952,944;
    KV 4 x 1008 x 512 = 2,064,384; state read + write 2 x 4 x 205,824 = 1,646,592.
    Recurrence FLOPs: 7 x 3 layers x 4 heads x 64 x 64 x 64 tokens = 22,020,096; attention
    4 x 1 layer x 4 heads x 128 x 64 x 1000 = 131,072,000."""
    plan = hand_checked_plan(hybrid_toy_spec())
    forward = plan.decode.forward
    assert (forward.weight_bytes, forward.kv_bytes, forward.state_bytes) == (13_952_944, 2_064_384, 1_646_592)
    assert (forward.recurrent_flops, forward.attention_flops) == (22_020_096, 131_072_000)
    assert forward.t_memory == pytest.approx((13_952_944 + 2_064_384 + 1_646_592) / 1e12)


def test_models_without_linear_layers_have_no_state():
    spec = toy_spec()
    assert spec.linear_attention is None and state_bytes_per_sequence(spec, Deployment()) == 0


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(linear_num_value_heads=None, model_type="hybrid"), "`linear_num_value_heads` is missing"),
        (dict(linear_num_value_heads=3), "not a multiple of `linear_num_key_heads` = 2"),
        (dict(layer_types=["linear_attention"] * 3), "`layer_types` lists 3 layers but num_hidden_layers is 4"),
        (dict(layer_types=["mamba"] * 4), "['mamba'] are not modelled by the planner"),
        (dict(full_attention_interval=0), "`full_attention_interval` is 0"),
        (dict(full_attention_interval=8), "no layer is full or sliding-window attention"),
    ],
)
def test_bad_hybrid_configs_name_the_field(changes, message):
    with pytest.raises(ValueError) as error:
        hybrid_toy_spec(**changes)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_tensor_parallel_must_divide_the_gdn_key_heads():
    workload = Workload(context_length=2048, prompt_tokens=976, output_tokens=48, block_length=16)
    with pytest.raises(ValueError, match="does not divide the 2 linear-attention key heads"):
        make_plan(
            hybrid_toy_spec(),
            custom_hardware(8 * GiB, 1e12, 1e14),
            Deployment(num_gpus=4, tensor_parallel_size=4),
            workload,
            Efficiency(),
            COSTS,
        )
