"""Checkpoint names <-> our parameter names for Qwen3-style checkpoints (the sdar family: SDAR, SDAR-MoE).

Our modules keep the checkpoint's names except for three packings, declared here once:

    self_attn.{q,k,v}_proj         -> self_attn.qkv_proj        rows [q | k | v]
    {mlp,shared_experts}.{gate,up}_proj -> ...gate_up_proj      rows [gate | up]
    mlp.experts.{e}.{gate,up,down}_proj -> mlp.experts.{gate_up_proj[e], down_proj[e]}

Fused expert checkpoints (transformers 5: `mlp.experts.gate_up_proj`, `mlp.experts.down_proj`) load as they
are; Qwen2-MoE's singular `shared_expert` loads into `shared_experts`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from diffuserve.model.config import ModelArgs


@dataclass(frozen=True)
class WeightTarget:
    """Where a checkpoint tensor goes: `param[expert]` (if set), then rows `[row_start, row_start + rows)`."""

    param: str
    expert: int | None = None
    row_start: int = 0
    rows: int | None = None

    def view(self, param: torch.Tensor) -> torch.Tensor:
        dst = param if self.expert is None else param[self.expert]
        return dst if self.rows is None else dst[self.row_start : self.row_start + self.rows]


_QKV = re.compile(r"(.*\.self_attn)\.([qkv])_proj\.(weight|bias)")
_EXPERT = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight")
_GATE_UP = re.compile(r"(.*\.(?:mlp|mlp\.shared_experts))\.(gate|up)_proj\.weight")
IGNORED = re.compile(r".*rotary_emb\.inv_freq")


def qwen3_weight_target(name: str, args: ModelArgs) -> WeightTarget | None:
    """Maps one checkpoint tensor name; None for names that carry no weight (e.g. cached RoPE tables)."""
    if IGNORED.fullmatch(name):
        return None
    name = name.replace(".mlp.shared_expert.", ".mlp.shared_experts.")
    q_size, kv_size = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
    if m := _QKV.fullmatch(name):
        start, rows = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}[m[2]]
        return WeightTarget(f"{m[1]}.qkv_proj.{m[3]}", row_start=start, rows=rows)
    if m := _EXPERT.fullmatch(name):
        inter = args.moe_intermediate_size
        if m[3] == "down":
            return WeightTarget(f"{m[1]}.down_proj", expert=int(m[2]))
        start = 0 if m[3] == "gate" else inter
        return WeightTarget(f"{m[1]}.gate_up_proj", expert=int(m[2]), row_start=start, rows=inter)
    if m := _GATE_UP.fullmatch(name):
        inter = args.shared_expert_intermediate_size if m[1].endswith("shared_experts") else args.intermediate_size
        return WeightTarget(f"{m[1]}.gate_up_proj.weight", row_start=0 if m[2] == "gate" else inter, rows=inter)
    return WeightTarget(name)


def qwen3_checkpoint_tensors(
    state: dict[str, torch.Tensor], args: ModelArgs, per_expert: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """The inverse map: our state dict -> Hub-style checkpoint tensors (used to write checkpoints)."""
    q_size, kv_size = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
    for name, tensor in state.items():
        if args.tie_word_embeddings and name == "lm_head.weight":
            continue
        if ".qkv_proj." in name:
            for part, chunk in zip("qkv", tensor.split([q_size, kv_size, kv_size])):
                yield name.replace(".qkv_proj.", f".{part}_proj."), chunk
        elif name.endswith("experts.gate_up_proj") and per_expert:
            for e, fused in enumerate(tensor):
                gate, up = fused.chunk(2)
                yield f"{name[: -len('gate_up_proj')]}{e}.gate_proj.weight", gate
                yield f"{name[: -len('gate_up_proj')]}{e}.up_proj.weight", up
        elif name.endswith("experts.down_proj") and per_expert:
            for e, down in enumerate(tensor):
                yield f"{name[: -len('down_proj')]}{e}.down_proj.weight", down
        elif ".gate_up_proj." in name:
            gate, up = tensor.chunk(2)
            yield name.replace(".gate_up_proj.", ".gate_proj."), gate
            yield name.replace(".gate_up_proj.", ".up_proj."), up
        else:
            yield name, tensor
