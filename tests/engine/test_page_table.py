"""The page tables kept across steps (worker/cache/page_table.py): a row written only with what changed mirrors its
request's page list through every change the page-table contract allows (pages appended in place, a leading run
set FREED in place, a new list, a release and a reuse of the id), with the table growing in rows and width; and in
the engine, every scheduled request's rows mirror its page lists at every step of the long mixed workload
(preemption, prefix hits, verified decoding's rollbacks)."""

from __future__ import annotations

import random

import torch

from diffuserve.core.cache.paged import FREED, first_kept_page
from diffuserve.worker.cache.page_table import PageTableRows
from tests.engine.mixed_workload import mixed_requests, run_mixed, tight_llm, write_mixed_checkpoint


def _change(rng: random.Random, pages: list[int]) -> list[int]:
    """One change the contract allows -> the list the request holds after it (the same object, or a new one)."""
    what = rng.choice(["append", "append", "free", "new"])
    if what == "append":
        pages += rng.sample(range(1000), rng.randrange(1, 4))
    elif what == "free":  # a window: a leading run goes FREED
        kept, count = first_kept_page(pages), rng.randrange(0, 3)
        pages[kept : kept + count] = [FREED] * len(pages[kept : kept + count])
    else:
        pages = [FREED] * rng.randrange(0, 2) + rng.sample(range(1000), rng.randrange(0, 6))
    return pages


def test_rows_mirror_page_lists_through_every_allowed_change():
    rng = random.Random(0)
    tables = PageTableRows(torch.device("cpu"), rows=1, width=1)  # grows in both
    lists: dict[str, list[int]] = {}
    laid_out: set[str] = set()  # requests laid out since their list was last replaced
    for _ in range(400):
        request_id = f"r{rng.randrange(12)}"
        if request_id in lists and rng.random() < 0.1:
            tables.release(request_id)
            del lists[request_id]
            laid_out.discard(request_id)
            continue
        before = lists.get(request_id)
        lists[request_id] = _change(rng, lists.get(request_id, []))
        if lists[request_id] is not before:
            laid_out.discard(request_id)
        for rid in rng.sample(sorted(lists), k=min(3, len(lists))):  # the requests a step lays out
            tables.row(rid, lists[rid], len(lists[rid]))
            laid_out.add(rid)
        for rid in laid_out:  # in-place changes since keep a row mirroring what it holds
            assert tables.mirrors(rid, lists[rid]), rid
    rows = [entry.index for entry in tables._rows.values()]
    assert len(set(rows)) == len(rows), "two requests share a row"
    assert tables.table.shape[0] > 1 and tables.table.shape[1] > 1


def test_a_row_is_written_only_with_what_changed():
    tables = PageTableRows(torch.device("cpu"))
    pages = [3, 4]
    row = tables.row("a", pages, 2)
    assert tables._pending == ([row, row], [0, 1], [3, 4])
    tables.flush()
    assert tables.row("a", pages, 2) == row and tables._pending == ([], [], [])
    pages.append(9)
    tables.row("a", pages, 3)
    assert tables._pending == ([row], [2], [9])


def test_every_scheduled_rows_mirror_their_pages_through_the_mixed_workload(tmp_path):
    llm = tight_llm(write_mixed_checkpoint(tmp_path))
    runner = llm.engine.runner
    build = runner.build_batch
    checked = []

    def build_and_check(scheduled):
        batch = build(scheduled)
        for work in scheduled:
            if work.num_tokens:
                for group, tables in runner.page_tables.items():
                    assert tables.mirrors(work.request.request_id, work.request.pages[group]), work.request
                checked.append(work.request.request_id)
        return batch

    runner.build_batch = build_and_check
    outputs = run_mixed(llm.engine, mixed_requests())
    assert len(outputs) == len(mixed_requests()) and len(set(checked)) == len(outputs)
    assert llm.engine.scheduler.num_preemptions > 0, "the workload preempts: re-admitted requests get new lists"
