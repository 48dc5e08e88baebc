"""Names transformers 4.x had and later versions removed, given back while a reference written for 4.x is built
and run, so that its files run unmodified under any: `LossKwargs` (a TypedDict of the loss keywords), `DynamicCache[i]`
(layer i's (keys, values)), `ROPE_INIT_FUNCTIONS["default"]` (the plain RoPE inverse frequencies),
`is_torch_fx_available` (True), each as 4.x
defined it, each only where the files name it and the installed transformers lacks it; every one is reported
and taken away again on exit. Knows nothing of models or of the comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypedDict

import torch


class LossKwargs(TypedDict, total=False):
    """transformers.utils.LossKwargs as 4.x exported it."""

    num_items_in_batch: int | None


def _dynamic_cache_item(self: Any, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """DynamicCache[i] as 4.x answered it: layer i's (keys, values)."""
    layer = self.layers[layer_idx]
    return layer.keys, layer.values


def _default_rope(config: Any, device: torch.device | None = None, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """4.x's `_compute_default_rope_parameters`: 1 / theta^(2i / d) over the rotary part of each head, scale 1."""
    theta = getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dim = int(head_dim * getattr(config, "partial_rotary_factor", 1.0))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (theta**exponents), 1.0


@dataclass(frozen=True)
class _Restored:
    name: str
    """The name the files use (what triggers it)."""
    said: str
    missing: Callable[[], bool]
    put: Callable[[], Callable[[], None]]
    """Installs it; returns what takes it away."""


def _put_loss_kwargs() -> Callable[[], None]:
    import transformers.utils

    transformers.utils.LossKwargs = LossKwargs  # type: ignore[attr-defined]
    return lambda: delattr(transformers.utils, "LossKwargs")


def _put_cache_item() -> Callable[[], None]:
    from transformers.cache_utils import DynamicCache

    setattr(DynamicCache, "__getitem__", _dynamic_cache_item)  # noqa: B010
    return lambda: delattr(DynamicCache, "__getitem__")


def _put_default_rope() -> Callable[[], None]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    functions: dict[str, Any] = ROPE_INIT_FUNCTIONS
    functions["default"] = _default_rope
    return lambda: functions.__delitem__("default")


def _put_fx_available() -> Callable[[], None]:
    import transformers.utils.import_utils as import_utils

    import_utils.is_torch_fx_available = lambda: True  # type: ignore[attr-defined]  # 4.x: torch >= 1.10
    return lambda: delattr(import_utils, "is_torch_fx_available")


def _lacks(module: str, name: str) -> Callable[[], bool]:
    def check() -> bool:
        import importlib

        return not hasattr(importlib.import_module(module), name)

    return check


def _rope_default_missing() -> bool:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return "default" not in ROPE_INIT_FUNCTIONS


RESTORED = (
    _Restored(
        "LossKwargs",
        "transformers.utils.LossKwargs (a TypedDict of the loss keywords, as 4.x had it)",
        _lacks("transformers.utils", "LossKwargs"),
        _put_loss_kwargs,
    ),
    _Restored(
        "DynamicCache",
        "DynamicCache[i] (layer i's (keys, values), as 4.x had it)",
        lambda: not hasattr(__import__("transformers.cache_utils").cache_utils.DynamicCache, "__getitem__"),
        _put_cache_item,
    ),
    _Restored(
        "is_torch_fx_available",
        "transformers.utils.import_utils.is_torch_fx_available (True, as 4.x answered)",
        _lacks("transformers.utils.import_utils", "is_torch_fx_available"),
        _put_fx_available,
    ),
    _Restored(
        "ROPE_INIT_FUNCTIONS",
        'ROPE_INIT_FUNCTIONS["default"] (plain RoPE, as 4.x computed it)',
        _rope_default_missing,
        _put_default_rope,
    ),
)


@contextmanager
def restoring(sources: list[str]) -> Iterator[list[str]]:
    """Gives back what the files' text names and transformers lacks; yields the report's lines."""
    import transformers

    undo: list[Callable[[], None]] = []
    said: list[str] = []
    for restored in RESTORED:
        if any(restored.name in s for s in sources) and restored.missing():
            undo.append(restored.put())
            said.append(f"{restored.said}: transformers {transformers.__version__} has none")
    try:
        yield said
    finally:
        for take_away in reversed(undo):
            take_away()
