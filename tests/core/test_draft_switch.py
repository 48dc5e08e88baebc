"""decoder=auto's per-request rule, torch-free: a request's drafts pause while they decide no more tokens per forward
than a drafting forward costs (core/draft_switch.py), doubling the pause while they keep not paying, and resume at
once when they pay."""

from __future__ import annotations

import pytest

from diffuserve.core.draft_state import DraftState
from diffuserve.core.draft_switch import CPU_DRAFT_COST, GPU_DRAFT_COST, MAX_BACKOFF, back_off, default_draft_cost
from diffuserve.core.writes import Verification


def _check(draft: DraftState, kept: int, checked: int = 3) -> None:
    """A draft of `checked` tokens whose first `kept` are kept (all kept: no correction token), counted as
    core/verification.py counts it, then the rule."""
    verdict = Verification(checked, kept, None if kept == checked else 7)
    draft.num_checked += checked
    draft.num_kept += kept
    draft.num_draft_forwards += 1 + (verdict.token is not None)
    back_off(draft, verdict, CPU_DRAFT_COST)


def test_drafts_that_do_not_pay_for_their_forwards_pause_longer_each_time():
    draft = DraftState()
    skips = []
    for _ in range(7):
        _check(draft, kept=1)  # 1 + 1 / 2 = 1.5 tokens per drafting forward, against a cost of 1.9
        skips.append(draft.skip)
        draft.skip = 0  # the pause runs out
    assert skips == [1, 2, 4, 8, 16, 32, MAX_BACKOFF]


def test_drafts_that_pay_never_pause_and_one_bad_draft_among_them_costs_nothing():
    draft = DraftState()
    for kept in (3, 3, 2, 0, 3, 3):
        _check(draft, kept)
        assert draft.skip == 0 and draft.backoff == 0


def test_paying_again_resets_the_pause():
    draft = DraftState()
    _check(draft, kept=0)
    assert draft.skip == 1
    draft.skip = 0
    for _ in range(3):
        _check(draft, kept=3)
    assert draft.backoff == 0 and draft.skip == 0


@pytest.mark.parametrize("kept, pauses", [(0, True), (1, False)])
def test_on_a_gpu_only_drafts_that_keep_nothing_pause(kept, pauses):
    """A drafting forward costs about one autoregressive forward there: any kept token pays."""
    draft = DraftState()
    verdict = Verification(3, kept, 7)
    draft.num_checked, draft.num_kept, draft.num_draft_forwards = 3, kept, 2
    back_off(draft, verdict, default_draft_cost("cuda"))
    assert (draft.skip > 0) is pauses and default_draft_cost("cuda") == GPU_DRAFT_COST
