"""Allocates every cache a model's layout declares on one rank: the recurrent-state slots first (their count is
fixed by --state-cache-memory or max_num_seqs), the canvas slots (max_num_seqs, rank 0 only), then the
sliding-window groups (bounded by their window), then the full-attention pages from what is left of the budget.
The ranks agree on the smallest page count, since rank 0 hands out pages for all of them. Returns the tensors
and their sizes (`CacheSizes`, what the torch-free cache manager is built from). Sizes come from the layout's
specs, so what is allocated is what the planner and the bench count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffuserve.config import CacheConfig
from diffuserve.core.cache.manager import CacheSizes
from diffuserve.distributed.group import ParallelGroup, agree_min
from diffuserve.model.shapes import DTYPE_BYTES, CacheLayout, SlidingWindowKV
from diffuserve.model.step_inputs import StepInputs
from diffuserve.worker.cache.canvas_step import CanvasTensors
from diffuserve.worker.cache.paged_step import TORCH_DTYPES, PagedTensors
from diffuserve.worker.cache.state_step import StateTensors
from diffuserve.worker.cache.step_metadata import StepMetadata

CPU_DEFAULT_BUDGET = 4 << 30


def dtype_name(dtype: torch.dtype) -> str:
    """The shapes module's name of a torch dtype."""
    return next(name for name, t in TORCH_DTYPES.items() if t == dtype)


def resolve_page_size(page_size: int | None, multiple: int) -> int:
    """Default: the smallest multiple of `multiple` >= 16. `multiple` is the block length, unless the model's
    pages need not hold whole blocks (StepRules.page_multiple; see core/cache/paged.py)."""
    if page_size is None:
        return multiple * -(-16 // multiple)
    if page_size % multiple:
        raise ValueError(
            f"page_size: {page_size} is not a multiple of the block length {multiple}; "
            f"use e.g. --page-size {multiple * -(-page_size // multiple)}"
        )
    return page_size


def num_slots_for(cache: CacheConfig, slot_bytes: int, max_num_seqs: int) -> int:
    """Slots from the --state-cache-memory budget, or (default) one per running sequence plus as many again for
    prefix snapshots when prefix caching is on."""
    if cache.state_cache_memory is None:
        return max_num_seqs * (2 if cache.enable_prefix_caching else 1)
    slots = cache.state_cache_memory // slot_bytes
    if slots < 1:
        raise ValueError(
            f"state_cache_memory: a budget of {cache.state_cache_memory / 2**20:.1f} MiB holds no recurrent-state "
            f"slot of {slot_bytes / 2**20:.2f} MiB; raise --state-cache-memory"
        )
    return int(slots)


def slot_bytes_for(layout: CacheLayout, hidden_size: int, tp: int) -> int:
    """One slot: the layout's state of a sequence plus its last hidden row (in the conv dtype)."""
    hidden = hidden_size * DTYPE_BYTES[layout.recurrent[0].conv_dtype]
    return layout.state_bytes_per_sequence(tp) + hidden


def num_pages_for(
    cache: CacheConfig,
    bytes_per_page: int,
    page_size: int,
    device: torch.device,
    sequence_tokens: tuple[int, int],
    activation_reserve: int,
) -> int:
    """Pages of the full-attention group from an explicit count, a byte budget, or (default) the device's free
    memory. `sequence_tokens`: (max_num_seqs, max_model_len)."""
    if cache.num_pages is not None:
        return cache.num_pages
    budget = cache.kv_cache_memory
    if budget is None and device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = int(total * cache.gpu_memory_utilization) - (total - free) - activation_reserve
    if budget is None:
        # Room for max_num_seqs full-length sequences (their last block may reach one page past
        # max_model_len), at most CPU_DEFAULT_BUDGET, but always at least one such sequence.
        max_num_seqs, max_model_len = sequence_tokens
        per_sequence = -(-max_model_len // page_size) + 1
        wanted = min(max_num_seqs * per_sequence, CPU_DEFAULT_BUDGET // bytes_per_page)
        return max(wanted, per_sequence)
    pages = budget // bytes_per_page
    if pages < 1:
        raise ValueError(
            f"kv cache: a budget of {budget / 2**20:.1f} MiB holds no page of {bytes_per_page / 2**20:.2f} MiB; "
            "raise --kv-cache-memory or --gpu-memory-utilization, or set --num-pages"
        )
    return int(pages)


def window_pages_for(spec: SlidingWindowKV, page_size: int, max_num_seqs: int, max_span: int) -> int:
    """A window group holds at most the window and one step's span per running sequence (and one scratch page)."""
    return max_num_seqs * (-(-(spec.window + max_span) // page_size) + 2)


@dataclass(frozen=True)
class CacheRequest:
    """What the engine's configuration asks of the caches on this rank."""

    cache: CacheConfig
    page_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    hidden_size: int
    activation_reserve: int


@dataclass
class CacheTensors:
    paged: dict[str, PagedTensors]
    """Per page group ("kv" first): its K/V tensors."""
    state: StateTensors | None
    """The recurrent state of models with GDN layers."""
    canvas: CanvasTensors | None = None
    """The self-conditioning pool of models with renoise canvases (rank 0's; the other ranks hold no slot)."""

    def before_forward(self, meta: StepMetadata) -> None:
        """What a kind prepares before the forward reads it: the recurrent state's restores and resets (pages need
        nothing: each layer writes the step's K/V before attending; canvas rows were gathered on rank 0)."""
        if self.state is not None and meta.state is not None:
            self.state.before_forward(meta.state)

    def after_forward(self, meta: StepMetadata, hidden: torch.Tensor) -> None:
        """What a kind keeps from the forward's hidden rows [N, H]: each state slot's last committed row."""
        if self.state is not None and meta.state is not None:
            self.state.after_forward(meta.state, hidden)

    def bind(self, meta: StepMetadata) -> StepInputs:
        """The model's inputs for a step planned as `meta`: each kind's metadata bound to its tensors."""
        pages = {name: self.paged[name].bind(group) for name, group in meta.pages.items()}
        return StepInputs(
            pages["kv"],
            {name: inputs for name, inputs in pages.items() if name != "kv"},
            self.state.bind(meta.state) if self.state is not None and meta.state is not None else None,
            self.canvas.bind(meta.canvas) if self.canvas is not None and meta.canvas is not None else None,
        )


def allocate_caches(
    layout: CacheLayout, want: CacheRequest, group: ParallelGroup, device: torch.device
) -> tuple[CacheTensors, CacheSizes]:
    tp = group.size
    state, num_slots, slot_bytes = None, 0, 0
    if layout.has_recurrent_state:
        slot_bytes = slot_bytes_for(layout, want.hidden_size, tp)
        num_slots = num_slots_for(want.cache, slot_bytes, want.max_num_seqs)
        state = StateTensors.allocate(layout.recurrent, num_slots, want.hidden_size, tp, device)
    paged, windows = {}, {}
    for name in (g for g in layout.groups if g not in ("kv", "state")):
        spec = layout.paged(name)[0]
        assert isinstance(spec, SlidingWindowKV), f"cache group {name}: only sliding-window groups besides kv"
        pages = agree_min(group, window_pages_for(spec, want.page_size, want.max_num_seqs, want.max_num_batched_tokens))
        paged[name] = PagedTensors.allocate(layout.paged(name), want.page_size, pages, tp, device)
        windows[name] = (spec.window, pages)
    bytes_per_page = layout.kv_bytes_per_token(tp) * want.page_size
    sequences = (want.max_num_seqs, want.max_model_len)
    num_pages = num_pages_for(want.cache, bytes_per_page, want.page_size, device, sequences, want.activation_reserve)
    kv = PagedTensors.allocate(layout.paged("kv"), want.page_size, agree_min(group, num_pages), tp, device)
    canvas, canvas_slots, canvas_bytes = None, 0, 0
    if layout.canvas is not None:
        canvas_slots, canvas_bytes = want.max_num_seqs, layout.canvas.bytes_per_sequence()
        canvas = CanvasTensors.allocate(layout.canvas, canvas_slots if group.rank == 0 else 0, device)
    sizes = CacheSizes(want.page_size, kv.num_pages, windows, num_slots, slot_bytes, canvas_slots, canvas_bytes)
    return CacheTensors({"kv": kv, **paged}, state, canvas), sizes
