"""Model directory -> (ModelArgs, loaded model). Reads config.json, generation_config.json and safetensors
(one file or a sharded `model.safetensors.index.json`). Names map through the family's `weight_target`; a
missing, unexpected or misshapen weight is an error that names it. Knows nothing of requests, and of tokenizers
only the ids of the special tokens a family's config.json leaves to them (see special_tokens).

Under tensor / expert parallelism every rank reads the full checkpoint tensors and copies only its slices: a
parameter tagged with a `ShardSpec` (layers/linear) takes the pieces of each tensor that fall in its rank's part.
Quantized weights (model/quant) are built in place of their layers after sharding and take their tensors through
the quantized loader (quantized on the way, or decoded from a pre-quantized checkpoint's parts).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open
from torch import nn
from tqdm.auto import tqdm

from diffuserve.model.config import ModelArgs
from diffuserve.model.family import ModelFamily
from diffuserve.model.interface import DiffusionModel
from diffuserve.model.materialize import init_dummy_weights, materialize
from diffuserve.model.quant.apply import FormatFor, finalize_, quant_weights, quantize_modules_
from diffuserve.model.quant.checkpoint_base import CheckpointQuant
from diffuserve.model.quant.loading import QuantLoader, quant_plan
from diffuserve.model.quant.scheme import QuantScheme
from diffuserve.model.registry import deprecation_notice, family_for
from diffuserve.model.settings_check import is_setting_tensor
from diffuserve.model.settings_load import check_settings
from diffuserve.model.special_tokens import fill_special_token_ids
from diffuserve.model.tensor_parallel import apply_tp
from diffuserve.model.weight_names import WeightTarget
from diffuserve.model.weight_pieces import local_pieces

if TYPE_CHECKING:
    from diffuserve.distributed.group import ParallelGroup

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LOAD_FORMATS = ("auto", "dummy")

logger = logging.getLogger(__name__)
# Directories whose deprecation notice was logged: one model load reads its config more than once (the engine
# resolves the args, then each executor loads the weights), and the notice should show once, not per read.
_NOTIFIED: set[Path] = set()


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


def load_args(model_dir: str | Path, strict_config: bool = False) -> tuple[ModelFamily, ModelArgs]:
    """(family, args) of a model directory; its settings the family does not implement are logged, or raised
    under `strict_config` (settings_check)."""
    raw, generation = read_model_config(model_dir)
    family = family_for(raw)
    _notify_deprecated(raw, Path(model_dir))
    config = fill_special_token_ids(raw, generation, family.special_tokens, Path(model_dir))
    args = family.parse_args(config, generation)
    if family.checkpoint_args is not None:
        args = family.checkpoint_args(args, Path(model_dir))
    check_settings(raw, Path(model_dir), family, args, strict_config)
    return family, args


def _notify_deprecated(config: dict, model_dir: Path) -> None:
    notice = deprecation_notice(config)
    if notice is not None and model_dir.resolve() not in _NOTIFIED:
        _NOTIFIED.add(model_dir.resolve())
        logger.warning("%s (%s)", notice, model_dir / "config.json")


def resolve_dtype(dtype: str, args: ModelArgs) -> torch.dtype:
    """`auto` -> the checkpoint's dtype (float32 if it names none)."""
    name = args.torch_dtype or "float32" if dtype == "auto" else dtype
    if name not in DTYPES:
        raise ValueError(f"dtype: {name!r} is not supported; use one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def iter_checkpoint(model_dir: str | Path, progress: bool | None = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) over the checkpoint's safetensors files; `progress`: a bar over the files (None: when
    stderr is a terminal)."""
    path = Path(model_dir)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(read_json(index)["weight_map"].values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model: {str(path)!r} has no *.safetensors weights")
    disable = None if progress is None else not progress  # tqdm's None: only when stderr is a terminal
    with tqdm(total=len(files), desc="Loading safetensors shards", unit="shard", disable=disable) as bar:
        for file in files:
            with safe_open(str(path / file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                    yield name, f.get_tensor(name)
            bar.update(1)


def load_weights(
    model: nn.Module,
    family: ModelFamily,
    args: ModelArgs,
    model_dir: str | Path,
    progress: bool | None = False,
    reader: CheckpointQuant | None = None,
    tensors: Iterable[tuple[str, torch.Tensor]] | None = None,
) -> None:
    """Copies every checkpoint tensor into its parameter slice (this rank's part of it); checks full coverage.
    Quantized weights take their tensors through `QuantLoader` (`reader`: a pre-quantized checkpoint's format).
    `tensors`: (Hub name, tensor) pairs to load instead of `model_dir`'s files (a live weight update)."""
    quant = QuantLoader(model, family, args, reader)
    params = {name: p for name, p in model.named_parameters() if name not in quant.part_names}
    loaded = dict.fromkeys(params, 0)
    for name, tensor in tensors if tensors is not None else iter_checkpoint(model_dir, progress):
        if quant.take(name, tensor):
            continue
        target = family.weight_target(name, args)
        if target is None or (args.tie_word_embeddings and name == "lm_head.weight"):
            continue
        if target.param in quant.weights:
            quant.write_float(target, tensor, name)
            continue
        if target.param not in params and is_setting_tensor(name):
            continue  # a diffusion setting the engine does not implement, reported by load_args
        if target.param not in params:
            raise ValueError(
                f"checkpoint: unexpected weight {name!r} (no parameter {target.param!r} in {args.architecture})"
            )
        _check_unquantized(name, tensor)
        for dst, src in _local_views(params[target.param], target, tensor, name):
            dst.copy_(src)
            loaded[target.param] += src.numel()
    quant.check_complete(model_dir)
    missing = [name for name, param in params.items() if loaded[name] != param.numel()]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ValueError(f"checkpoint: missing weights {shown} in {str(model_dir)!r}")


def _check_unquantized(name: str, tensor: torch.Tensor) -> None:
    """A tensor for a 16/32-bit parameter must be 16/32-bit: quantized values without their scales (a missing
    `_scale_inv`, a config.json without its quantization_config) would load as nonsense."""
    if tensor.dtype not in DTYPES.values():
        raise ValueError(
            f"checkpoint: {name!r} is {str(tensor.dtype).removeprefix('torch.')} but nothing says how to dequantize "
            "it (no scales beside it, or no quantization_config in config.json)"
        )


def _local_views(
    param: nn.Parameter, target: WeightTarget, tensor: torch.Tensor, name: str
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(destination, source) views of checkpoint tensor `name` in `param` (this rank's part; weight_pieces)."""
    src = tensor.unsqueeze(0) if target.expert is not None else tensor  # aligned with the parameter's dims
    pieces = local_pieces(tuple(param.shape), getattr(param, "shard", None), target, tuple(tensor.shape), name)
    return [(param.data[dst], src[src_index]) for dst, src_index in pieces]


def build_model(
    family: ModelFamily,
    args: ModelArgs,
    max_model_len: int,
    dtype: torch.dtype,
    device: str | torch.device,
    group: ParallelGroup | None = None,
    expert_device: torch.device | None = None,
    format_for: FormatFor | None = None,
) -> DiffusionModel:
    """The family's model, this rank's part of it when `group` spans several ranks, allocated once (on the meta
    device first, see materialize); routed experts on `expert_device` if given (expert offload); the weights
    `format_for` names quantized (model/quant: after sharding, so each rank holds quantized parts of its shape)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = family.model_cls(args, max_model_len)
        if group is not None and group.size > 1:
            apply_tp(model, group)
        if format_for is not None:
            quantize_modules_(model, format_for, dtype)
        materialize(model, torch.device(device), expert_device)
    finally:
        torch.set_default_dtype(previous)
    return model


def load_model(
    model_dir: str | Path,
    dtype: str = "auto",
    device: str = "cpu",
    max_model_len: int | None = None,
    args: ModelArgs | None = None,
    group: ParallelGroup | None = None,
    expert_device: torch.device | None = None,
    load_format: str = "auto",
    seed: int = 0,
    quantization: QuantScheme | None = None,
) -> tuple[ModelArgs, DiffusionModel]:
    """Builds the family's model (this rank's part) in the resolved dtype and loads its weights: from the
    checkpoint (`auto`), or seeded random ones (`dummy`, no weights on disk needed). Weights are quantized as a
    pre-quantized checkpoint says, or as `quantization` asks of a 16/32-bit one (model/quant)."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format: {load_format!r} is not supported; use one of {', '.join(LOAD_FORMATS)}")
    family, parsed = load_args(model_dir)
    args = args or parsed
    resolved = resolve_dtype(dtype, args)
    plan = quant_plan(read_model_config(model_dir)[0], model_dir, family, args, quantization)
    if plan is not None and plan.reader is not None and load_format == "dummy":
        raise ValueError("load_format: dummy makes 16-bit weights; it cannot stand in for a pre-quantized checkpoint")
    model = build_model(
        family,
        args,
        max_model_len or args.max_position_embeddings,
        resolved,
        device,
        group,
        expert_device,
        plan.format_for if plan is not None else None,
    )
    if load_format == "dummy":
        init_dummy_weights(model, seed)
    else:
        progress = None if group is None or group.rank == 0 else False
        load_weights(model, family, args, model_dir, progress, plan.reader if plan is not None else None)
    if plan is not None:
        finalize_(model, resolved)
        logger.info("quantized %d weights: %s", len(quant_weights(model)), plan.label)
    return args, model.eval()
