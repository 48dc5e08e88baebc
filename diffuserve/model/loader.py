"""Model directory -> (ModelArgs, loaded model). Reads config.json, generation_config.json and safetensors
(one file or a sharded `model.safetensors.index.json`). Names map through the family's `weight_target`; a
missing, unexpected or misshapen weight is an error that names it. Knows nothing of requests, and of tokenizers
only the ids of the special tokens a family's config.json leaves to them (see special_tokens).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.registry import ModelFamily, family_for
from diffuserve.model.special_tokens import fill_special_token_ids

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def read_model_config(model_dir: str | Path) -> tuple[dict, dict]:
    """-> (config.json, generation_config.json or {}), with clear errors for a wrong path."""
    path = Path(model_dir)
    if not path.exists():
        raise ValueError(f"model: path {str(path)!r} does not exist; pass a model directory")
    if not (path / "config.json").is_file():
        raise ValueError(f"model: {str(path)!r} has no config.json; pass a Hugging Face style model directory")
    generation = path / "generation_config.json"
    return read_json(path / "config.json"), read_json(generation) if generation.is_file() else {}


def load_args(model_dir: str | Path) -> tuple[ModelFamily, ModelArgs]:
    config, generation = read_model_config(model_dir)
    family = family_for(config)
    config = fill_special_token_ids(config, generation, family.special_tokens, Path(model_dir))
    return family, family.parse_args(config, generation)


def resolve_dtype(dtype: str, args: ModelArgs) -> torch.dtype:
    """`auto` -> the checkpoint's dtype (float32 if it names none)."""
    name = args.torch_dtype or "float32" if dtype == "auto" else dtype
    if name not in DTYPES:
        raise ValueError(f"dtype: {name!r} is not supported; use one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def iter_checkpoint(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    path = Path(model_dir)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(read_json(index)["weight_map"].values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model: {str(path)!r} has no *.safetensors weights")
    for file in files:
        with safe_open(str(path / file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                yield name, f.get_tensor(name)


def load_weights(model: nn.Module, family: ModelFamily, args: ModelArgs, model_dir: str | Path) -> None:
    """Copies every checkpoint tensor into its parameter slice; checks full coverage."""
    params = dict(model.named_parameters())
    loaded = dict.fromkeys(params, 0)
    for name, tensor in iter_checkpoint(model_dir):
        target = family.weight_target(name, args)
        if target is None or (args.tie_word_embeddings and name == "lm_head.weight"):
            continue
        if target.param not in params:
            raise ValueError(
                f"checkpoint: unexpected weight {name!r} (no parameter {target.param!r} in {args.architecture})"
            )
        dst = target.view(params[target.param].data)
        if dst.shape != tensor.shape:
            raise ValueError(f"checkpoint: weight {name!r} has shape {list(tensor.shape)}, expected {list(dst.shape)}")
        dst.copy_(tensor)
        loaded[target.param] += tensor.numel()
    missing = [name for name, param in params.items() if loaded[name] != param.numel()]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ValueError(f"checkpoint: missing weights {shown} in {str(model_dir)!r}")


def load_model(
    model_dir: str | Path, dtype: str = "auto", device: str = "cpu", max_model_len: int | None = None,
    args: ModelArgs | None = None,
) -> tuple[ModelArgs, nn.Module]:
    """Builds the family's model on `device` in the resolved dtype and loads its weights."""
    family, parsed = load_args(model_dir)
    args = args or parsed
    torch_dtype = resolve_dtype(dtype, args)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)
    try:
        with torch.device(device):
            model = family.model_cls(args, max_model_len or args.max_position_embeddings)
    finally:
        torch.set_default_dtype(previous)
    load_weights(model, family, args, model_dir)
    return args, model.eval()
