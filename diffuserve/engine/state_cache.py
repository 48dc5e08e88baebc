"""Recurrent-state tensors of hybrid models: per GDN layer a conv-ring and an S tensor with one row per state
slot, plus each slot's last committed hidden row; sizing from a memory budget and allocation. Which slot belongs
to whom is `state_slots`' business; what the GDN layers do with the rows is `model/layers/gdn_step`'s.

    conv_caches[i]       [num_slots, conv_dim, k - 1]   model dtype
    recurrent_caches[i]  [num_slots, Hv, Dk, Dv]        fp32
    last_hidden          [num_slots, H]                 model dtype: the final hidden state of the slot's last
                                                        committed position (a block's first position is
                                                        predicted from it under the AR shift)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffuserve.config import CacheConfig
from diffuserve.model.clover_moe_config import hybrid_args, state_bytes_per_sequence
from diffuserve.model.config import ModelArgs


@dataclass(frozen=True)
class StateCacheSpec:
    args: ModelArgs
    dtype: torch.dtype

    @property
    def itemsize(self) -> int:
        return torch.finfo(self.dtype).bits // 8

    @property
    def state_bytes(self) -> int:
        """GDN state of one sequence: the model's formula (conv rings + S of every GDN layer)."""
        return state_bytes_per_sequence(self.args, self.itemsize)

    @property
    def bytes_per_slot(self) -> int:
        return self.state_bytes + self.args.hidden_size * self.itemsize


def has_recurrent_state(args: ModelArgs) -> bool:
    hybrid = args.extra.get("hybrid")
    return hybrid is not None and any(hybrid.is_gdn(i) for i in range(args.num_layers))


def num_slots_for(cache: CacheConfig, spec: StateCacheSpec, max_num_seqs: int) -> int:
    """Slots from the --state-cache-memory budget, or (default) one per running sequence plus as many again for
    prefix snapshots when prefix caching is on."""
    if cache.state_cache_memory is None:
        return max_num_seqs * (2 if cache.enable_prefix_caching else 1)
    slots = cache.state_cache_memory // spec.bytes_per_slot
    if slots < 1:
        raise ValueError(
            f"state_cache_memory: a budget of {cache.state_cache_memory / 2**20:.1f} MiB holds no recurrent-state "
            f"slot of {spec.bytes_per_slot / 2**20:.2f} MiB; raise --state-cache-memory"
        )
    return int(slots)


@dataclass
class StateCache:
    conv_caches: list[torch.Tensor]
    recurrent_caches: list[torch.Tensor]
    last_hidden: torch.Tensor

    @classmethod
    def allocate(cls, spec: StateCacheSpec, num_slots: int, device: torch.device) -> StateCache:
        args = spec.args
        gdn = hybrid_args(args).gdn
        num_gdn = sum(hybrid_args(args).is_gdn(i) for i in range(args.num_layers))
        conv = [
            torch.zeros(num_slots, gdn.conv_dim, gdn.conv_kernel - 1, dtype=spec.dtype, device=device)
            for _ in range(num_gdn)
        ]
        recurrent = [
            torch.zeros(
                num_slots, gdn.num_value_heads, gdn.key_head_dim, gdn.value_head_dim, dtype=torch.float32, device=device
            )
            for _ in range(num_gdn)
        ]
        return cls(conv, recurrent, torch.zeros(num_slots, args.hidden_size, dtype=spec.dtype, device=device))

    @property
    def num_slots(self) -> int:
        return self.last_hidden.shape[0]

    def state_bytes_per_slot(self) -> int:
        """Measured: bytes of GDN state one slot holds (conv rings + S over every GDN layer)."""
        tensors = self.conv_caches + self.recurrent_caches
        return sum(t[0].numel() * t.element_size() for t in tensors)

    def reset(self, slots: torch.Tensor) -> None:
        """The state of an empty prefix (zeros) in `slots` [S]."""
        for t in self.conv_caches + self.recurrent_caches:
            t.index_fill_(0, slots, 0)

    def copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Slot src[i]'s GDN state into slot dst[i] (snapshot or restore)."""
        for t in self.conv_caches + self.recurrent_caches:
            t.index_copy_(0, dst, t[src])
