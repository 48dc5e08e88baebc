"""Expert-touch model and the per-forward roofline, checked by hand on the toy model."""

from __future__ import annotations

import pytest

from diffuserve.planner.hardware import custom_hardware
from diffuserve.planner.inputs import CostInputs, Deployment, Efficiency, Workload
from diffuserve.planner.model_presets import load_model
from diffuserve.planner.plan import make_plan
from diffuserve.planner.roofline import experts_touched_fraction
from diffuserve.planner.units import GiB
from tests.planner.toy import hand_checked_plan, toy_spec


def test_uniform_expert_touch():
    """E 256, k 8: 1 - (31/32)^32 = 0.6379 for one 32-token block; 1 - (31/32)^1 = 1/32 for one AR token."""
    spec, _ = load_model("LLaDA2.0-mini")
    assert experts_touched_fraction(spec, 32, 32) == pytest.approx(0.6379, abs=1e-4)
    assert experts_touched_fraction(spec, 1, 32) == pytest.approx(1 / 32)


def test_measured_experts_per_block_extrapolates_over_blocks():
    """Measured 64 of 256 experts per block: one block 0.25; four blocks 1 - 0.75^4 = 0.6836."""
    spec, _ = load_model("LLaDA2.0-mini")
    assert experts_touched_fraction(spec, 32, 32, per_block=64) == pytest.approx(0.25)
    assert experts_touched_fraction(spec, 128, 32, per_block=64) == pytest.approx(0.68359375)


def test_dense_model_touches_no_experts():
    assert experts_touched_fraction(toy_spec(num_experts=0), 64, 16) == 0.0


def test_decode_forward_by_hand():
    """Toy, 4 sequences x S 16 = 64 tokens, experts touched given as 0.5, mean context 976 + 48/2 = 1000.
    Bytes: dense 21,057,536 + LM head 2,048,000 + experts 100,663,296 x 0.5 = 73,437,184; KV read
    4 x 1008 (16-token pages) x 4096 = 16,515,072 -> 89,952,256 B / 1 TB/s = 89.95 us.
    FLOPs: matmul params without input embedding and LM head = 25,159,680 - 2 x 1,024,000 = 23,111,680;
    2 x 23,111,680 x 64 = 2,958,295,040; LM head 2 x 1,024,000 x 64 = 131,072,000; attention
    4 x 4 layers x 8 heads x 128 x 64 x 1000 = 1,048,576,000 -> 4,137,943,040 / 100 TFLOP/s = 41.4 us.
    Memory-bound: 89.95 us per forward; 4 x TPF 2 / 89.95 us = 88,936 tokens/s."""
    plan = hand_checked_plan(toy_spec())
    forward = plan.decode.forward
    assert forward.tokens == 64
    assert forward.weight_bytes == 73_437_184
    assert forward.kv_bytes == 16_515_072
    assert (forward.matmul_flops, forward.attention_flops) == (3_089_367_040, 1_048_576_000)
    assert forward.flops == 4_137_943_040
    assert forward.t_forward == pytest.approx(89.952256e-6)
    assert forward.bound == "memory-bound"
    assert plan.decode.tokens_per_s_total == pytest.approx(8 / 89.952256e-6)


def test_token_budget_limits_sequences_per_forward():
    """max_num_batched_tokens 32 holds 2 blocks of 16: 4 sequences take turns, 2 per forward."""
    workload = Workload(context_length=2048, prompt_tokens=976, output_tokens=48, block_length=16, concurrency=4)
    plan = make_plan(
        toy_spec(),
        custom_hardware(8 * GiB, 1e12, 100e12),
        Deployment(max_num_batched_tokens=32),
        workload,
        Efficiency(),
        CostInputs(gpu_hour_price=1.0, capex_per_gpu=1.0),
    )
    assert plan.decode.seqs_per_forward == 2 and plan.decode.forward.tokens == 32
    assert plan.decode.tokens_per_s_per_seq == pytest.approx(plan.decode.tokens_per_s_total / 4)


def test_ttft_is_prefill_plus_forwards_to_first_block():
    """TTFT = prefill + ceil(S 16 / TPF 2) = 8 decode forwards."""
    workload = Workload(context_length=8192, prompt_tokens=6000, output_tokens=1000, block_length=16, tpf=2.0)
    plan = make_plan(
        toy_spec(),
        custom_hardware(8 * GiB, 1e12, 100e12),
        Deployment(),
        workload,
        Efficiency(),
        CostInputs(gpu_hour_price=1.0, capex_per_gpu=1.0),
    )
    assert plan.prefill.num_chunks == 2
    assert plan.prefill.ttft == pytest.approx(plan.prefill.t_prefill + 8 * plan.decode.forward.t_forward)


def test_tensor_parallel_adds_all_reduce_time():
    """tp 2: 2 all-reduces x 4 layers x 2 (tp-1)/tp x 64 tokens x 1024 x 2 B = 1,048,576 B over 32 GB/s."""
    workload = Workload(context_length=2048, prompt_tokens=976, output_tokens=48, block_length=16, concurrency=4)
    plan = make_plan(
        toy_spec(),
        custom_hardware(8 * GiB, 1e12, 100e12),
        Deployment(num_gpus=2, tensor_parallel_size=2),
        workload,
        Efficiency(),
        CostInputs(gpu_hour_price=1.0, capex_per_gpu=1.0),
    )
    assert plan.decode.forward.t_comm == pytest.approx(1_048_576 / 32e9)
