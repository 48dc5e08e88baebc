"""Model shapes as data, torch-free: the cache each layer needs (its kind and sizes) and the bytes it takes.

The one place the cache arithmetic lives. A family declares, per layer, one of three cache kinds; the engine
sizes and allocates its caches from them (core/cache, worker/cache), the planner sums them for a deployment
(planner/memory.py, planner/recurrent_state.py) and the bench charges them to a step (bench/flops.py), so the
three agree by construction. Tensor parallelism splits every kind by heads: a rank keeps ceil(H / size) of them
(KV heads are replicated when the size exceeds their count, as vLLM does).

    PagedKV          K and V of every position, in pages          bytes/token   = 2 x Hkv x D x b
    SlidingWindowKV  the same, only the last `window` positions   bytes/token as PagedKV, capped per sequence
    RecurrentState   a fixed-size slot per sequence (GDN)         bytes/sequence = Hv x Dk x Dv x b_S
                                                                                + (k - 1) x conv_dim x b_conv
    CanvasState      per running sequence, beside the layers: a   bytes/sequence = C x H x b
                     renoise canvas's self-conditioning input

Dtypes are names (`fp32`, `bf16`, `fp16`, `fp8`): the planner's spelling; the engine maps torch dtypes onto them.
Knows nothing of torch, pages in use, requests or hardware.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
"""Bytes per element of each cache dtype name."""


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def heads_per_rank(num_heads: int, tensor_parallel_size: int) -> int:
    """Heads one rank keeps: split evenly, replicated when there are fewer heads than ranks."""
    return ceil_div(num_heads, tensor_parallel_size)


@dataclass(frozen=True)
class PagedKV:
    """A full-attention layer: K and V of every position, in pages of the engine's page table."""

    num_kv_heads: int
    head_dim: int
    dtype: str = "bf16"

    @property
    def group(self) -> str:
        """The page table the layer's K/V live in (layers of one group share it)."""
        return "kv"

    def bytes_per_token(self, tensor_parallel_size: int = 1) -> int:
        """K and V of one position on one rank: 2 x Hkv per rank x D x bytes."""
        heads = heads_per_rank(self.num_kv_heads, tensor_parallel_size)
        return 2 * heads * self.head_dim * DTYPE_BYTES[self.dtype]

    def tokens_kept(self, context: int, block_length: int, page_size: int) -> int:
        """Positions a sequence of `context` tokens keeps: all of them, in whole pages."""
        return ceil_div(context, page_size) * page_size


def window_group(window: int) -> str:
    """The name of the page group of the sliding-window layers of window `window`."""
    return f"window{window}"


@dataclass(frozen=True)
class SlidingWindowKV(PagedKV):
    """A sliding-window attention layer: a query sees at most the `window` positions before it, so a sequence
    keeps the window behind its current block plus the block itself; older pages are freed."""

    window: int = 0

    @property
    def group(self) -> str:
        return window_group(self.window)

    def tokens_kept(self, context: int, block_length: int, page_size: int) -> int:
        """The window behind the block's first query plus the block, in whole pages, at most the context."""
        kept = ceil_div(self.window + block_length, page_size) * page_size
        return min(super().tokens_kept(context, block_length, page_size), kept)


@dataclass(frozen=True)
class RecurrentState:
    """A Gated DeltaNet layer: per sequence the delta-rule state S [Hv, Dk, Dv] and the causal conv's ring of
    its last k - 1 inputs over q | k | v ([conv_dim, k - 1]), whatever the sequence's length."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    conv_dtype: str = "bf16"
    state_dtype: str = "fp32"
    """S accumulates over the whole sequence: kept in fp32 whatever the weights are."""

    @property
    def group(self) -> str:
        return "state"

    def conv_dim(self, tensor_parallel_size: int = 1) -> int:
        """Conv channels on one rank: its q and k key heads and its v value heads."""
        key = heads_per_rank(self.num_key_heads, tensor_parallel_size) * self.key_head_dim
        return 2 * key + heads_per_rank(self.num_value_heads, tensor_parallel_size) * self.value_head_dim

    def bytes_per_sequence(self, tensor_parallel_size: int = 1) -> int:
        """S plus the conv ring of one sequence on one rank."""
        return self.state_bytes(tensor_parallel_size) + self.ring_bytes(tensor_parallel_size)

    def state_bytes(self, tensor_parallel_size: int = 1) -> int:
        heads = heads_per_rank(self.num_value_heads, tensor_parallel_size)
        return heads * self.key_head_dim * self.value_head_dim * DTYPE_BYTES[self.state_dtype]

    def ring_bytes(self, tensor_parallel_size: int = 1) -> int:
        return (self.conv_kernel - 1) * self.conv_dim(tensor_parallel_size) * DTYPE_BYTES[self.conv_dtype]


LayerCache = PagedKV | SlidingWindowKV | RecurrentState


@dataclass(frozen=True)
class CanvasState:
    """A self-conditioned renoise canvas (DiffusionGemma): per running sequence, the previous step's soft
    embeddings [C, H] that its next step reads, whatever the sequence's length. Not recomputable from tokens: a
    sequence that loses it (preemption) redoes its canvas from the canvas's first step."""

    canvas_length: int
    hidden_size: int
    dtype: str = "bf16"

    @property
    def group(self) -> str:
        return "canvas"

    def bytes_per_sequence(self, tensor_parallel_size: int = 1) -> int:
        """C x H x bytes, on rank 0 only (the step's inputs carry it to the other ranks)."""
        return self.canvas_length * self.hidden_size * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class CacheLayout:
    """The cache every layer of a model needs, in layer order, and any per-sequence decoding state beside them."""

    layers: tuple[LayerCache, ...]
    canvas: CanvasState | None = None
    """The self-conditioning input of renoise canvases (None: the model has none)."""

    def group_layers(self, group: str) -> list[int]:
        """Ids of the layers whose cache lives in `group`, in layer order."""
        return [i for i, spec in enumerate(self.layers) if spec.group == group]

    @property
    def groups(self) -> list[str]:
        """The cache groups, in the order of their first layer."""
        return list(dict.fromkeys(spec.group for spec in self.layers))

    def index_in_group(self, layer_id: int) -> int:
        """The layer's index among the layers of its group: which of the group's tensors it reads."""
        return self.group_layers(self.layers[layer_id].group).index(layer_id)

    def paged(self, group: str) -> list[PagedKV]:
        return [s for s in self.layers if s.group == group and isinstance(s, PagedKV)]

    @property
    def recurrent(self) -> list[RecurrentState]:
        return [s for s in self.layers if isinstance(s, RecurrentState)]

    @property
    def has_recurrent_state(self) -> bool:
        return bool(self.recurrent)

    def kv_bytes_per_token(self, tensor_parallel_size: int = 1, group: str = "kv") -> int:
        """K and V one position adds in `group` (default: the full-attention layers), on one rank."""
        return sum(s.bytes_per_token(tensor_parallel_size) for s in self.paged(group))

    def state_bytes_per_sequence(self, tensor_parallel_size: int = 1) -> int:
        """The recurrent state one sequence holds over every GDN layer, on one rank."""
        return sum(s.bytes_per_sequence(tensor_parallel_size) for s in self.recurrent)

    def with_kv_dtype(self, dtype: str) -> CacheLayout:
        """Every attention layer's K/V in `dtype` (`--kv-cache-dtype`); the recurrent state keeps its own dtypes."""
        return replace(
            self, layers=tuple(replace(s, dtype=dtype) if isinstance(s, PagedKV) else s for s in self.layers)
        )


def attention_layout(num_layers: int, num_kv_heads: int, head_dim: int, dtype: str) -> CacheLayout:
    """Every layer full attention with the same K/V shape (SDAR, LLaDA2)."""
    return CacheLayout((PagedKV(num_kv_heads, head_dim, dtype),) * num_layers)
