"""A draft adapter for a hybrid (`clover_moe`) model, trained on what verified decoding drafts: LoRA weights on the
attention and Gated DeltaNet projections that act only on the previewed block (the rows that draft), never on the
causal trunk (the rows that verify), so the served output stays the base model's whatever the adapter learns.

    the data     each training prompt with the base model's own greedy reply (what verification accepts)
    a sample     an anchor a inside the reply: the causal trunk over positions < a (base weights, no gradient)
                 gives the state a verified block anchored at a is drafted against; the block, all masks, is
                 previewed with the adapter; its rows 0 .. B - 2 predict positions a + 1 .. a + B - 1 (row i
                 predicts position a + i + 1 under the prediction shift; position a, the head, is the causal
                 row's and never the adapter's)
    the loss     cross-entropy of those rows against the base model's reply tokens

The preview is `DenseClover.forward_preview` (model/families/clover_moe/dense.py: the engine's preview maths,
against which the engine's block rows are tested), so what is trained is what is served. Saved in the PEFT format
(`adapter_config.json` + `adapter_model.safetensors`, Hugging Face module names: for these projections the
engine's own). Knows nothing of the engine.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.families.clover_moe.model import CloverMoeForBlockDiffusion

TARGETS = ("in_proj_qkv", "in_proj_z", "in_proj_a", "out_proj", "q_proj", "k_proj", "v_proj", "o_proj")
"""The projections adapted: every gated-attention linear, and every Gated DeltaNet one the preview reads (not
in_proj_b: the delta rule's beta only writes the state, which a preview never does); the MoE is left as it is."""


class DraftLoRA(nn.Module):
    """Trainable A [r, in], B [out, r] (B zero at the start: the adapter begins as the base model) on every target
    linear of `model`, added as `alpha / r * x A^T B^T` while `drafting()` is active and not otherwise."""

    def __init__(self, model: nn.Module, rank: int, alpha: float, seed: int) -> None:
        super().__init__()
        self.rank, self.alpha, self.active = rank, alpha, False
        generator = torch.Generator().manual_seed(seed)
        self.modules_by_name: dict[str, nn.Linear] = {
            name: module
            for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in TARGETS
        }
        self.a = nn.ParameterDict()
        self.b = nn.ParameterDict()
        for name, linear in self.modules_by_name.items():
            key = name.replace(".", "__")
            bound = 1 / math.sqrt(linear.in_features)  # nn.Linear's (and PEFT's kaiming) scale
            a = (torch.rand(rank, linear.in_features, generator=generator) * 2 - 1) * bound
            self.a[key] = nn.Parameter(a)
            self.b[key] = nn.Parameter(torch.zeros(linear.out_features, rank))
            linear.register_forward_hook(self._hook(key))

    def _hook(self, key: str):
        def add_delta(_module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
            if not self.active:
                return output
            delta = inputs[0].to(self.a[key].dtype) @ self.a[key].T @ self.b[key].T
            return output + (self.alpha / self.rank) * delta.to(output.dtype)

        return add_delta

    @contextmanager
    def drafting(self) -> Iterator[None]:
        self.active = True
        try:
            yield
        finally:
            self.active = False

    def save(self, path: Path, base_model: str) -> None:
        """The adapter in the PEFT format, under the base model's (Hugging Face) module names."""
        path.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for name in self.modules_by_name:
            key = name.replace(".", "__")
            tensors[f"base_model.model.{name}.lora_A.weight"] = self.a[key].detach().contiguous()
            tensors[f"base_model.model.{name}.lora_B.weight"] = self.b[key].detach().contiguous()
        save_file(tensors, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
        config = {
            "peft_type": "LORA",
            "base_model_name_or_path": base_model,
            "r": self.rank,
            "lora_alpha": self.alpha,
            "target_modules": sorted(TARGETS),
            "bias": "none",
            "lora_dropout": 0.0,
        }
        (path / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")


def anchored_loss(
    model: CloverMoeForBlockDiffusion, lora: DraftLoRA, ids: list[int], reply_start: int, mask_token_id: int, block: int
) -> tuple[torch.Tensor, int, int]:
    """One conversation `ids` (its reply from `reply_start`) -> (the summed cross-entropy of the drafts of every
    block of `block` positions anchored in the reply, the number of drafted positions scored, how many of them
    the drafts' argmax got right)."""
    tokens, dense = torch.tensor([ids]), DenseClover(model)
    with torch.no_grad():
        _, state = dense.forward_causal(tokens[:, :reply_start])
    losses, count, right = [], 0, 0
    canvas = torch.full((1, block), mask_token_id, dtype=torch.long)
    for anchor in range(reply_start, len(ids) - 1):
        with lora.drafting():
            rows = dense.forward_preview(canvas, state)[0, : block - 1]  # row i predicts anchor + i + 1
        targets = tokens[0, anchor + 1 : anchor + block]
        logits = model.compute_logits(rows[: len(targets)]).float()
        logits[:, mask_token_id] = float("-inf")  # the engine never drafts the mask token
        losses.append(F.cross_entropy(logits, targets, reduction="sum"))
        count += len(targets)
        right += int((logits.argmax(-1) == targets).sum())
        with torch.no_grad():
            _, state = dense.forward_causal(tokens[:, anchor : anchor + 1], state)
    return torch.stack(losses).sum(), count, right
