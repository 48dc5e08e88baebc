"""Checkpoint names <-> our parameter names for `clover_moe` / Qwen3.5-MoE checkpoints.

Hub checkpoints of this family come as the multimodal layout (`model.language_model.layers...`, plus a
`model.visual` tower and `mtp` layers that we do not run) or the text-only one (`model.layers...`); older
exports use `language_model.model...`. All map to our `model.*` tree. Our modules keep the checkpoint's names
except two packings (the same as the Qwen3-MoE family's, see weight_names):

    mlp.experts.{e}.{gate,up,down}_proj -> mlp.experts.{gate_up_proj[e], down_proj[e]}   (fused ones load as is)
    mlp.shared_expert.{gate,up}_proj    -> mlp.shared_expert.gate_up_proj                rows [gate | up]

Also owns the question "does this checkpoint carry the block-diffusion tensors?", answered from tensor names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from diffuserve.model.config import ModelArgs
from diffuserve.model.families.clover_moe.config import with_diffusion
from diffuserve.model.families.clover_moe.gdn_preview import DIFFUSION_TENSORS
from diffuserve.model.weight_names import WeightTarget, qwen3_checkpoint_tensors

PREFIXES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("language_model.", "model."),
)
IGNORED = re.compile(r"(model\.)?visual\..*|mtp\..*|.*rotary_emb\.inv_freq")
_EXPERT = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight")
_SHARED = re.compile(r"(.*\.mlp\.shared_expert)\.(gate|up)_proj\.weight")


def strip_prefix(name: str) -> str:
    for prefix, ours in PREFIXES:
        if name.startswith(prefix):
            return ours + name[len(prefix) :]
    return name


def clover_moe_weight_target(name: str, args: ModelArgs) -> WeightTarget | None:
    """Maps one checkpoint tensor name; None for tensors we do not run (vision tower, MTP layers)."""
    if IGNORED.fullmatch(name):
        return None
    name = strip_prefix(name)
    if IGNORED.fullmatch(name):
        return None
    if m := _EXPERT.fullmatch(name):
        inter = args.moe_intermediate_size
        if m[3] == "down":
            return WeightTarget(f"{m[1]}.down_proj", expert=int(m[2]))
        return WeightTarget(
            f"{m[1]}.gate_up_proj", expert=int(m[2]), row_start=0 if m[3] == "gate" else inter, rows=inter
        )
    if m := _SHARED.fullmatch(name):
        inter = args.shared_expert_intermediate_size
        return WeightTarget(f"{m[1]}.gate_up_proj.weight", row_start=0 if m[2] == "gate" else inter, rows=inter)
    return WeightTarget(name)


def clover_moe_checkpoint_tensors(
    state: dict[str, torch.Tensor], args: ModelArgs, per_expert: bool = True, prefix: str = "model."
) -> Iterator[tuple[str, torch.Tensor]]:
    """Our state dict -> Hub-style checkpoint tensors; `prefix` replaces `model.` (e.g. `model.language_model.`)."""
    for name, tensor in qwen3_checkpoint_tensors(state, args, per_expert):
        yield (prefix + name[len("model.") :] if name.startswith("model.") else name), tensor


def has_diffusion_tensors(names: Iterable[str]) -> bool:
    return any(name.rsplit(".", 1)[-1] in DIFFUSION_TENSORS for name in names)


def checkpoint_tensor_names(model_dir: str | Path) -> list[str]:
    """Every tensor name of a directory's safetensors (headers only; no tensor is read)."""
    names: list[str] = []
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            names.extend(f.keys())
    return names


def clover_moe_checkpoint_args(args: ModelArgs, model_dir: str | Path) -> ModelArgs:
    """args refined by the checkpoint: whether its GDN layers carry the block-diffusion tensors."""
    return with_diffusion(args, has_diffusion_tensors(checkpoint_tensor_names(model_dir)))
