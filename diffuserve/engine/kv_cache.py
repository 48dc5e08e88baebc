"""KV-cache tensors: one K and one V tensor per layer, [num_pages * page_size, Hkv, D], preallocated from a memory
budget. Owns only the sizing arithmetic and the allocation; which page belongs to whom is `kv_pages`' business.
Under tensor parallelism each rank caches its own Hkv / size KV heads of every page."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffuserve.config import CacheConfig
from diffuserve.model.config import ModelArgs

CPU_DEFAULT_BUDGET = 4 << 30


@dataclass(frozen=True)
class KVCacheSpec:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        """K and V of every layer: 2 * layers * Hkv * D * itemsize."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * torch.finfo(self.dtype).bits // 8

    @property
    def bytes_per_page(self) -> int:
        return self.bytes_per_token * self.page_size


def resolve_page_size(page_size: int | None, block_length: int) -> int:
    """Default: the smallest multiple of the block length >= 16. A page must hold whole blocks (see kv_pages)."""
    if page_size is None:
        return block_length * -(-16 // block_length)
    if page_size % block_length:
        raise ValueError(
            f"page_size: {page_size} is not a multiple of the block length {block_length}; "
            f"use e.g. --page-size {block_length * -(-page_size // block_length)}"
        )
    return page_size


def num_pages_for(
    cache: CacheConfig,
    spec: KVCacheSpec,
    device: torch.device,
    max_num_seqs: int,
    max_model_len: int,
    activation_reserve: int,
) -> int:
    """Pages from an explicit count, a byte budget, or (default) the device's free memory."""
    if cache.num_pages is not None:
        return cache.num_pages
    budget = cache.kv_cache_memory
    if budget is None and device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = int(total * cache.gpu_memory_utilization) - (total - free) - activation_reserve
    if budget is None:
        # Room for max_num_seqs full-length sequences (their last block may reach one page past
        # max_model_len), at most CPU_DEFAULT_BUDGET, but always at least one such sequence.
        per_sequence = -(-max_model_len // spec.page_size) + 1
        wanted = min(max_num_seqs * per_sequence, CPU_DEFAULT_BUDGET // spec.bytes_per_page)
        return max(wanted, per_sequence)
    pages = budget // spec.bytes_per_page
    if pages < 1:
        raise ValueError(
            f"kv cache: a budget of {budget / 2**20:.1f} MiB holds no page of {spec.bytes_per_page / 2**20:.2f} MiB; "
            "raise --kv-cache-memory or --gpu-memory-utilization, or set --num-pages"
        )
    return int(pages)


def allocate_kv_cache(
    spec: KVCacheSpec, num_pages: int, device: torch.device
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    shape = (num_pages * spec.page_size, spec.num_kv_heads, spec.head_dim)
    k = [torch.zeros(shape, dtype=spec.dtype, device=device) for _ in range(spec.num_layers)]
    v = [torch.zeros(shape, dtype=spec.dtype, device=device) for _ in range(spec.num_layers)]
    return k, v


def spec_for(args: ModelArgs, page_size: int, dtype: torch.dtype, tensor_parallel_size: int = 1) -> KVCacheSpec:
    """Hybrid models cache K/V for their attention layers only (their GDN layers keep a recurrent state)."""
    hybrid = args.extra.get("hybrid")
    num_layers = args.num_layers - (sum(hybrid.is_gdn(i) for i in range(args.num_layers)) if hybrid else 0)
    return KVCacheSpec(num_layers, args.num_kv_heads // tensor_parallel_size, args.head_dim, page_size, dtype)
