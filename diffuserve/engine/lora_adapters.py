"""The engine's table of loaded LoRA adapters: name -> slot, load (at start, on a request's first use, or over
HTTP), unload, and the errors a client sees for each refusal (bad adapter, limits, unknown name, in use). Knows
the model only through its `LoRASlots` (model/lora/slots.py), and requests only through the caller's word on
whether an adapter is in use.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from diffuserve.config import LoRAConfig
from diffuserve.core.adapter_ref import AdapterRef
from diffuserve.errors import RequestError

if TYPE_CHECKING:
    from diffuserve.model.lora.slots import LoRASlots


class AdapterNotFound(RequestError):
    """A request names an adapter that is not loaded (HTTP 404)."""

    code = "model_not_found"


class AdapterInUse(RequestError):
    """Unloading an adapter that requests still run with (HTTP 409)."""

    code = "adapter_in_use"


@dataclass(frozen=True)
class LoadedAdapter:
    ref: AdapterRef
    path: str


class LoRAAdapters:
    def __init__(self, config: LoRAConfig, slots: LoRASlots | None) -> None:
        self.config, self.slots = config, slots
        self.loaded: dict[str, LoadedAdapter] = {}
        self._keys = itertools.count(1)

    def load(self, name: str, path: str) -> AdapterRef:
        """Loads the adapter in `path` as `name` into a free slot; RequestError (naming the limit or the problem
        and the fix) if it cannot be, the table then unchanged."""
        if self.slots is None or not self.config.enable_lora:
            raise RequestError("lora_name", f"{name!r}: this server runs without adapters; restart with --enable-lora")
        if not name:
            raise RequestError("lora_name", "an adapter needs a name; pass a non-empty lora_name")
        if name in self.loaded:
            raise RequestError("lora_name", f"{name!r} is already loaded; unload it first or pick another name")
        used = {a.ref.slot for a in self.loaded.values()}
        free = [s for s in range(1, self.config.max_loras + 1) if s not in used]
        if not free:
            raise RequestError(
                "lora_name",
                f"{name!r}: {len(used)} adapters are loaded, the limit (max_loras); unload one or restart with "
                f"--max-loras {len(used) + 1}",
            )
        try:
            self.slots.load(free[0], name, Path(path))
        except ValueError as e:
            raise RequestError(None, str(e)) from None
        ref = AdapterRef(name, free[0], next(self._keys))
        self.loaded[name] = LoadedAdapter(ref, path)
        return ref

    def unload(self, name: str, in_use: bool) -> None:
        """Frees `name`'s slot; AdapterNotFound if it is not loaded, AdapterInUse while requests run with it."""
        self.get(name)
        if in_use:
            raise AdapterInUse(
                "lora_name", f"{name!r} is in use by running or waiting requests; retry once they finished"
            )
        assert self.slots is not None, "an adapter is loaded"
        self.slots.clear(self.loaded.pop(name).ref.slot)

    def get(self, name: str) -> AdapterRef:
        if name not in self.loaded:
            known = ", ".join(sorted(self.loaded)) or "none"
            raise AdapterNotFound("lora_name", f"{name!r} is not a loaded adapter (loaded: {known})")
        return self.loaded[name].ref

    def resolve(self, name: str, path: str | None) -> AdapterRef:
        """The adapter a request names: loaded already (same name, and same path if one is given), else loaded
        now from `path` (the offline API's LoRARequest)."""
        adapter = self.loaded.get(name)
        if adapter is not None and (path is None or Path(path) == Path(adapter.path)):
            return adapter.ref
        if adapter is not None:
            raise RequestError(
                "lora_request", f"{name!r} is loaded from {adapter.path!r}, not {path!r}; use another name"
            )
        if path is None:
            return self.get(name)
        return self.load(name, path)
