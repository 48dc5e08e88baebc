"""LoRARequest: the adapter a request of the offline API runs with (vLLM's shape: name, integer id, path of a
PEFT adapter directory). The engine loads it on first use and keeps it loaded under its name."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str
