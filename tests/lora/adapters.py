"""Tiny Qwen3 / Qwen3-MoE checkpoints (transformers' own, as tests/model/test_hf_parity.py builds them) with
random PEFT LoRA adapters (B not zero, so an adapter changes the output), and each adapter merged into its base
(`merge_and_unload`): what the adapter tests compare against."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.model.test_hf_parity import _hf_model, _save

peft = pytest.importorskip("peft")

ARCHITECTURES = {"dense": "SDARForCausalLM", "moe": "SDARMoeForCausalLM"}
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]


def targets(kind: str) -> list[str]:
    """Every module PEFT can target that the engine adapts: attention and the dense MLP; in the MoE model
    attention only (PEFT turns an MLP target there into one on the fused routed experts' parameters, which the
    engine refuses: test_lora_errors.py)."""
    return ATTENTION + MLP if kind == "dense" else ATTENTION


def write_adapter(root: Path, kind: str, name: str, seed: int, rank: int = 4, **config) -> tuple[Path, Path]:
    """(adapter dir, merged checkpoint dir) of a random adapter on the `kind` base."""
    model = _hf_model(kind)
    torch.manual_seed(seed)
    lora = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets(kind), init_lora_weights=False, **config)
    wrapped = peft.get_peft_model(model, lora)
    wrapped.save_pretrained(root / name)
    _save(wrapped.merge_and_unload().eval(), root / f"{name}-merged", ARCHITECTURES[kind])
    return root / name, root / f"{name}-merged"


def write_base(root: Path, kind: str) -> Path:
    _save(_hf_model(kind), root / kind, ARCHITECTURES[kind])
    return root / kind


def edit_config(adapter: Path, **changes) -> None:
    path = adapter / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
