"""The paged cache kinds' torch side (PagedKV, SlidingWindowKV): a page group's K/V tensors, the per-step metadata
built on rank 0 from the scheduler's work (plain tensors, so they travel to the other ranks: where each query
token's K/V go and which cache slots each sequence's queries read under which mask), and what a forward does with
them. Which page belongs to whom is paged.py's business.

    k_caches[i], v_caches[i]   per layer of the group [num_pages * page_size, Hkv / rank, D]
                               slot = page * page_size + offset

Which keys a query sees follows the model's `StepRules` (model/interface.py):

    block-causal (SDAR, LLaDA2)   q sees k  iff  q // B >= k // B
    causal commits (Clover)       a commit row sees the positions up to itself (the recurrent prefix is causal);
                                  a block row sees the commits and its whole block (preview) or is causal too
                                  (an autoregressive checkpoint)
    sliding window (a group)      and q - k < window, q the row's own position; with
                                  StepRules.block_window_from_start a block's rows share the window behind the
                                  block's first position (DiffusionGemma's canvas rows see the W - 1 before it)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from diffuserve.core.cache.paged import first_kept_page
from diffuserve.core.step import ScheduledRequest
from diffuserve.model.interface import StepRules
from diffuserve.model.layers.attention import PagedAttentionInputs, SequenceSlice, block_causal_mask
from diffuserve.model.shapes import PagedKV
from diffuserve.worker.cache.page_table import PageTableRows

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}
"""The torch dtype of each cache dtype name (model/shapes.py)."""


@dataclass(frozen=True)
class PagedStepMetadata:
    """One page group's part of a step: slot_mapping [N] (where each query token's K/V are written) and, per
    sequence, its queries and the slots of its keys."""

    slot_mapping: torch.Tensor
    sequences: tuple[SequenceSlice, ...]

    def to(self, device: torch.device | str) -> PagedStepMetadata:
        """On `device`: each distinct key tensor copied once (the own sequences share one), whole, so that the
        step broadcast to the other ranks pickles every key slot once."""
        moved: dict[int, torch.Tensor] = {}

        def keys(s: SequenceSlice) -> torch.Tensor:
            if id(s.keys) not in moved:
                moved[id(s.keys)] = s.keys.to(device, copy=True)
            return moved[id(s.keys)]

        sequences = tuple(
            dataclasses.replace(s, keys=keys(s), mask=None if s.mask is None else s.mask.to(device))
            for s in self.sequences
        )
        return PagedStepMetadata(self.slot_mapping.to(device), sequences)


@dataclass(slots=True)  # one per request per step: not frozen, whose __init__ is three times slower
class _OwnSequence:
    """A request's own queries, laid out in `build`: its page table is row `row` of the group's `PageTableRows`;
    its keys are positions [first_page * page_size, key_end) of that table (a window group's start at its first
    kept page)."""

    first_row: int
    num_tokens: int
    row: int
    first_page: int
    key_end: int
    query_start: int
    mask: torch.Tensor | None


class PagedMetadataBuilder:
    """Key slots, slot mapping and masks of one page group (its page tables are `Request.pages[group]`).

    `add` only records Python ints (and queues the pages a request's table gained since its row was last written,
    worker/cache/page_table.py); `build` gathers every added request's pages from the kept page tables and
    expands them to key slots in a few tensor ops for the whole step (one gather of pages, one expansion, one
    gather of the slot mapping), never copying a whole page table out of Python: the step's Python work does not
    grow with the requests' context. The step's own sequences share that expansion as their key tensor, each
    reading its run of whole pages (its last page's slots past its last query are unused). Masks are shared by
    the sequences of a step with the same query and key ranges (a batch of equal blocks builds one)."""

    def __init__(
        self,
        group: str,
        page_size: int,
        block_length: int,
        rules: StepRules,
        device: torch.device,
        tables: PageTableRows | None = None,
    ):
        """`tables`: the group's page tables kept across steps (the runner's); a fresh one when not given."""
        self.group, self.page_size, self.block_length = group, page_size, block_length
        self.rules, self.device = rules, device
        self.tables = tables if tables is not None else PageTableRows(device)
        self._order: list[_OwnSequence | tuple[torch.Tensor, SequenceSlice]] = []
        """Every sequence in row order: a request's own (laid out in `build`) or one given by `add_sequence`."""
        self._masks: dict[tuple[int, ...], torch.Tensor | None] = {}

    def add(self, work: ScheduledRequest, first_row: int) -> None:
        """The request's own queries (commits and block), starting at batch row `first_row`."""
        query_end = work.query_end  # read once: this runs for every request every step
        mask = self._mask(work.commit_start, query_end, work.commit_end - work.commit_start)
        self._add_own(work, first_row, work.request.pages[self.group], 0, mask, query_end)

    def add_sequence(self, slot_mapping: torch.Tensor, sequence: SequenceSlice) -> None:
        """Queries laid out by someone else (prompt scoring's variants)."""
        self._order.append((slot_mapping, sequence))

    def key_slots(self, page_ids: list[int], end: int) -> torch.Tensor:
        """[end] long: cache slot of positions 0..end-1 (page * page_size + offset)."""
        pages = torch.tensor(page_ids, dtype=torch.long, device=self.device)
        offsets = torch.arange(self.page_size, device=self.device)
        return (pages[:, None] * self.page_size + offsets).flatten()[:end]

    def build(self) -> PagedStepMetadata:
        own = [s for s in self._order if isinstance(s, _OwnSequence)]
        own_keys, key_starts, own_mapping = self._lay_out(own)
        pieces: list[torch.Tensor] = []
        sequences: list[SequenceSlice] = []
        laid = flushed = 0  # own query tokens seen so far, and those in pieces already
        starts = iter(key_starts)
        for entry in self._order:
            if isinstance(entry, _OwnSequence):
                num_keys = entry.key_end - entry.first_page * self.page_size
                sequences.append(
                    SequenceSlice(entry.first_row, entry.num_tokens, own_keys, next(starts), num_keys, entry.mask)
                )
                laid += entry.num_tokens
                continue
            pieces += [own_mapping[flushed:laid], entry[0]]
            sequences.append(entry[1])
            flushed = laid
        pieces.append(own_mapping[flushed:])
        return PagedStepMetadata(torch.cat(pieces), tuple(sequences))

    def _add_own(
        self,
        work: ScheduledRequest,
        first_row: int,
        pages: list[int],
        first_page: int,
        mask: torch.Tensor | None,
        key_end: int,
    ) -> None:
        """Records a request's own sequence: keys [first_page * page_size, key_end) of its page table `pages`
        (`key_end`: the work's query end)."""
        num_pages = -(-key_end // self.page_size)
        assert len(pages) >= num_pages, f"{self.group}: {len(pages)} pages hold fewer than {key_end} positions"
        row = self.tables.row(work.request.request_id, pages, num_pages)
        self._order.append(
            _OwnSequence(first_row, key_end - work.commit_start, row, first_page, key_end, work.commit_start, mask)
        )

    def _lay_out(self, own: list[_OwnSequence]) -> tuple[torch.Tensor, list[int], torch.Tensor]:
        """The own sequences' key slots [K] (each one's pages expanded, one after another), where each sequence's
        run starts in them, and their slot mapping [N].

        pages [P] = each sequence's pages [first_page, its last query's page] gathered from its table row, one
        run after another; slots [P * page_size] = those pages expanded. Sequence s's position p is
        slots[its run's start + p - first_page * page_size]: its queries [query_start, key_end) are gathered from
        there for the whole step at once."""
        if not own:
            empty = torch.zeros(0, dtype=torch.long, device=self.device)
            return empty, [], empty
        size = self.page_size
        counts = [-(-s.key_end // size) - s.first_page for s in own]
        columns, page_counts = self._runs([s.first_page for s in own], counts)
        rows = torch.tensor([s.row for s in own], dtype=torch.long, device=self.device)
        pages = self.tables.flush()[rows.repeat_interleave(page_counts, output_size=columns.numel()), columns]
        slots = (pages[:, None] * size + torch.arange(size, device=self.device)).flatten()  # [P * page_size]
        key_starts, start = [], 0
        for count in counts:
            key_starts.append(start)
            start += count * size
        query_starts = [k + s.query_start - s.first_page * size for k, s in zip(key_starts, own)]
        queries, _ = self._runs(query_starts, [s.num_tokens for s in own])
        return slots, key_starts, slots.index_select(0, queries)

    def _runs(self, starts: list[int], lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """[starts[i], starts[i] + lengths[i]) for every i, concatenated, in one arange (the j-th element of run i
        is (starts[i] - the lengths before run i) + its place in the whole), with the lengths as a tensor."""
        counts = torch.tensor(lengths, dtype=torch.long, device=self.device)
        offsets = torch.tensor(starts, dtype=torch.long, device=self.device) - (counts.cumsum(0) - counts)
        total = sum(lengths)  # given as output_size: no device sync on CUDA
        return torch.arange(total, device=self.device) + offsets.repeat_interleave(counts, output_size=total), counts

    def _mask(self, query_start: int, query_end: int, num_commit: int) -> torch.Tensor | None:
        """[Lq, L] bool, or None when every query sees every key (shared by equal ranges within the step)."""
        key = (query_start, query_end, num_commit)
        if key not in self._masks:
            self._masks[key] = self._new_mask(*key)
        return self._masks[key]

    def _new_mask(self, query_start: int, query_end: int, num_commit: int) -> torch.Tensor | None:
        if query_end - query_start == 1:  # one query, the last key's position: every rule lets it see every key
            return None
        if not self.rules.causal_commits:
            if query_end - query_start <= self.block_length:
                return None
            queries = torch.arange(query_start, query_end, device=self.device)
            return block_causal_mask(queries, query_end, self.block_length)
        if not self.rules.autoregressive and num_commit == 0:
            return None
        queries = torch.arange(query_start, query_end, device=self.device)
        mask = torch.arange(query_end, device=self.device)[None, :] <= queries[:, None]
        if not self.rules.autoregressive:
            mask[num_commit:] = True
        return mask


class WindowMetadataBuilder(PagedMetadataBuilder):
    """A sliding-window group: keys only from the request's kept pages, and the window on top of the rule (from
    each row's own position; block rows from the block's first with StepRules.block_window_from_start)."""

    def __init__(
        self,
        group: str,
        window: int,
        page_size: int,
        block_length: int,
        rules: StepRules,
        device: torch.device,
        tables: PageTableRows | None = None,
    ) -> None:
        super().__init__(group, page_size, block_length, rules, device, tables)
        self.window = window
        self._windows: dict[tuple[int, ...], torch.Tensor] = {}

    def add(self, work: ScheduledRequest, first_row: int) -> None:
        pages = work.request.pages[self.group]
        first_page = first_kept_page(pages)
        first = first_page * self.page_size
        block_start = work.request.block_start if self.rules.block_window_from_start else first - 1
        # The mask over keys [first, query_end) depends only on positions relative to `first` (the window, and the
        # rule when it is causal or `first` keeps the block alignment): requests at different positions share it.
        shift = first if self.rules.causal_commits or first % self.block_length == 0 else 0
        num_commit = work.commit_end - work.commit_start
        key = (first - shift, work.query_start - shift, work.query_end - shift, num_commit, block_start - shift)
        if key not in self._windows:
            self._windows[key] = self._window_mask(*key)
        self._add_own(work, first_row, pages, first_page, self._windows[key], work.query_end)  # no FREED page is read

    def _window_mask(self, first: int, query_start: int, query_end: int, num_commit: int, block_start: int):
        """[Lq, query_end - first] bool: the window, and the rule, over the kept keys (block rows anchored at
        `block_start` when it is at or after `first`)."""
        anchors = torch.arange(query_start, query_end, device=self.device)
        if block_start >= first:  # block rows: the window behind the block's first position
            anchors[num_commit:] = block_start
        keys = torch.arange(first, query_end, device=self.device)[None, :]
        visible = anchors[:, None] - keys < self.window
        rule = self._new_mask(query_start, query_end, num_commit)
        return visible if rule is None else visible & rule[:, first:]


@dataclass
class PagedTensors:
    """One page group's K and V, a tensor per layer of the group."""

    specs: list[PagedKV]
    page_size: int
    k_caches: list[torch.Tensor]
    v_caches: list[torch.Tensor]

    @classmethod
    def allocate(cls, specs: list[PagedKV], page_size: int, num_pages: int, tp: int, device: torch.device):
        def tensors() -> list[torch.Tensor]:
            return [
                torch.zeros(
                    num_pages * page_size,
                    -(-s.num_kv_heads // tp),
                    s.head_dim,
                    dtype=TORCH_DTYPES[s.dtype],
                    device=device,
                )
                for s in specs
            ]

        return cls(specs, page_size, tensors(), tensors())

    @property
    def num_pages(self) -> int:
        return self.k_caches[0].shape[0] // self.page_size

    @property
    def num_bytes(self) -> int:
        """Measured: bytes of the group's K and V tensors."""
        return sum(t.numel() * t.element_size() for t in self.k_caches + self.v_caches)

    def bind(self, meta: PagedStepMetadata) -> PagedAttentionInputs:
        return PagedAttentionInputs(meta.slot_mapping, meta.sequences, self.k_caches, self.v_caches)
