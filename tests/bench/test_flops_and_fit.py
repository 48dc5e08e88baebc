"""FLOPs / bytes of the sdar-moe-bench and clover-moe-bench shapes worked by hand, and the calibration fit
on synthetic steps.

sdar-moe-bench: H 512, 8 layers, 8 query / 2 KV heads of D 64, 16 experts top-2 of width 256, vocab 8192, fp32.
Per layer, multiply-adds per token: QKV 512 x (8 + 2 x 2) x 64 = 393,216 and O 512 x 512 = 262,144
(attention 655,360), router 512 x 16 = 8,192, two experts 2 x 3 x 512 x 256 = 786,432: 1,449,984.
x 8 layers x 2 = 23,199,744 FLOPs per token. LM head: 2 x 512 x 8192 = 8,388,608 per logit row. Attention:
4 x 8 x 64 x 8 layers = 16,384 per (query, key) pair.
Bytes read in full every step: attention 8 x 655,360 + routers 8 x 8,192 + norms 8 x (2 x 512 + 2 x 64) + 512
+ LM head 4,194,304 = 9,512,448 weights x 4 B = 38,049,792; one expert 3 x 512 x 256 x 4 B = 1,572,864.
K/V per token: 2 x 8 layers x 2 heads x 64 x 4 B = 8,192.
"""

from __future__ import annotations

import pytest

from diffuserve.bench.calibration import StepSample, fit_efficiency
from diffuserve.bench.flops import model_cost
from diffuserve.bench.probes import MachineRates
from diffuserve.model.config import qwen3_args_from_hf
from diffuserve.model.families.clover_moe.config import clover_moe_args_from_hf, with_diffusion
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config
from diffuserve.reference.random_checkpoint import make_config


def test_sdar_moe_bench_cost():
    config = make_config("sdar-moe-bench", mask_token_id=259)
    cost = model_cost(qwen3_args_from_hf(config, {}), weight_itemsize=4, kv_itemsize=4)
    assert cost.flops_per_token == 23_199_744
    assert cost.flops_per_logit_row == 8_388_608
    assert cost.flops_per_attention_pair == 16_384
    assert cost.dense_weight_bytes == 38_049_792
    assert cost.expert_weight_bytes == 1_572_864
    assert cost.kv_bytes_per_token == 8_192
    # One step: 64 tokens, 40 logit rows, 64 x 300 pairs; 10 experts touched per layer, 600 cached keys read.
    assert cost.step_flops(64, 40, 64 * 300) == 64 * 23_199_744 + 40 * 8_388_608 + 64 * 300 * 16_384
    assert cost.step_bytes(10, 600) == 38_049_792 + 8 * 10 * 1_572_864 + 600 * 8_192


def test_fit_recovers_overhead_and_flops_fraction():
    """Steps timed as 10 ms + max(bytes / 1 GB/s, FLOPs / (10 GFLOP/s x 0.4)) give back 0.4 and 10 ms."""
    rates = MachineRates(
        flops_per_s=1e10, matmul_size=1024, bandwidth_bytes_per_s=1e9, bandwidth_buffer_bytes=1 << 28, dtype="float32"
    )
    samples = [StepSample(flops, 2e7, 0.01 + max(2e7 / 1e9, flops / 4e9)) for flops in (1e8, 4e8, 1e9, 2e9, 5e9)]
    fitted = fit_efficiency(samples, rates)
    assert fitted.flops_fraction == pytest.approx(0.4)
    assert fitted.step_overhead_s == pytest.approx(0.01, abs=1e-6)
    assert fitted.rms_relative_error == pytest.approx(0, abs=1e-9)
    with pytest.raises(ValueError, match="no decode steps"):
        fit_efficiency([], rates)


def test_clover_moe_bench_cost():
    """clover-moe-bench with the block-diffusion tensors, fp32, worked by hand (H 512; 6 GDN + 2 attention layers).

    GDN mixer: Hk 4 x Dk 64, Hv 8 x Dv 64, conv_dim 2 x 256 + 512 = 1,024, k 4. in_proj_qkv / z / b / a
    512 x (1,024 + 512 + 2 x 8) = 794,624, out_proj 512 x 512 = 262,144, conv taps 1,024 x (4 + 3 right) = 7,168,
    A_log, dt_bias and the three bd_softmax_* 5 x 8 = 40, norm 64: 1,064,040, x 6 = 6,384,240. Gated attention:
    512 x (2 x 8 + 2 x 2) x 64 = 655,360 (query and its gate, K, V) + O 262,144 = 917,504, x 2 = 1,835,008.
    Delta rule: 6 x 3.5 x 8 x 64 x 64 = 688,128. MoE, every layer: router 8,192 + two experts 786,432 + shared
    expert 393,216 and its gate 512 = 1,188,352, x 8 = 9,506,816.
    Per token: 18,414,192 multiply-adds = 36,828,384 FLOPs. Dense bytes: mixers 8,219,248 + routers and shared
    experts 8 x 401,920 = 3,215,360 + norms 9,728 + LM head 4,194,304 = 15,638,640 x 4 B. State per sequence:
    6 x (S 8 x 64 x 64 x 4 B = 131,072 + ring 1,024 x 3 x 4 B = 12,288) = 860,160. K/V: 2 x 2 layers x 2 heads x
    64 x 4 B = 2,048 per token.
    """
    config = make_clover_moe_config("clover-moe-bench", mask_token_id=259)
    args = with_diffusion(clover_moe_args_from_hf(config, {}), True)
    cost = model_cost(args, weight_itemsize=4, kv_itemsize=4)
    assert cost.flops_per_token == 36_828_384
    assert cost.flops_per_attention_pair == 4 * 8 * 64 * 2
    assert cost.dense_weight_bytes == 15_638_640 * 4
    assert cost.gdn_weight_bytes == 6_384_240 * 4
    assert cost.state_bytes_per_seq == 860_160
    assert cost.kv_bytes_per_token == 2_048
    # One step of 3 sequences: each state read and written once.
    assert cost.step_bytes(10, 600, 3) == 15_638_640 * 4 + 8 * 10 * 1_572_864 + 600 * 2_048 + 3 * 2 * 860_160
    assert cost.gdn_step_bytes(1) == 6_384_240 * 4 + 2 * 860_160
    assert cost.gdn_step_flops(64) == 64 * 2 * (6_384_240 + 688_128)
