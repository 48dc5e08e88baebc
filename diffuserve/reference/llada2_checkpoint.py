"""Writes random-weight LLaDA2-format checkpoint directories, laid out as the Hub's are.

config.json with BailingMoeV2 keys and, like the released configs, no mask or EOS id (the loader takes them
from the tokenizer); seeded random weights under Hub names (`word_embeddings`, fused `query_key_value`,
per-expert MLPs, `gate.expert_bias`), optionally sharded; a byte-level tokenizer with LLaDA2's special tokens
and its chat template (`<role>HUMAN</role>...<|role_end|><role>ASSISTANT</role>`). Used by tests, benchmarks
and demos, since real weights cannot be downloaded where this project is built.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from diffuserve.model.families.llada2.family import FAMILY as LLADA2
from diffuserve.model.loader import DTYPES
from diffuserve.reference.byte_tokenizer import write_byte_tokenizer
from diffuserve.reference.random_checkpoint import write_random_weights

SPECIAL_TOKENS = ("<|endoftext|>", "<|startoftext|>", "<|mask|>", "<|role_end|>", "<role>", "</role>")
CHAT_TEMPLATE = (
    "{%- set names = {'system': 'SYSTEM', 'user': 'HUMAN', 'assistant': 'ASSISTANT'} -%}"
    "{%- for message in messages -%}"
    "<role>{{ names.get(message['role'], message['role'] | upper) }}</role>{{ message['content'] }}<|role_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<role>ASSISTANT</role>{%- endif -%}"
)

# LLaDA2.0-mini's config.json (models.md §1.1) shrunk: 3 layers (layer 0 dense), 8 experts in 4 groups, top-2
# from the 2 best groups, one shared expert, head_dim 16 of which the first 8 dims rotate.
TINY: dict[str, Any] = dict(
    architectures=["LLaDA2MoeModelLM"],
    model_type="llada2_moe",
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_experts=8,
    num_experts_per_tok=2,
    num_shared_experts=1,
    n_group=4,
    topk_group=2,
    routed_scaling_factor=2.5,
    first_k_dense_replace=1,
    vocab_size=320,
    max_position_embeddings=1024,
    rope_theta=600000.0,
    partial_rotary_factor=0.5,
    rotary_dim=8,
    rms_norm_eps=1e-6,
    use_qk_norm=True,
    use_qkv_bias=False,
    use_bias=False,
    tie_word_embeddings=False,
    torch_dtype="float32",
    norm_topk_prob=True,
    score_function="sigmoid",
    router_dtype="fp32",
    moe_router_enable_expert_bias=True,
)


BENCH: dict[str, Any] = dict(
    hidden_size=512,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    rotary_dim=32,
    intermediate_size=1024,
    moe_intermediate_size=256,
    num_experts=16,
    vocab_size=8192,
    max_position_embeddings=4096,
)
"""`llada2-bench`: TINY's layout (layer 0 dense, experts in 4 groups, top-2 from the 2 best, a shared expert) at
sdar-moe-bench's width and depth (hidden 512, 8 layers, 16 experts of 256, vocabulary 8192): a LLaDA2 whose forward,
not the engine's per-step Python, is most of a step on a CPU."""
DMOE: dict[str, Any] = dict(
    num_experts=64,
    num_experts_per_tok=4,
    n_group=8,
    topk_group=4,
    moe_intermediate_size=16,
    mode="aggregate",
    core_threshold=0.6,
)
"""`dmoe-tiny`: TINY with dMoE's config keys (`mode`, `core_threshold` 0.6) and enough experts for its rule to
choose (64 in 8 groups, top-4 from the 4 best groups: a coreset of at least 16 is a real subset)."""
LLADA2_PRESETS: dict[str, dict[str, Any]] = {"llada2-tiny": {}, "llada2-bench": BENCH, "dmoe-tiny": DMOE}
"""Named shapes: overrides of TINY."""


def write_llada2_tokenizer(out_dir: str | Path, vocab_size: int) -> dict[str, int]:
    """Writes tokenizer.json + tokenizer_config.json; returns the special token ids by text. As in the
    released tokenizer_config, `<|mask|>` is a vocabulary token but not the declared mask token."""
    overrides = {"mask_token": None, "chat_template": CHAT_TEMPLATE, "bos_token": "<|startoftext|>"}
    return write_byte_tokenizer(out_dir, vocab_size, SPECIAL_TOKENS, overrides)


def write_llada2_checkpoint(
    out_dir: str | Path,
    config: dict | None = None,
    seed: int = 0,
    init_std: float = 0.02,
    logit_scale: float = 1.0,
    max_shard_bytes: int | None = None,
    generation: dict | None = None,
) -> Path:
    """Writes a LLaDA2 directory (default shape: `TINY`); generation_config.json only if `generation` is
    given. Weights as `write_random_weights`. Returns the directory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = {**TINY, **(config or {})}
    specials = write_llada2_tokenizer(out, config["vocab_size"])
    config.setdefault("pad_token_id", specials["<|endoftext|>"])
    args = LLADA2.parse_args({"mask_token_id": specials["<|mask|>"], **config}, {})
    write_random_weights(
        out, LLADA2, args, DTYPES[config["torch_dtype"]], seed, init_std, logit_scale, max_shard_bytes=max_shard_bytes
    )
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if generation is not None:
        (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return out
