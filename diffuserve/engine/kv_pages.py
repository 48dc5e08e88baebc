"""The KV-cache page pool: page ids, reference counts, and the prefix cache. Torch-free.

A page holds `page_size` consecutive positions of one sequence. Pages whose positions are all committed can be
registered under a hash chained with their parent page's hash, so a later request with the same token prefix
reuses them (ref-counted, read-only). When its last user lets go, a registered page stays cached ("evictable")
until the free list runs dry; then the least recently used one is evicted.

Invariant: every page is in exactly one of {free, evictable, used}; used pages have ref_count >= 1, free and
evictable pages 0; the hash index maps only to registered pages.

NOTE: a page's K/V depend on every token of the diffusion blocks it holds, so a page must hold whole blocks
(page_size % block_length == 0) for its content hash to identify its K/V.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence


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
