"""The cache manager: every cache kind of a model behind one interface, so the scheduler never knows which kinds
exist. Torch-free.

The kinds come from the model's cache layout (model/shapes.py): always the full-attention pages ("kv"), and, as
the family declares them, sliding-window page groups, the recurrent-state slots and the canvas slots. A kind
(`CacheKind`) owns the ids of its memory (pages or slots) and which request holds which; the manager calls every
kind at the same points of a request's life and combines the answers:

    check_fits      could the request's whole life ever fit?            (at add; it must fit every kind)
    prefix_limit    how far may a prefix hit reach?                     (admission; the least of them)
    commit_limit    how far may this step's commits go?                 (planning; the least of them)
    match_prefix    how much of a cached prefix can this kind restore?  (admission; each kind narrows the previous
                                                                         ones' answer, so the state kind, which needs
                                                                         a snapshot exactly at the end, comes last)
    trim_prefix     keep only that much
    can_allocate    is there room for this step's work?                 (preemption loop, admission)
    allocate        take it; may annotate the work (a state slot to restore from, a snapshot to take)
    apply           after the forward: register what became reusable, return scratch memory
    release         the request finished or was preempted: give everything back

Every kind's memory but a canvas slot's is recomputable: a preempted request is recomputed from its tokens, never
saved (and its canvas redone, core/cache/canvas.py). The manager
also owns the prefix hashes (a committed full page's chain hash, computed once and shared by the kinds) and a
request's committed count (`num_computed_tokens`), which only a prefix hit, a commit or a release moves.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffuserve.config import CacheConfig
from diffuserve.core.cache.canvas import CanvasKind
from diffuserve.core.cache.kind import CacheKind
from diffuserve.core.cache.paged import PagedKind, PagePool, chain_hash
from diffuserve.core.cache.recurrent import RecurrentKind, SlotPool, StateStats
from diffuserve.core.request import Request
from diffuserve.core.step import ScheduledRequest
from diffuserve.errors import ContextLengthExceeded


@dataclass(frozen=True)
class CacheSizes:
    """What one rank allocated (worker/cache/allocation.py), agreed by every rank."""

    page_size: int
    num_pages: int
    """Full-attention pages."""
    windows: dict[str, tuple[int, int]]
    """Sliding-window groups: name -> (window, pages)."""
    num_slots: int = 0
    """Recurrent-state slots (0: the model keeps no recurrent state)."""
    slot_bytes: int = 0
    num_canvas_slots: int = 0
    """Canvas slots (0: the model has no self-conditioned canvases)."""
    canvas_slot_bytes: int = 0


class CacheManager:
    @classmethod
    def build(cls, sizes: CacheSizes, cache: CacheConfig, max_num_batched_tokens: int) -> CacheManager:
        """The manager over pools of the allocated sizes: full-attention pages, window groups, state slots."""
        prefix = cache.enable_prefix_caching
        kinds: list[CacheKind] = [PagedKind("kv", PagePool(sizes.num_pages, sizes.page_size, prefix))]
        for name, (window, pages) in sizes.windows.items():
            kinds.append(PagedKind(name, PagePool(pages, sizes.page_size, prefix), window, max_num_batched_tokens))
        if sizes.num_slots:
            slots = SlotPool(sizes.num_slots, sizes.slot_bytes, prefix)
            kinds.append(RecurrentKind(slots, sizes.page_size, cache.state_snapshot_interval))
        if sizes.num_canvas_slots:
            kinds.append(CanvasKind(sizes.num_canvas_slots, sizes.canvas_slot_bytes))
        return cls(kinds)

    def __init__(self, kinds: list[CacheKind]) -> None:
        pages = kinds[0]
        assert isinstance(pages, PagedKind) and pages.window is None, "the first kind is the full-attention pages"
        self.kinds, self._pages = kinds, pages
        self.page_size = pages.page_size
        self.slots: SlotPool | None = next((k.pool for k in kinds if isinstance(k, RecurrentKind)), None)
        """The recurrent-state slots (models with GDN layers), else None."""
        self.weights_version = 0
        """Bumped when the weights change (`flush_prefix_cache`): it roots every prefix hash, so pages and state
        snapshots computed with the old weights are never matched again (they are evicted as any unused page)."""

    def flush_prefix_cache(self) -> None:
        """No cached prefix computed before this call is reused after it (the weights changed)."""
        self.weights_version += 1

    @property
    def pool(self) -> PagePool:
        """The full-attention pages: what bounds a request's length."""
        return self._pages.pool

    def state_stats(self, hit_rate: float) -> StateStats | None:
        """The recurrent-state slots' statistics (None: the model keeps no recurrent state)."""
        return self.slots.stats(hit_rate) if self.slots is not None else None

    def check_fits(self, request: Request) -> None:
        """Raises ContextLengthExceeded if the request's whole life exceeds some kind's capacity; it names the
        prompt when even one generated token would not fit."""
        answers = [kind.check_fits(request) for kind in self.kinds]
        if all(fits for fits, _ in answers):
            return
        num_pages = self.pool.num_pages
        prompt_only = -(-(request.num_prompt_tokens + 1) // self.page_size) > num_pages
        raise ContextLengthExceeded(
            "prompt" if prompt_only else "max_tokens",
            f"prompt ({request.num_prompt_tokens} tokens) + max_tokens ({request.params.max_tokens}) need "
            f"{' and '.join(need for _, need in answers)}, the cache has {num_pages} pages; lower max_tokens or "
            "raise --num-pages / --kv-cache-memory",
        )

    def start_step(self) -> None:
        for kind in self.kinds:
            kind.start_step()

    def commit_limit(self, request: Request, target: int) -> int:
        """The position this step's commits may reach: the request's commit target `target`, or less where a
        kind says so."""
        limit = target
        for kind in self.kinds:  # a loop, not min() over a generator: this runs for every request every step
            limit = min(limit, kind.commit_limit(request, target))
        return limit

    def match_prefix(self, request: Request) -> int:
        """Reuses the longest cached prefix of whole pages before the request's block that every kind can
        restore; returns how many prompt tokens the full-attention pages alone held (a statistic)."""
        page = self.page_size
        limit = min(kind.prefix_limit(request) for kind in self.kinds) // page
        hashes, parent = [], self._hash_root(request)
        for i in range(limit):
            parent = chain_hash(parent, request.known_tokens(i * page, (i + 1) * page))
            hashes.append(parent)
        page_hits = None
        for kind in self.kinds:
            hashes = hashes[: kind.match_prefix(request, hashes)]
            page_hits = len(hashes) if page_hits is None else page_hits
        for kind in self.kinds:
            kind.trim_prefix(request, len(hashes))
        request.page_hashes = hashes
        request.num_computed_tokens = len(hashes) * page
        return (page_hits or 0) * page

    def can_allocate(self, work: ScheduledRequest) -> bool:
        """Whether every kind has room for `work` now."""
        for kind in self.kinds:  # noqa: SIM110 (a loop, not all() over a generator: it runs per request per step)
            if not kind.can_allocate(work):
                return False
        return True

    def allocate(self, work: ScheduledRequest) -> ScheduledRequest:
        """Takes what `work` needs in every kind (call after `can_allocate`); returns it annotated."""
        for kind in self.kinds:
            work = kind.allocate(work)
        return work

    def apply(self, work: ScheduledRequest) -> None:
        """After the forward: the commit range's caches are final; full pages join the prefix cache."""
        request = work.request
        request.num_computed_tokens = max(request.num_computed_tokens, work.commit_end)
        num_registered = len(request.page_hashes)
        while len(request.page_hashes) < request.num_computed_tokens // self.page_size:
            i = len(request.page_hashes)
            parent = request.page_hashes[-1] if request.page_hashes else self._hash_root(request)
            tokens = request.known_tokens(i * self.page_size, (i + 1) * self.page_size)
            request.page_hashes.append(chain_hash(parent, tokens))
        for kind in self.kinds:
            kind.apply(work, request.page_hashes, num_registered)

    def rollback(self, request: Request, position: int) -> None:
        """A verified draft was rejected: the request's caches hold committed tokens up to `position` only (a
        block start); pages past it leave the prefix cache (the recurrent state is restored by the worker)."""
        num_pages = position // self.page_size
        request.num_computed_tokens = min(request.num_computed_tokens, position)
        request.page_hashes = request.page_hashes[:num_pages]
        for kind in self.kinds:
            kind.rollback(request, num_pages)

    def release(self, request: Request) -> None:
        """Everything the request holds goes back (finished, aborted, preempted or not admitted after all)."""
        for kind in self.kinds:
            kind.release(request)
        request.page_hashes = []
        request.num_computed_tokens = 0

    def check_invariants(self) -> None:
        for kind in self.kinds:
            kind.check_invariants()

    def _hash_root(self, request: Request) -> int | None:
        """The parent of the request's first page hash: the weights' version and the request's adapter (None for
        the base model's first weights), so that the prefix cache keeps adapters and weight versions apart."""
        if request.adapter is None and self.weights_version == 0:
            return None
        return hash((self.weights_version, request.adapter.hash_root if request.adapter is not None else None))
