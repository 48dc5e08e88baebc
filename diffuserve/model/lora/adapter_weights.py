"""A PEFT adapter's `adapter_model.safetensors` -> one `AdapterTensors` per engine linear segment it adapts.

PEFT names a module's pair `base_model.model.<module>.lora_A.weight` [r, in] and `...lora_B.weight` [out, r],
with `<module>` the Hugging Face model's name (e.g. `model.layers.0.self_attn.q_proj`). The family's own
`weight_target` maps `<module>.weight` to where the engine keeps that weight: a whole linear, or a row range of a
packed one (q | k | v in `qkv_proj`, gate | up in `gate_up_proj`), which is then the rows B writes. Routed
experts, embeddings and anything that is not a linear layer's weight are refused with one line. Knows nothing of
the slots the weights go to (slots.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from diffuserve.model.config import ModelArgs
from diffuserve.model.family import ModelFamily
from diffuserve.model.lora.adapter_config import WEIGHTS_FILE, AdapterConfig, AdapterError

_NAME = re.compile(r"base_model\.model\.(.+)\.lora_([AB])(?:\.[\w-]+)?\.weight")


@dataclass(frozen=True)
class AdapterTensors:
    """One adapted segment: rows [row_start, row_start + rows) of the engine linear `module` get
    scaling * B @ A (scaling folded into `b`)."""

    module: str
    row_start: int
    rows: int | None
    """None: every row of the linear."""
    a: torch.Tensor
    """[r, in]"""
    b: torch.Tensor
    """[rows, r], already multiplied by the adapter's scaling."""


def read_adapter_weights(
    path: Path, name: str, config: AdapterConfig, family: ModelFamily, args: ModelArgs
) -> list[AdapterTensors]:
    """Every segment the adapter in `path` adapts (AdapterError for a tensor the engine cannot apply)."""
    try:
        pairs = _read_pairs(path / WEIGHTS_FILE, name)
    except SafetensorError as e:
        raise AdapterError(f"adapter {name!r}: {str(path / WEIGHTS_FILE)!r} is not a safetensors file ({e})") from None
    if not pairs:
        raise AdapterError(f"adapter {name!r}: {WEIGHTS_FILE} holds no LoRA weights")
    return [_segment(module, pair, name, config, family, args) for module, pair in sorted(pairs.items())]


def _read_pairs(file: Path, name: str) -> dict[str, dict[str, torch.Tensor]]:
    """{module: {"A": lora_A, "B": lora_B}} of the file; AdapterError for a tensor that is neither."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    with safe_open(str(file), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 - safe_open is not a dict
            m = _NAME.fullmatch(key)
            if m is None:
                raise AdapterError(
                    f"adapter {name!r}: tensor {key!r} is not a LoRA A/B weight of a linear layer (embedding LoRA, "
                    "DoRA magnitudes and biases are not supported); retrain targeting linear layers only"
                )
            pairs.setdefault(m[1], {})[m[2]] = f.get_tensor(key)
    return pairs


def _segment(
    module: str, pair: dict[str, torch.Tensor], name: str, config: AdapterConfig, family: ModelFamily, args: ModelArgs
) -> AdapterTensors:
    if set(pair) != {"A", "B"}:
        missing = "lora_B" if "A" in pair else "lora_A"
        raise AdapterError(f"adapter {name!r}: module {module!r} has no {missing} weight; the file is incomplete")
    target = family.weight_target(f"{module}.weight", args)
    if target is None or not target.param.endswith(".weight"):
        raise AdapterError(
            f"adapter {name!r}: target module {module!r} is not a linear layer of this model; drop it from "
            "target_modules"
        )
    if target.expert is not None:
        raise AdapterError(
            f"adapter {name!r}: target module {module!r} is a routed expert, which adapters cannot target yet; "
            "retrain without the experts (attention, GDN, dense MLP and shared-expert modules are supported)"
        )
    a, b, rank = pair["A"], pair["B"], config.rank_of(module)
    if a.dim() != 2 or b.dim() != 2 or a.shape[0] != rank or b.shape[1] != rank:
        raise AdapterError(
            f"adapter {name!r}: module {module!r} has lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)}, not "
            f"[r, in] and [out, r] with r={rank} (adapter_config.json); the files do not belong together"
        )
    scaled = b.float() * config.scaling(module)
    return AdapterTensors(target.param.removesuffix(".weight"), target.row_start, target.rows, a.float(), scaled)
