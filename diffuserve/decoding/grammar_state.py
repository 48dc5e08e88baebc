"""One request's grammar matcher, kept in step with the request's decided generated tokens.

The state has been fed a sequence of generated tokens (`fed`); `sync` rolls it back to the longest common
prefix with the request's decided tokens and feeds the rest, so it follows commits, preemption and
speculative walks alike. Tokens before the `start_after` marker (reasoning) are fed but not matched: the
grammar starts after the marker's last token. Once a complete grammar is followed by a stop id (or, with
ignore_eos, by the model's EOS) it is over, and later tokens are not matched. Knows nothing of tensors or blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import numpy as np


class GrammarState:
    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        vocab_size: int,
        trigger: list[int] | None,
        stop_ids: frozenset[int],
        grammar_end_ids: Sequence[int] = (),
    ) -> None:
        """`stop_ids`: the request's (they end a complete grammar); `grammar_end_ids`: the ids the compiled
        grammar itself allows at its end (the model's EOS), allowed only when they are stop ids too (not with
        ignore_eos)."""
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.trigger = trigger
        self.stop_ids = stop_ids
        self._end_ids = sorted(set(grammar_end_ids))
        self._ends = stop_ids | set(grammar_end_ids)
        self._stop_list = sorted(stop_ids)
        self.fed: list[int] = []
        self._matched: list[bool] = []
        """Per fed token: whether the matcher consumed it (rollback counts those only)."""
        self.start: int | None = 0 if not trigger else None
        """Index in `fed` of the grammar's first token; None until the marker has been fed."""
        self.ended = False

    def sync(self, target: list[int]) -> None:
        """Makes `fed` equal to `target` (rolling back what differs, then feeding the rest)."""
        common = 0
        limit = min(len(self.fed), len(target))
        if self.fed[:limit] == target[:limit]:
            common = limit
        else:
            while self.fed[common] == target[common]:
                common += 1
        self.truncate(common)
        for token in target[common:]:
            self.push(token)

    def push(self, token: int) -> None:
        """Feeds one token (it must be allowed: `allowed()` was applied to its logits)."""
        self.fed.append(token)
        if self.start is None:
            if self.trigger and self.fed[-len(self.trigger) :] == self.trigger:
                self.start = len(self.fed)
            self._matched.append(False)
            return
        # A stop id ends a complete grammar: it is never given to the matcher (a stopped matcher does not keep
        # it in its history, so rolling it back would fail).
        if self.ended or (token in self._ends and self.matcher.is_accepting()):
            self._matched.append(False)
            self.ended = True
            return
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"grammar matcher refused token {token}: {self.matcher.get_error()}")
        self._matched.append(True)

    def truncate(self, length: int) -> None:
        """Forgets every fed token from index `length` on."""
        if length >= len(self.fed):
            return
        rolled = sum(self._matched[length:])
        if rolled and not self.matcher.rollback(rolled):
            raise RuntimeError(f"grammar matcher could not roll back {rolled} tokens: {self.matcher.get_error()}")
        del self.fed[length:], self._matched[length:]
        if self.start is not None and self.start > length:
            self.start = None
        self.ended = self.start is not None and any(
            token in self._ends and not matched
            for token, matched in zip(self.fed[self.start :], self._matched[self.start :])
        )

    def allowed(self) -> np.ndarray | None:
        """[V] bool: the tokens the grammar allows next; None when unconstrained (before the marker, or after
        the grammar ended with a stop id)."""
        if self.start is None or self.ended:
            return None
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[: self.vocab_size].astype(bool)
        allowed[self._end_ids] = False
        if self.matcher.is_accepting():
            allowed[[i for i in self._stop_list if i < self.vocab_size]] = True
        if not allowed.any():  # complete, but EOS is not a stop id (ignore_eos): only EOS can follow
            allowed[self._end_ids] = True
        return allowed
