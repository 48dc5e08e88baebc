"""Checkpoint names <-> our parameter names for LLaDA2 (BailingMoeV2) checkpoints.

Every family shares one module tree (`transformer.BlockDiffusionLM`), so the Hub's own names are renamed here,
once:

    model.word_embeddings       -> model.embed_tokens
    attention.query_key_value   -> self_attn.qkv_proj   rows [all Q heads | all K heads | all V heads], as ours
    attention.dense             -> self_attn.o_proj
    attention.query_layernorm   -> self_attn.q_norm
    attention.key_layernorm     -> self_attn.k_norm

The MLP names are Qwen3-MoE's (`mlp.{gate,up,down}_proj`, `mlp.experts.{e}.*`, `mlp.shared_experts.*`), so their
packing into `gate_up_proj` and fused experts is `weight_names`' own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import torch

from diffuserve.model.config import ModelArgs
from diffuserve.model.weight_names import WeightTarget, qwen3_checkpoint_tensors, qwen3_weight_target

HUB_TO_OURS = {"query_key_value": "qkv_proj", "dense": "o_proj", "query_layernorm": "q_norm", "key_layernorm": "k_norm"}
OURS_TO_HUB = {ours: hub for hub, ours in HUB_TO_OURS.items()}
_HUB_ATTENTION = re.compile(rf"(.*)\.attention\.({'|'.join(HUB_TO_OURS)})\.(weight|bias)")
_OUR_ATTENTION = re.compile(rf"(.*)\.self_attn\.({'|'.join(OURS_TO_HUB)})\.(weight|bias)")
HUB_EMBEDDING, OUR_EMBEDDING = "model.word_embeddings.weight", "model.embed_tokens.weight"


def llada2_weight_target(name: str, args: ModelArgs) -> WeightTarget | None:
    """Maps one checkpoint tensor name; None for names that carry no weight (e.g. cached RoPE tables)."""
    if m := _HUB_ATTENTION.fullmatch(name):
        return WeightTarget(f"{m[1]}.self_attn.{HUB_TO_OURS[m[2]]}.{m[3]}")
    return qwen3_weight_target(OUR_EMBEDDING if name == HUB_EMBEDDING else name, args)


def llada2_checkpoint_tensors(
    state: dict[str, torch.Tensor], args: ModelArgs, per_expert: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """The inverse map: our state dict -> Hub-style LLaDA2 checkpoint tensors (used to write checkpoints)."""
    renamed = {}
    for name, tensor in state.items():
        if m := _OUR_ATTENTION.fullmatch(name):
            name = f"{m[1]}.attention.{OURS_TO_HUB[m[2]]}.{m[3]}"
        renamed[HUB_EMBEDDING if name == OUR_EMBEDDING else name] = tensor
    yield from qwen3_checkpoint_tensors(renamed, args, per_expert)
