"""A page group's page tables kept on the step's device across steps (rank 0): each request the runner has laid
out holds a row of one preallocated table, written with what changed since the step that last read it, so a
step's key slots are gathered from the table without copying any request's whole page table out of Python.

    table  [rows, width] long   table[row, i] = the page holding positions [i * page_size, (i + 1) * page_size)

What changed is found from the request's page list itself (`Request.pages[group]`, core/cache/paged.py), whose
owner keeps one contract: a list only grows in place (pages appended), or has entries that no later query reads
set to FREED in place (a sliding window's pages behind it); any other change assigns a new list (a prefix match, a
trim, a re-admission after preemption). A row therefore remembers the list it mirrors and how much of it it holds:
the same list, longer -> its new tail is written; another list -> the whole row is. A stale entry left under a
FREED one is never read: a window group's keys start at its first kept page.

Knows nothing of masks, steps or requests beyond their ids and page lists. Writes are gathered and applied in one
indexed write per step (`flush`), before the step's gathers read the table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffuserve.core.cache.paged import FREED


@dataclass(slots=True)
class _Row:
    """One request's row of the table and what it mirrors."""

    index: int
    pages: list[int]
    """The page list the row mirrors (the request's own object, compared by identity)."""
    held: int
    """How many of its first entries the row holds (written, or queued for the next flush)."""


class PageTableRows:
    """The rows of one page group's page tables (see the module docstring); grows in rows and width as needed."""

    def __init__(self, device: torch.device, rows: int = 8, width: int = 16) -> None:
        self.device = device
        self.table = torch.zeros(rows, width, dtype=torch.long, device=device)
        self._rows: dict[str, _Row] = {}
        self._free = list(range(rows - 1, -1, -1))
        self._pending: tuple[list[int], list[int], list[int]] = ([], [], [])
        """(row, column, page) of every entry to write at the next flush."""

    def row(self, request_id: str, pages: list[int], needed: int) -> int:
        """The row mirroring `pages` (at least its first `needed` entries), its changes queued for the flush."""
        entry = self._rows.get(request_id)
        if entry is None:
            entry = self._rows[request_id] = _Row(self._take_row(), pages, 0)
        elif entry.pages is not pages:  # a new list: the whole row is rewritten
            entry.pages, entry.held = pages, 0
        if entry.held < needed:  # most steps of a running request add no page: nothing to write
            self._queue(entry.index, entry.held, pages[entry.held : needed])
            entry.held = needed
        return entry.index

    def release(self, request_id: str) -> None:
        """The request is gone: its row is free for another."""
        entry = self._rows.pop(request_id, None)
        if entry is not None:
            self._free.append(entry.index)

    def flush(self) -> torch.Tensor:
        """Writes the queued entries (one indexed write) and returns the table."""
        rows, columns, pages = self._pending
        if rows:
            if max(columns) >= self.table.shape[1]:
                self._grow(width=max(max(columns) + 1, 2 * self.table.shape[1]))
            index = torch.tensor([rows, columns], dtype=torch.long, device=self.device)  # [2, W]
            self.table[index[0], index[1]] = torch.tensor(pages, dtype=torch.long, device=self.device)
            self._pending = ([], [], [])
        return self.table

    def mirrors(self, request_id: str, pages: list[int]) -> bool:
        """Whether the request's row holds every entry of `pages` but FREED ones (a check for tests)."""
        entry = self._rows.get(request_id)
        if entry is None or entry.pages is not pages:
            return False
        held = self.flush()[entry.index, : entry.held].tolist()
        return all(page in (FREED, kept) for page, kept in zip(pages[: entry.held], held, strict=True))

    def _queue(self, row: int, start: int, pages: list[int]) -> None:
        rows, columns, values = self._pending
        rows += [row] * len(pages)
        columns += range(start, start + len(pages))
        values += pages

    def _take_row(self) -> int:
        if not self._free:
            size = self.table.shape[0]
            self._grow(rows=2 * size)
            self._free = list(range(2 * size - 1, size - 1, -1))
        return self._free.pop()

    def _grow(self, rows: int | None = None, width: int | None = None) -> None:
        """A larger table holding the old one in its top-left corner."""
        old = self.table
        self.table = torch.zeros(rows or old.shape[0], width or old.shape[1], dtype=torch.long, device=self.device)
        self.table[: old.shape[0], : old.shape[1]] = old
