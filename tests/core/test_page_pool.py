"""Page pool: allocation is all-or-nothing, references are counted, the prefix cache evicts LRU, and random
operation sequences keep the invariants."""

from __future__ import annotations

import random

import pytest

from diffuserve.core.cache.paged import OutOfPages, PagePool, chain_hash


def test_allocate_free_and_all_or_nothing():
    pool = PagePool(num_pages=4, page_size=8)
    pages = pool.allocate(3)
    assert len(set(pages)) == 3 and pool.num_free_pages == 1
    with pytest.raises(OutOfPages):
        pool.allocate(2)
    assert pool.num_free_pages == 1  # the failed call took nothing
    pool.free(pages)
    assert pool.num_free_pages == 4 and pool.usage == 0.0
    pool.check_invariants()


def test_prefix_pages_are_shared_then_cached_then_evicted_lru():
    pool = PagePool(num_pages=3, page_size=4)
    h1 = chain_hash(None, [1, 2, 3, 4])
    h2 = chain_hash(h1, [5, 6, 7, 8])
    first = pool.allocate(2)
    pool.register(first[0], h1)
    pool.register(first[1], h2)
    shared = pool.match_prefix([h1, h2, chain_hash(h2, [9, 9, 9, 9])])
    assert shared == first  # the third page was never registered
    pool.free(first)
    pool.free(shared)
    assert pool.num_free_pages == 3  # cached pages count as free
    assert pool.match_prefix([h1]) == [first[0]]  # still cached after its users left
    pool.free([first[0]])
    pool.allocate(2)  # one plain free page + evicts the least recently used cached page (h2's)
    assert pool.match_prefix([h1, h2]) == [first[0]]
    pool.check_invariants()


def test_disabled_prefix_cache_never_matches():
    pool = PagePool(num_pages=2, page_size=4, enable_prefix_caching=False)
    page = pool.allocate(1)[0]
    pool.register(page, 123)
    assert pool.match_prefix([123]) == []


def test_chain_hash_depends_on_the_whole_prefix():
    assert chain_hash(chain_hash(None, [1]), [2]) != chain_hash(chain_hash(None, [3]), [2])


@pytest.mark.parametrize("seed", range(5))
def test_random_operations_keep_invariants(seed):
    rng = random.Random(seed)
    pool = PagePool(num_pages=16, page_size=4)
    owners: list[list[int]] = []
    hashes: list[int] = []
    for _ in range(400):
        op = rng.random()
        if op < 0.35:
            n = rng.randint(1, 5)
            if pool.can_allocate(n):
                owners.append(pool.allocate(n))
        elif op < 0.6 and owners:
            pool.free(owners.pop(rng.randrange(len(owners))))
        elif op < 0.8 and owners:
            page = rng.choice(rng.choice(owners))
            h = rng.getrandbits(32)
            pool.register(page, h)
            hashes.append(h)
        elif hashes:
            matched = pool.match_prefix(rng.sample(hashes, min(3, len(hashes))))
            if matched:
                owners.append(matched)
        pool.check_invariants()
    for pages in owners:
        pool.free(pages)
    pool.check_invariants()
    assert pool.num_free_pages == pool.num_pages
