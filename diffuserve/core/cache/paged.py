"""The paged cache kinds: PagedKV (a full-attention layer group's K/V, every position kept) and SlidingWindowKV
(only the positions a future query can still see). Torch-free.

A request holds, per page group, a page table (`Request.pages[group]`: page i holds positions
[i * page_size, (i + 1) * page_size)) and, for the step that scores its prompt, scratch pages for the scoring
variants' K/V (`Request.score_pages[group]`), returned after the step. A window group frees the pages that fall
wholly out of the window behind the request's next queries; their entries become FREED (-1), so the table stays
indexed by position:

    positions   0 ........ P .............. next query
    window      [ FREED  FREED | kept pages ............ ]
                               ^ next query - window, rounded down to a page

Committed full pages are registered under their chain hash (in every group), so a prefix shared with a later
request is reused; a window group reuses a prefix only if it still holds the window behind it.

A page table changes in three ways only, which the worker's kept copy of it relies on (worker/cache/page_table.py):
pages appended in place (allocation), leading entries set FREED in place (a window), or a new list assigned
(a prefix match, a trim, a release). FREED entries are always a leading run.

The page pool (`PagePool`) holds page ids and reference counts. When its last user lets go, a registered page
stays cached ("evictable") until the free list runs dry; then the least recently used one is evicted. Invariant:
every page is in exactly one of {free, evictable, used}; used pages have ref_count >= 1, free and evictable pages
0; the hash index maps only to registered pages.

NOTE: a page's K/V depend on every token of the diffusion blocks it holds, so a page must hold whole blocks
(page_size % block_length == 0) for its content hash to identify its K/V.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict, deque
from collections.abc import Sequence

from diffuserve.core.cache.kind import CacheKind
from diffuserve.core.request import Request
from diffuserve.core.step import ScheduledRequest

FREED = -1
"""A page-table entry whose page fell out of the window and went back to the pool."""


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def first_kept_page(pages: list[int]) -> int:
    """The index of the table's first page not FREED (its length when every one is): a binary search, as the
    FREED entries are a leading run, so a step's work does not grow with a long context's freed pages."""
    return bisect.bisect_left(pages, True, key=lambda page: page != FREED)


class OutOfPages(RuntimeError):
    """`allocate` asked for more pages than are free or evictable."""


def chain_hash(parent: int | None, tokens: Sequence[int]) -> int:
    """Identity of a full page: its tokens and, through the parent's hash, every token before them."""
    return hash((parent, tuple(tokens)))


class PagePool:
    def __init__(self, num_pages: int, page_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_pages, self.page_size = num_pages, page_size
        self.enable_prefix_caching = enable_prefix_caching
        self._free: deque[int] = deque(range(num_pages))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # LRU order: oldest first
        self._ref_count = [0] * num_pages
        self._hash_of: dict[int, int] = {}  # page -> hash, registered pages only
        self._page_of: dict[int, int] = {}  # hash -> page

    # ---- queries -------------------------------------------------------------------------------------------
    @property
    def num_free_pages(self) -> int:
        """Pages `allocate` can hand out (free + evictable)."""
        return len(self._free) + len(self._evictable)

    @property
    def usage(self) -> float:
        """Fraction of pages referenced by requests."""
        return 1.0 - self.num_free_pages / self.num_pages

    def can_allocate(self, num_pages: int) -> bool:
        return num_pages <= self.num_free_pages

    def is_cached(self, page_hash: int) -> bool:
        """Whether a page is registered under `page_hash` (prefix caching on)."""
        return self.enable_prefix_caching and page_hash in self._page_of

    # ---- mutations -----------------------------------------------------------------------------------------
    def allocate(self, num_pages: int) -> list[int]:
        """Takes `num_pages` pages (ref 1), evicting LRU cached pages if needed. All or nothing: raises
        OutOfPages without side effects when there are not enough."""
        if not self.can_allocate(num_pages):
            raise OutOfPages(f"need {num_pages} KV pages, {self.num_free_pages} free")
        pages = []
        for _ in range(num_pages):
            page = self._free.popleft() if self._free else self._evict_lru()
            self._ref_count[page] = 1
            pages.append(page)
        return pages

    def free(self, page_ids: Sequence[int]) -> None:
        """Drops one reference to each page. A page at 0 refs becomes evictable if registered, else free."""
        for page in page_ids:
            assert self._ref_count[page] > 0, f"page {page} freed twice"
            self._ref_count[page] -= 1
            if self._ref_count[page] == 0:
                if page in self._hash_of:
                    self._evictable[page] = None
                else:
                    self._free.append(page)

    def match_prefix(self, hashes: Sequence[int]) -> list[int]:
        """Takes a reference to the longest run of cached pages matching `hashes` (in order) and returns them."""
        if not self.enable_prefix_caching:
            return []
        pages = []
        for h in hashes:
            page = self._page_of.get(h)
            if page is None:
                break
            if self._ref_count[page] == 0:
                del self._evictable[page]
            self._ref_count[page] += 1
            pages.append(page)
        return pages

    def unregister(self, page: int) -> None:
        """Takes a used page out of the prefix cache (its K/V are about to be overwritten); no-op if not in it."""
        page_hash = self._hash_of.pop(page, None)
        if page_hash is not None:
            del self._page_of[page_hash]

    def register(self, page: int, page_hash: int) -> None:
        """Marks a used, full, committed page as reusable under `page_hash` (first page wins a duplicate)."""
        assert self._ref_count[page] > 0, f"registering unused page {page}"
        if not self.enable_prefix_caching or page_hash in self._page_of or page in self._hash_of:
            return
        self._hash_of[page] = page_hash
        self._page_of[page_hash] = page

    def check_invariants(self) -> None:
        free, evictable = set(self._free), set(self._evictable)
        assert len(free) == len(self._free), "duplicate page in the free list"
        assert not free & evictable, "a page is both free and evictable"
        for page in range(self.num_pages):
            refs = self._ref_count[page]
            assert refs >= 0, f"page {page} has {refs} refs"
            assert (refs == 0) == (page in free or page in evictable), f"page {page}: refs {refs} vs lists"
            assert page not in evictable or page in self._hash_of, f"evictable page {page} is not registered"
        assert all(self._hash_of[p] == h for h, p in self._page_of.items()), "hash index out of sync"

    def _evict_lru(self) -> int:
        page, _ = self._evictable.popitem(last=False)
        del self._page_of[self._hash_of.pop(page)]
        return page


class PagedKind(CacheKind):
    def __init__(self, group: str, pool: PagePool, window: int | None = None, max_span: int = 0) -> None:
        self.name, self.pool, self.window = group, pool, window
        self.max_span = max_span
        """A window group's widest step of one request (the token budget): its pages are live at once."""

    @property
    def page_size(self) -> int:
        return self.pool.page_size

    def pages_for_life(self, request: Request) -> int:
        """The most pages the request ever holds at once (its scoring scratch included)."""
        scratch = 1 if request.num_unscored else 0
        pages = ceil_div(request.total_tokens_needed(), self.page_size)
        if self.window is not None:
            pages = min(pages, ceil_div(self.window + self.max_span, self.page_size) + 1)
        return pages + scratch

    def start_step(self) -> None:
        """Nothing to return: pages are taken and given back by applied steps only."""

    def prefix_limit(self, request: Request) -> int:
        return request.settled_end

    def check_fits(self, request: Request) -> tuple[bool, str]:
        needed = self.pages_for_life(request)
        what = "KV pages" if self.window is None else f"sliding-window ({self.window}) KV pages"
        return needed <= self.pool.num_pages, f"{needed} {what} of {self.page_size} tokens"

    # ---- prefix --------------------------------------------------------------------------------------------
    def match_prefix(self, request: Request, page_hashes: list[int]) -> int:
        if self.window is None:
            request.pages[self.name] = self.pool.match_prefix(page_hashes)
            return len(request.pages[self.name])
        for count in range(len(page_hashes), 0, -1):
            first = self._first_needed(count * self.page_size)
            if all(self.pool.is_cached(h) for h in page_hashes[first:count]):
                request.pages[self.name] = [FREED] * first + self.pool.match_prefix(page_hashes[first:count])
                return count
        request.pages[self.name] = []
        return 0

    def trim_prefix(self, request: Request, num_pages: int) -> None:
        pages = request.pages.get(self.name, [])
        self.pool.free([p for p in pages[num_pages:] if p != FREED])
        request.pages[self.name] = pages[:num_pages]

    # ---- allocation ----------------------------------------------------------------------------------------
    def can_allocate(self, work: ScheduledRequest) -> bool:
        return self.pool.can_allocate(sum(self._pages_needed(work)))

    def allocate(self, work: ScheduledRequest) -> ScheduledRequest:
        """The pages up to the work's last query, plus scratch pages for its scoring variants."""
        request = work.request
        table = request.pages.setdefault(self.name, [])
        num_own, num_scratch = self._pages_needed(work)
        if num_own or num_scratch:  # most steps of a running request need no page: nothing to take or copy
            pages = self.pool.allocate(num_own + num_scratch)
            table += pages[:num_own]  # in place: O(new pages), not a copy of the table
            request.score_pages[self.name] = pages[num_own:]
        return work

    def apply(self, work: ScheduledRequest, page_hashes: list[int], num_registered: int) -> None:
        """Registers the newly committed full pages, returns the scratch pages and (window) the pages no later
        query can see."""
        request = work.request
        pages = request.pages[self.name]
        for i in range(num_registered, len(page_hashes)):
            if pages[i] != FREED:
                self.pool.register(pages[i], page_hashes[i])
        scratch = request.score_pages.pop(self.name, None)
        if scratch:  # most steps score nothing
            self.pool.free(scratch)
        if self.window is not None:
            self._free_behind_window(request)

    def rollback(self, request: Request, num_pages: int) -> None:
        for page in request.pages.get(self.name, [])[num_pages:]:
            if page != FREED:
                self.pool.unregister(page)

    def release(self, request: Request) -> None:
        pages = request.pages.pop(self.name, []) + request.score_pages.pop(self.name, [])
        self.pool.free([p for p in pages if p != FREED])

    def check_invariants(self) -> None:
        self.pool.check_invariants()

    # ---- helpers -------------------------------------------------------------------------------------------
    def _pages_needed(self, work: ScheduledRequest) -> tuple[int, int]:
        """(pages the request's own queries still need, scratch pages of its scoring variants)."""
        size = self.pool.page_size  # read once: this runs twice per request per step
        held = len(work.request.pages.get(self.name, ()))
        own = max(ceil_div(work.query_end, size) - held, 0)
        return own, (ceil_div(work.num_score_tokens, size) if work.score_end > work.score_start else 0)

    def _first_needed(self, position: int) -> int:
        """The first page a query at `position` or later can still see (window groups)."""
        assert self.window is not None, "only a window group frees pages"
        return max(0, position - self.window) // self.page_size

    def _free_behind_window(self, request: Request) -> None:
        """Frees the pages wholly before the window of the request's next queries: its next commit (or block)
        and, while it scores its prompt, the block of its next scored position."""
        next_query = request.num_computed_tokens
        if request.num_unscored:
            next_query = min(next_query, request.score_cursor // request.block_length * request.block_length)
        pages = request.pages[self.name]
        for i in range(first_kept_page(pages), min(self._first_needed(next_query), len(pages))):
            self.pool.free([pages[i]])
            pages[i] = FREED
