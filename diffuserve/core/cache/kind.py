"""CacheKind: the interface every cache kind implements for the cache manager (core/cache/manager.py, which
describes the calls). Torch-free. Every method is abstract: a kind says what each point of a request's life means
for it, even when that is nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from diffuserve.core.request import Request
from diffuserve.core.step import ScheduledRequest


class CacheKind(ABC):
    name: str

    @abstractmethod
    def start_step(self) -> None:
        """A new step: anything reserved by a step that never applied is returned."""

    @abstractmethod
    def check_fits(self, request: Request) -> tuple[bool, str]:
        """(whether the request's whole life fits this kind's capacity, what it needs, in words)."""

    @abstractmethod
    def prefix_limit(self, request: Request) -> int:
        """Positions before the request's block a prefix hit may cover."""

    def commit_limit(self, request: Request, target: int) -> int:
        """The position this step's commits may reach, `target` (the request's commit target) unless this kind
        holds them back."""
        return target

    @abstractmethod
    def match_prefix(self, request: Request, page_hashes: list[int]) -> int:
        """Of the prefix pages named by `page_hashes` (chain hashes, in order), how many leading ones this kind
        can restore; it takes what it needs for them (references, a snapshot to copy)."""

    @abstractmethod
    def trim_prefix(self, request: Request, num_pages: int) -> None:
        """Keeps only the first `num_pages` of what `match_prefix` took (the manager's agreed prefix)."""

    @abstractmethod
    def can_allocate(self, work: ScheduledRequest) -> bool:
        """Whether `allocate(work)` would succeed now."""

    @abstractmethod
    def allocate(self, work: ScheduledRequest) -> ScheduledRequest:
        """Takes the memory `work` needs (mutates the request's holdings); returns the work, annotated."""

    @abstractmethod
    def apply(self, work: ScheduledRequest, page_hashes: list[int], num_registered: int) -> None:
        """After the step's forward: the request's committed full pages are `page_hashes` (the first
        `num_registered` of them were already registered before this step)."""

    @abstractmethod
    def rollback(self, request: Request, num_pages: int) -> None:
        """A verified draft was rejected: the request's pages from `num_pages` on no longer hold committed
        tokens (they will be written again), so none of them may stay in a prefix cache."""

    @abstractmethod
    def release(self, request: Request) -> None:
        """Returns everything the request holds in this kind."""

    @abstractmethod
    def check_invariants(self) -> None:
        """Asserts the kind's bookkeeping is consistent (tests)."""
