"""Which reference `diffuserve verify` compares the engine with, and building it.

In order: the checkpoint's own modeling code, named by config.json's `auto_map` (run by transformers with
`trust_remote_code=True`, and only when the user passed `--trust-remote-code`, as vLLM asks); else transformers'
built-in class of the family's base architecture (Qwen3.5-MoE for Clover's causal trunk, Qwen3 / Qwen3-MoE for
the sdar family, DiffusionGemmaForBlockDiffusion for DiffusionGemma); else none. Both read the checkpoint
directory themselves (`from_pretrained`), so the engine's loader is checked too, and what they could not place
(weights missing or left over) is reported. Knows nothing of the engine's model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from diffuserve.model.families.clover_moe.config import text_fields

AUTO_MAP_CLASSES = ("AutoModelForCausalLM", "AutoModelForMaskedLM", "AutoModel")
"""auto_map entries that name a model class, in the order tried (the first with an LM head preferred)."""
OURS_ONLY = ("architectures", "model_type", "torch_dtype", "auto_map", "text_config", "block_length", "mask_token_id")
"""config.json keys that name our checkpoint or its diffusion, not the transformers architecture it is built as."""


NO_BUILTIN = {
    "llada2": "transformers has no LLaDA2 class; its reference is the checkpoint's own code (modeling_llada2_moe.py "
    "registered in config.json's auto_map, run with --trust-remote-code)",
}
"""Why a family has no built-in reference (the checkpoint's own code may still be one)."""


@dataclass(frozen=True)
class Reference:
    name: str
    """What runs, as the report names it."""
    remote_code: bool
    build: Callable[[Path, torch.dtype], tuple[nn.Module, list[str]]]
    """(model directory, dtype) -> (the model in eval mode, lines about weights it could not place)."""


def remote_class(config: dict) -> tuple[str, str] | None:
    """(auto class, "module.Class") of the checkpoint's own model code, or None if config.json names none."""
    auto_map = config.get("auto_map") or {}
    for auto_class in AUTO_MAP_CLASSES:
        if auto_map.get(auto_class):
            target = auto_map[auto_class]
            return auto_class, target if isinstance(target, str) else target[0]
    return None


def refusal(config: dict) -> str | None:
    """The one line said instead of running the checkpoint's code without --trust-remote-code (None: it has none)."""
    found = remote_class(config)
    if found is None:
        return None
    return (
        f"verify: not running the checkpoint's own code ({found[1]}, via auto_map) without --trust-remote-code; "
        "pass it to compare with that code"
    )


def choose_reference(config: dict, family: str, trust_remote_code: bool) -> tuple[Reference | None, str]:
    """(the reference, or None; why there is none, or "")."""
    found = remote_class(config)
    if found is not None and trust_remote_code:
        auto_class, target = found
        name = f"{target} (the checkpoint's own code, via auto_map {auto_class})"
        return Reference(name, True, lambda path, dtype: _from_pretrained(auto_class, path, dtype, None, True)), ""
    return _builtin(config, family)


def _builtin(config: dict, family: str) -> tuple[Reference | None, str]:
    if family == "clover_moe":
        classes = ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig")
    elif family == "sdar" and (config.get("shared_expert_intermediate_size") or config.get("num_shared_experts")):
        return None, "transformers' Qwen3-MoE has no shared expert, and the checkpoint names no code of its own"
    elif family == "sdar" and int(config.get("num_experts") or config.get("num_local_experts") or 0) > 0:
        classes = ("Qwen3MoeForCausalLM", "Qwen3MoeConfig")
    elif family == "sdar":
        classes = ("Qwen3ForCausalLM", "Qwen3Config")
    elif family == "diffusion_gemma":
        classes = ("DiffusionGemmaForBlockDiffusion", "")
    else:
        return None, NO_BUILTIN.get(family, f"verify knows no built-in reference for the {family} family")
    import transformers

    if not hasattr(transformers, classes[0]):
        return None, f"transformers {transformers.__version__} has no {classes[0]}, the {family} family's base class"
    if family == "diffusion_gemma":
        return _diffusion_gemma(), ""
    name = f"transformers {classes[0]} (built-in class of the base architecture)"

    def build(path: Path, dtype: torch.dtype) -> tuple[nn.Module, list[str]]:
        import transformers

        fields = json.loads((path / "config.json").read_text())  # the --layers view's, when there is one
        fields = text_fields(fields) if family == "clover_moe" else fields
        hf_config = getattr(transformers, classes[1])(**{k: v for k, v in fields.items() if k not in OURS_ONLY})
        return _from_pretrained(classes[0], path, dtype, hf_config, False)

    return Reference(name, False, build), ""


def _diffusion_gemma() -> Reference:
    """transformers' DiffusionGemmaForBlockDiffusion on the checkpoint (its eager experts where MoE is off:
    transformers' fused path needs experts)."""

    def build(path: Path, dtype: torch.dtype) -> tuple[nn.Module, list[str]]:
        import transformers

        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
        extra = {} if config.text_config.num_experts else {"experts_implementation": "eager"}
        return _from_pretrained("DiffusionGemmaForBlockDiffusion", path, dtype, None, False, extra)

    return Reference("transformers DiffusionGemmaForBlockDiffusion (built-in class)", False, build)


def _from_pretrained(
    cls_name: str,
    path: Path,
    dtype: torch.dtype,
    config: Any,
    trust_remote_code: bool,
    extra: dict[str, Any] | None = None,
) -> tuple[nn.Module, list[str]]:
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # it warns about every tensor it leaves unused; those are reported below
    hf_logging.disable_progress_bar()
    # transformers 4.x names the dtype `torch_dtype` (`dtype` from 4.56 on)
    dtype_key = "torch_dtype" if transformers.__version__.startswith("4.") else "dtype"
    kwargs: dict[str, Any] = {dtype_key: dtype, "output_loading_info": True, "local_files_only": True, **(extra or {})}
    notes: list[str] = []
    if trust_remote_code:
        kwargs["trust_remote_code"] = True
        config, notes = _remote_config(path)
    if config is not None:
        kwargs["config"] = config
    model, info = getattr(transformers, cls_name).from_pretrained(str(path), **kwargs)
    notes += [
        f"reference: {len(info[key])} {what} ({_first_names(info[key])})"
        for key, what in (
            ("missing_keys", "weights missing from the checkpoint, left at their initial values"),
            ("unexpected_keys", "checkpoint tensors it does not use"),
        )
        if info.get(key)
    ]
    if trust_remote_code and not transformers.__version__.startswith("4."):
        notes += _constructed_buffers(model, dtype)
    model.config.use_cache = False  # no cache: a forward that builds one reaches cache APIs transformers changed
    return model.eval(), notes


CONFIG_DEFAULTS_4X = ("pad_token_id", "bos_token_id", "eos_token_id")
"""Config attributes every 4.x config had (default None) and transformers 5 gives only where config.json sets them."""


def _remote_config(path: Path) -> tuple[Any, list[str]]:
    """The checkpoint's own config class on its config.json, with the 4.x defaults its code may read."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path), trust_remote_code=True, local_files_only=True)
    absent = [name for name in CONFIG_DEFAULTS_4X if not hasattr(config, name)]
    for name in absent:
        setattr(config, name, None)
    said = f"config: {', '.join(absent)} absent, given transformers 4.x's default None" if absent else ""
    return config, [said] if said else []


def _constructed_buffers(model: nn.Module, dtype: torch.dtype) -> list[str]:
    """Non-persistent buffers (RoPE's inverse frequencies: computed by the modules' constructors, not stored in
    the checkpoint) as a plain construction computes them. transformers 5 builds the model on the meta device
    and leaves such buffers to `_init_weights`, which code written for 4.x does not extend: they would hold
    whatever memory held."""
    with torch.device("cpu"):
        fresh = type(model)(model.config)
    fresh_buffers = dict(fresh.named_buffers())
    redone = []
    for prefix, module in model.named_modules():
        for name in getattr(module, "_non_persistent_buffers_set", ()):
            full = f"{prefix}.{name}" if prefix else name
            loaded, built = getattr(module, name), fresh_buffers.get(full)
            if isinstance(loaded, torch.Tensor) and built is not None and not torch.equal(loaded, built):
                setattr(module, name, built.to(device=loaded.device, dtype=loaded.dtype))
                redone.append(full)
    del fresh
    if not redone:
        return []
    names = _first_names(redone)
    return [f"reference: {len(redone)} buffers not in the checkpoint computed as its constructor does ({names})"]


def _first_names(names: list[str]) -> str:
    shown = sorted(names)
    return ", ".join(shown[:3]) + (", ..." if len(shown) > 3 else "")
