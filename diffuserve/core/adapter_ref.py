"""AdapterRef: which loaded LoRA adapter a request runs with. Torch-free: the scheduler and the cache manager
read it (the prefix-cache hash chain starts from the adapter's identity, so pages computed under one adapter are
never reused by a request of another or of the base model), the model runner reads its slot. Knows nothing of
adapter files (model/lora) or of the table of loaded adapters (engine/lora_adapters.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdapterRef:
    name: str
    slot: int
    """The adapter's slot in the model's LoRA weights (1..max_loras; the base model is slot 0)."""
    key: int
    """Unique per load of an adapter (a reload under the same name gets a new one): its prefix-cache identity."""

    @property
    def hash_root(self) -> int:
        """The parent hash of the request's first page (the base model's is None)."""
        return hash(("lora", self.key))
