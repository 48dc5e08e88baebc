"""The Clover-35B-A3B preset is the published hybrid architecture, and the planner's answers for it are the
hand-checked ones (../shared/notes/clover.md): 10 attention layers, 20 KiB of K/V per token, 61.4 MiB of GDN state
per sequence, 34.66B parameters, 3.45B active (2.44B without embeddings)."""

from __future__ import annotations

import argparse
import json

import pytest

from diffuserve.cli import plan as cli
from diffuserve.planner.inputs import Deployment
from diffuserve.planner.memory import kv_bytes_per_token
from diffuserve.planner.model_presets import load_model
from diffuserve.planner.params import count_parameters
from diffuserve.planner.recurrent_state import state_bytes_per_sequence
from diffuserve.planner.units import GiB

KV_PER_TOKEN = 10 * 2 * 2 * 256 * 2
"""10 attention layers x (K, V) x 2 KV heads x 256 dims x 2 B (bf16) = 20,480 B; the 30 GDN layers keep none."""
STATE_PER_SEQUENCE = 30 * (32 * 128 * 128 * 4 + 3 * 8192 * 2)
"""30 GDN layers x (S: 32 value heads x 128 x 128 fp32 + conv ring: (k - 1) 3 x conv_dim 8192 bf16) = 64,389,120 B
(61.4 MiB), whatever the context; conv_dim = 2 x 16 x 128 + 32 x 128."""
TRANSFORMERS_TOTAL = 34_660_610_688
"""Parameters of `Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig())` on the meta device (transformers 5.24)."""
ROUTED_EXPERTS = 40 * 256 * 3 * 2048 * 512
EMBEDDINGS = 2 * 248_320 * 2048


def _run(capsys, *argv: str) -> str:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(list(argv))) == 0
    return capsys.readouterr().out


def test_json_at_128k_reports_the_published_shape(capsys):
    document = json.loads(_run(capsys, "Clover-35B-A3B", "--context-length", "131072", "--json"))
    model, memory, capacity = document["model"], document["memory_per_device"], document["capacity"]
    assert (model["num_layers"], model["attention_layers"], model["linear_attention_layers"]) == (40, 10, 30)
    assert memory["kv_bytes_per_token"] == KV_PER_TOKEN == 20_480
    assert memory["state_bytes_per_sequence"] == STATE_PER_SEQUENCE == 64_389_120
    assert capacity["kv_bytes_per_sequence"] == KV_PER_TOKEN * 131_072 == 2.5 * GiB
    assert capacity["state_bytes_per_sequence"] == STATE_PER_SEQUENCE
    assert capacity["max_seqs_by_kv"] == memory["kv_pool_bytes"] // (KV_PER_TOKEN * 131_072 + STATE_PER_SEQUENCE)
    assert capacity["full_attention_kv_bytes_per_sequence"] == 4 * KV_PER_TOKEN * 131_072 == 10 * GiB
    assert capacity["full_attention_max_seqs"] == memory["kv_pool_bytes"] // (10 * GiB)


def test_parameters_match_transformers_count():
    """Total within 3% of the published 35B and equal to transformers' count; active = non-expert + routed x 8/256
    = 2,448,355,968 + 1,006,632,960 = 3,454,988,928 (3.45B), 2,437,870,208 (2.44B) without embeddings."""
    spec, preset = load_model("Clover-35B-A3B")
    counts = count_parameters(spec)
    assert counts.total == pytest.approx(preset.published_total, rel=0.03)
    assert counts.total == TRANSFORMERS_TOTAL
    assert counts.routed_experts == ROUTED_EXPERTS
    assert counts.active(spec) == TRANSFORMERS_TOTAL - ROUTED_EXPERTS + ROUTED_EXPERTS * 8 / 256 == 3_454_988_928
    assert counts.active_non_embedding(spec) == 3_454_988_928 - EMBEDDINGS == 2_437_870_208


def test_text_states_the_sequences_and_the_full_attention_comparison(capsys):
    """Pool 56.28 GiB / (2.50 GiB + 61.41 MiB) = 21 sequences; all-attention 10 GiB each: 5."""
    out = _run(capsys, "Clover-35B-A3B", "--hardware", "H200", "--context-length", "131072")
    assert "34.66B total, 3.45B active (published 35.00B / 3.00B)" in out and "(2.44B without)" in out
    assert "KV per token 20.00 KiB" in out and "recurrent state 61.41 MiB (constant) = 2.56 GiB" in out
    assert "21 sequences fit at 131,072 tokens" in out
    assert (
        "Hybrid      10 of 40 layers keep K/V (30 linear-attention layers: a constant state), so 21 sequences "
        "fit; with full attention in all 40 layers (same heads) a 131,072-token sequence would need 10.00 GiB "
        "and 5 would fit (4.2x fewer)"
    ) in out


def test_explain_shows_both_memory_terms_and_the_gdn_roofline(capsys):
    out = _run(capsys, "Clover-35B-A3B", "--context-length", "131072", "--explain")
    assert (
        "KV/token (full attention) = 2 x L 10 x Hkv 2/device x D 256 x 2 B (bf16) = 20.00 KiB (30 "
        "linear-attention layers keep no K/V)"
    ) in out
    assert (
        "state/sequence (Gated DeltaNet) = L 30 x (S: Hv 32 x Dk 128 x Dv 128 x 4 B (fp32) 2.00 MiB + conv "
        "ring: (k-1) 3 x conv_dim 8192 x 2 B 48.00 KiB) / tp 1 = 61.41 MiB"
    ) in out
    assert "linear attention (GDN) 1.01B" in out
    assert "state (read + write) 2 x 21 x 61.41 MiB" in out and "recurrence 7 x L 30 x Hv 32" in out


def test_two_gpus_split_kv_heads_and_state():
    """tp 2: one KV head per device (10 KiB/token) and half of every GDN layer's heads (30.7 MiB/sequence)."""
    spec, _ = load_model("Clover-35B-A3B")
    tp2 = Deployment(num_gpus=2, tensor_parallel_size=2)
    assert kv_bytes_per_token(tp2, spec.attention[0]) == KV_PER_TOKEN / 2
    assert state_bytes_per_sequence(spec, tp2) == STATE_PER_SEQUENCE / 2


def test_one_l40s_lists_every_way_that_fits(capsys):
    """bf16 Clover (64.6 GiB) on one L40S (40.5 GiB usable): two GPUs, or FP8 weights with FP8 K/V on the one
    (FP8 weights alone leave too little for a 128K sequence's bf16 K/V); and the suggested command does fit."""
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    with pytest.raises(ValueError) as error:
        cli.run(parser.parse_args(["Clover-35B-A3B", "--hardware", "L40S"]))
    message = str(error.value)
    assert "--num-gpus 2 --tensor-parallel-size 2" in message
    assert "FP8 weights and KV cache: --weight-dtype fp8 --kv-cache-dtype fp8" in message
    assert _run(capsys, "Clover-35B-A3B", "--hardware", "L40S", "--weight-dtype", "fp8", "--kv-cache-dtype", "fp8")
