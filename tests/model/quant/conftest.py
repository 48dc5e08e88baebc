"""Tiny checkpoints whose widths int4 groups of 32 divide, whole and split over two ranks (hidden 64, expert and
shared widths 64, dense MLPs 128): one per family."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.families.clover_moe.model import CloverMoeForBlockDiffusion
from diffuserve.model.layers.attention import DenseAttentionInputs
from diffuserve.model.step_inputs import StepInputs
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.llada2_checkpoint import write_llada2_checkpoint
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint

GROUP = 32


def write_family(root: Path, family: str) -> Path:
    if family == "sdar":
        config = make_config(
            "sdar-moe-tiny", first_k_dense_replace=1, moe_intermediate_size=64, shared_expert_intermediate_size=64
        )
        return write_random_checkpoint(root / "sdar", config, seed=3)
    if family == "llada2":
        return write_llada2_checkpoint(root / "llada2", {"intermediate_size": 128, "moe_intermediate_size": 64}, seed=4)
    config = make_clover_moe_config(moe_intermediate_size=64, shared_expert_intermediate_size=64)
    return write_clover_moe_checkpoint(root / "clover", config, seed=5)


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("quant-models")
    return {family: write_family(root, family) for family in ("sdar", "llada2", "clover")}


def model_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """[1, T] -> fp32 logits [T, V] of one dense forward (block-causal for the attention families, the causal
    trunk for Clover)."""
    with torch.no_grad():
        if isinstance(model, CloverMoeForBlockDiffusion):
            hidden, _ = DenseClover(model).forward_causal(ids)
            return model.compute_logits(hidden[0])
        t = ids.shape[1]
        block = model.args.block_length
        positions = torch.arange(t)
        mask = (positions[:, None] // block >= positions[None, :] // block)[None, None]
        return model.compute_logits(model(ids, positions[None], StepInputs(DenseAttentionInputs(mask)))[0])
