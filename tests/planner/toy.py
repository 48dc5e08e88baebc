"""A toy MoE config with round numbers, so the tests' hand arithmetic stays short.

hidden 1024, 4 layers, 8 query / 2 KV heads of 128, 8 experts top-2 of width 512, vocab 1000, untied, block 16.
"""

from __future__ import annotations

from diffuserve.planner.hardware import custom_hardware
from diffuserve.planner.inputs import CostInputs, Deployment, Efficiency, Workload
from diffuserve.planner.model_spec import ModelSpec, spec_from_config
from diffuserve.planner.plan import Plan, make_plan
from diffuserve.planner.units import GiB

TOY_CONFIG = dict(
    architectures=["SDARMoeForCausalLM"],
    hidden_size=1024,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=128,
    intermediate_size=4096,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=512,
    vocab_size=1000,
    tie_word_embeddings=False,
    max_position_embeddings=8192,
    block_length=16,
)


def toy_spec(**overrides: object) -> ModelSpec:
    return spec_from_config({**TOY_CONFIG, **overrides}, "toy")


HAND_CHECKED_WORKLOAD = Workload(
    context_length=2048,
    prompt_tokens=976,
    output_tokens=48,
    block_length=16,
    tpf=2.0,
    concurrency=4,
    experts_touched_fraction=0.5,
)
"""The decode step the roofline tests work out by hand: 4 sequences at a mean context of 1000, block 16, TPF 2."""


def hand_checked_plan(spec: ModelSpec) -> Plan:
    """`spec` planned for HAND_CHECKED_WORKLOAD on 8 GiB / 1 TB/s / 100 TFLOP/s hardware, every efficiency 1 and no
    step overhead, so each number is exactly its formula."""
    return make_plan(
        spec,
        custom_hardware(8 * GiB, 1e12, 100e12),
        Deployment(),
        HAND_CHECKED_WORKLOAD,
        Efficiency(1.0, 1.0, 0.0),
        CostInputs(gpu_hour_price=1.0, capex_per_gpu=1.0),
    )
