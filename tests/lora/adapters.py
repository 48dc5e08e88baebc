"""Tiny Qwen3 / Qwen3-MoE checkpoints (transformers' own, as tests/model/test_hf_parity.py builds them) with
random PEFT LoRA adapters (B not zero, so an adapter changes the output), and each adapter merged into its base
(`merge_and_unload`): what the adapter tests compare against."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.model.test_hf_parity import _hf_model, _save

ARCHITECTURES = {"dense": "SDARForCausalLM", "moe": "SDARMoeForCausalLM"}
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]


def targets(kind: str) -> list[str]:
    """Every module PEFT can target that the engine adapts: attention and the dense MLP; in the MoE model
    attention only (PEFT turns an MLP target there into one on the fused routed experts' parameters, which the
    engine refuses: test_lora_errors.py)."""
    return ATTENTION + MLP if kind == "dense" else ATTENTION


def write_adapter(root: Path, kind: str, name: str, seed: int, rank: int = 4, **config) -> tuple[Path, Path]:
    """(adapter dir, merged checkpoint dir) of a random adapter on the `kind` base (skips without peft)."""
    peft = pytest.importorskip("peft")
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


def random_adapter(
    path: Path, shapes: dict[str, tuple[int, int]], rank: int = 4, alpha: float = 8.0, seed: int = 0, std: float = 0.1
) -> Path:
    """A PEFT-format adapter written by hand: `shapes` maps each Hugging Face module name to its (in, out); A and
    B random (B not zero), for checkpoints PEFT cannot wrap (the engine's own random checkpoints)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for module, (fan_in, fan_out) in shapes.items():
        prefix = f"base_model.model.{module}"
        tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=generator) * std
        tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=generator) * std
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path / "adapter_model.safetensors")
    targets = sorted({module.rsplit(".", 1)[-1] for module in shapes})
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": targets, "bias": "none"}
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


def merge_into_checkpoint(base: Path, adapter: Path, out: Path) -> Path:
    """`base` with the adapter merged into its weights (W += lora_alpha / r * B @ A), written to `out` beside a
    copy of its other files: the engine on it is what the engine with the adapter must equal."""
    shutil.copytree(base, out, dirs_exist_ok=True)
    config = json.loads((adapter / "adapter_config.json").read_text())
    scaling = config["lora_alpha"] / config["r"]
    lora = load_file(adapter / "adapter_model.safetensors")
    for file in out.glob("*.safetensors"):
        tensors = load_file(file)
        for key in [k for k in lora if k.endswith(".lora_A.weight")]:
            name = key[len("base_model.model.") : -len(".lora_A.weight")] + ".weight"
            if name in tensors:
                delta = lora[key.replace("lora_A", "lora_B")] @ lora[key] * scaling
                tensors[name] = (tensors[name].double() + delta.double()).to(tensors[name].dtype)
        save_file(tensors, file)
    return out


ADAPTABLE = re.compile(
    r".*\.(self_attn\.[qkvo]_proj|attention\.(query_key_value|dense)|linear_attn\.(in_proj_\w+|out_proj)"
    r"|shared_experts?\.(gate|up|down)_proj|mlp\.(gate|up|down)_proj)\.weight"
)
"""Checkpoint weights an adapter may target in every family: attention (Qwen names, LLaDA2's fused
`query_key_value` / `dense`), Gated DeltaNet projections, shared experts and dense MLPs; never routed experts."""


def adapter_for_checkpoint(base: Path, path: Path, rank: int = 4, seed: int = 0) -> Path:
    """A random adapter on every adaptable 2-d weight of `base`'s checkpoint (names and shapes read from it)."""
    shapes = {}
    for file in sorted(base.glob("*.safetensors")):
        for name, tensor in load_file(file).items():
            name = name.replace("model.language_model.", "model.")
            if ADAPTABLE.fullmatch(name) and tensor.dim() == 2 and ".experts." not in name:
                shapes[name.removesuffix(".weight")] = (tensor.shape[1], tensor.shape[0])
    assert shapes, f"no adaptable weight in {base}"
    return random_adapter(path, shapes, rank=rank, seed=seed)
