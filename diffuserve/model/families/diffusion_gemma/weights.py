"""Checkpoint names <-> our parameter names for `diffusion_gemma` checkpoints (transformers' own layout, as
`DiffusionGemmaForBlockDiffusion.save_pretrained` writes it).

The text weights live once, under `model.decoder.` (transformers ties the encoder's to them and drops the copies
when saving); only the layer scalars are per role: `model.decoder.layers.{i}.layer_scalar` and
`model.encoder.language_model.layers.{i}.layer_scalar` (buffers, never tied). The vision tower
(`model.encoder.vision_tower`, `model.encoder.embed_vision`), the encoder's tied copies and `lm_head.weight`
(tied to the embedding) are not loaded. Renamings and packings, declared once:

    model.decoder.X                                      -> model.X
    layers.{i}.self_attn.{q,k,v}_proj                    -> layers.{i}.self_attn.qkv_proj   rows [q | k (| v)]
    layers.{i}.mlp.{gate,up}_proj, self_conditioning.{gate,up}_proj  -> ...gate_up_proj      rows [gate | up]
    layers.{i}.{mlp, router, experts, *feedforward_layernorm*}       -> layers.{i}.feed_forward.*
    model.encoder.language_model.layers.{i}.layer_scalar -> model.layers.{i}.encoder_layer_scalar

A model without experts (num_experts 0) ignores the empty router / expert tensors and their two norms.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import torch

from diffuserve.model.config import ModelArgs
from diffuserve.model.families.diffusion_gemma.config import gemma_args
from diffuserve.model.weight_names import WeightTarget

DECODER, ENCODER = "model.decoder.", "model.encoder.language_model."
IGNORED = re.compile(r"model\.encoder\.(vision_tower|embed_vision)\..*|lm_head\.weight|.*rotary_emb\..*")
_ENCODER_SCALAR = re.compile(re.escape(ENCODER) + r"layers\.(\d+)\.layer_scalar")
_QKV = re.compile(r"layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)")
_GATE_UP = re.compile(r"(layers\.\d+\.mlp|self_conditioning)\.(gate|up)_proj\.weight")
_FFN = re.compile(r"layers\.(\d+)\.((?:mlp|router|experts|\w*feedforward_layernorm\w*)\..*)")
_MOE_ONLY = re.compile(r"layers\.\d+\.(router|experts|pre_feedforward_layernorm_2|post_feedforward_layernorm_2)\..*")


def _qkv_rows(args: ModelArgs, layer: int, part: str) -> tuple[int, int]:
    shape = gemma_args(args).shape(layer)
    q_size, kv_size = args.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}[part]


def diffusion_gemma_weight_target(name: str, args: ModelArgs) -> WeightTarget | None:
    """Maps one checkpoint tensor name; None for tensors we do not load (module docstring)."""
    if m := _ENCODER_SCALAR.fullmatch(name):
        return WeightTarget(f"model.layers.{m[1]}.encoder_layer_scalar")
    if IGNORED.fullmatch(name) or not name.startswith(DECODER):
        return None
    name = name[len(DECODER) :]
    if not args.is_moe and _MOE_ONLY.fullmatch(name):
        return None
    if m := _QKV.fullmatch(name):
        start, rows = _qkv_rows(args, int(m[1]), m[2])
        return WeightTarget(f"model.layers.{m[1]}.self_attn.qkv_proj.{m[3]}", row_start=start, rows=rows)
    if m := _GATE_UP.fullmatch(name):
        prefix = m[1].replace(".mlp", ".feed_forward.mlp") if m[1].startswith("layers") else f"{m[1]}.mlp"
        inter = args.intermediate_size
        return WeightTarget(f"model.{prefix}.gate_up_proj.weight", row_start=0 if m[2] == "gate" else inter, rows=inter)
    if name.startswith("self_conditioning.down_proj"):
        return WeightTarget("model.self_conditioning.mlp.down_proj.weight")
    if m := _FFN.fullmatch(name):
        return WeightTarget(f"model.layers.{m[1]}.feed_forward.{m[2]}")
    return WeightTarget(f"model.{name}")


def diffusion_gemma_checkpoint_tensors(
    state: dict[str, torch.Tensor], args: ModelArgs, per_expert: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """The inverse map: our state dict -> transformers-layout tensors (experts always fused: the only layout
    transformers writes for this family, so `per_expert` is ignored)."""
    for name, tensor in state.items():
        if name == "lm_head.weight":
            continue
        if m := re.fullmatch(r"model\.layers\.(\d+)\.encoder_layer_scalar", name):
            yield f"{ENCODER}layers.{m[1]}.layer_scalar", tensor
            continue
        name = name[len("model.") :].replace(".feed_forward.", ".")
        name = name.replace("self_conditioning.mlp.", "self_conditioning.")
        if m := re.fullmatch(r"layers\.(\d+)\.self_attn\.qkv_proj\.(weight|bias)", name):
            parts = "qkv" if gemma_args(args).kind(int(m[1])) == "sliding_attention" else "qk"
            for part in parts:
                start, rows = _qkv_rows(args, int(m[1]), part)
                yield f"{DECODER}layers.{m[1]}.self_attn.{part}_proj.{m[2]}", tensor[start : start + rows]
        elif name.endswith("gate_up_proj.weight"):
            gate, up = tensor.chunk(2)
            yield DECODER + name.replace("gate_up_proj", "gate_proj"), gate
            yield DECODER + name.replace("gate_up_proj", "up_proj"), up
        else:
            yield DECODER + name, tensor
