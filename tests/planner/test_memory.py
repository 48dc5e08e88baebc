"""Bytes per device: weights (TP / EP splits, quantization), KV per token and per sequence, workspace."""

from __future__ import annotations

import pytest

from diffuserve.planner.inputs import Deployment
from diffuserve.planner.memory import kv_bytes_per_sequence, kv_bytes_per_token, memory_breakdown
from diffuserve.planner.model_presets import load_model
from diffuserve.planner.params import count_parameters
from diffuserve.planner.units import GiB, KiB
from tests.planner.toy import toy_spec


def _breakdown(spec, deployment):
    return memory_breakdown(spec, count_parameters(spec), deployment, 2 * GiB, 0, spec.block_length)


def test_weights_per_device_bf16_tp1():
    """Non-expert non-embedding 10,528,768 params x 2 B = 21,057,536; embeddings 2,048,000 x 2 = 4,096,000;
    experts 50,331,648 x 2 = 100,663,296 -> 125,816,832 B."""
    memory = _breakdown(toy_spec(), Deployment())
    assert memory.dense_weight_bytes == 21_057_536
    assert memory.embedding_bytes == 4_096_000
    assert memory.expert_weight_bytes == 100_663_296
    assert memory.weight_bytes == 125_816_832


def test_tensor_and_expert_parallel_split_weights():
    """tp 2: attention halves, the router (32,768) and norms (9,216) stay whole on every device, and so do the
    embeddings and LM head (as the engine keeps them): (10,486,784 / 2 + 41,984) x 2 B = 10,570,752; experts /
    max(tp, ep). tp 4 > 2 KV heads: each device holds 1 of the 2 K/V heads' projections (2 x 4 x 1024 x 128
    params), not a quarter. tp 2 ep 4 (4 GPUs): experts / 4."""
    spec = toy_spec()
    tp2 = _breakdown(spec, Deployment(num_gpus=2, tensor_parallel_size=2))
    assert tp2.dense_weight_bytes == 10_570_752 and tp2.expert_weight_bytes == 100_663_296 / 2
    assert tp2.embedding_bytes == 4_096_000
    tp4 = _breakdown(spec, Deployment(num_gpus=4, tensor_parallel_size=4))
    kv = 2 * 4 * 1024 * 2 * 128
    assert tp4.dense_weight_bytes == ((10_486_784 - kv) / 4 + kv / 2 + 41_984) * 2
    ep4 = _breakdown(spec, Deployment(num_gpus=4, tensor_parallel_size=2, expert_parallel_size=4))
    assert ep4.expert_weight_bytes == 100_663_296 / 4


def test_fp8_weights_keep_bf16_embeddings():
    """FP8: 1 B + one fp32 scale per 128x128 block (4/16384 B) per weight; embeddings stay 2 B."""
    memory = _breakdown(toy_spec(), Deployment(weight_dtype="fp8"))
    assert memory.expert_weight_bytes == pytest.approx(50_331_648 * (1 + 4 / 16384))
    assert memory.embedding_bytes == 4_096_000


def test_gqa_kv_bytes_per_token_and_replication_beyond_kv_heads():
    """2 (K,V) x 4 layers x 2 KV heads x 128 x 2 B = 4096 B. tp 2: 1 head per device -> 2048 B. tp 4 > 2 KV
    heads: each device still holds 1 head (replicated) -> 2048 B. FP8 KV halves it."""
    group = toy_spec().attention[0]
    assert kv_bytes_per_token(Deployment(), group) == 4096
    assert kv_bytes_per_token(Deployment(num_gpus=2, tensor_parallel_size=2), group) == 2048
    assert kv_bytes_per_token(Deployment(num_gpus=4, tensor_parallel_size=4), group) == 2048
    assert kv_bytes_per_token(Deployment(kv_dtype="fp8"), group) == 2048


def test_clover_kv_per_token_and_per_128k_sequence():
    """Attention layers only: 2 x 10 layers x 2 KV heads x 256 x 2 B = 20,480 B = 20 KiB; x 131,072 = 2.5 GiB."""
    spec, _ = load_model("Clover-35B-A3B")
    assert kv_bytes_per_token(Deployment(), spec.attention[0]) == 20 * KiB
    assert kv_bytes_per_sequence(spec, Deployment(), 131_072, 32) == 2.5 * GiB


def test_kv_sequence_rounds_up_to_pages():
    """Page = 16 (block 16): 1000 tokens -> 1008 x 4096 B = 4,128,768 B."""
    assert kv_bytes_per_sequence(toy_spec(), Deployment(), 1000, 16) == 4_128_768


def test_sliding_window_layers_cap_kv_per_sequence():
    """DiffusionGemma: sliding layers 2 x 25 x 8 x 256 x 2 B = 204,800 B/token, kept for at most
    window 1024 + block 256 = 1280 tokens; full layers 2 x 5 x 2 x 512 x 2 B = 20,480 B/token.
    262,144 tokens: 20,480 x 262,144 + 204,800 x 1280 = 5,368,709,120 + 262,144,000 = 5,630,853,120 B.
    1000 tokens (page 256 -> 1024 < 1280): (204,800 + 20,480) x 1024 = 230,686,720 B."""
    spec, _ = load_model("DiffusionGemma-26B-A4B")
    sliding, full = spec.attention
    assert (kv_bytes_per_token(Deployment(), sliding), kv_bytes_per_token(Deployment(), full)) == (204_800, 20_480)
    assert kv_bytes_per_sequence(spec, Deployment(), 262_144, 256) == 5_630_853_120
    assert kv_bytes_per_sequence(spec, Deployment(), 1000, 256) == 230_686_720


def test_activation_workspace_by_hand():
    """Per token 2 B x (4 x 1024 + (8 + 2 x 2) x 128 + 2 x (2 experts x 512)) = 2 x 7680 = 15,360 B;
    x 4096 batched tokens = 62,914,560. Logits: min(4096, 64 seqs x 16) = 1024 x 1000 x 8 B = 8,192,000."""
    memory = _breakdown(toy_spec(), Deployment())
    assert memory.activation_bytes == 62_914_560 + 8_192_000


def test_overhead_adds_nccl_when_parallel_and_overrides_win():
    spec = toy_spec()
    assert _breakdown(spec, Deployment(num_gpus=2, tensor_parallel_size=2)).overhead_bytes == 2 * GiB
    given = _breakdown(spec, Deployment(runtime_overhead_bytes=123, activation_bytes=456))
    assert (given.overhead_bytes, given.activation_bytes) == (123, 456)
