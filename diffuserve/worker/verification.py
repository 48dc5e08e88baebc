"""The worker's side of verified decoding (decoding/verification.py checks the drafts): which rows of a step's
forward predict a draft's positions, and the state slots saved before the forward that commits a draft and put
back after a rejection. Knows no family: it reads causal rows under the AR shift (row p - 1 predicts p), which the
decoder registry requires of a model before it gives a request the verified decoder.

A request's draft [s, s + B) is verified by the step whose commit run starts at s (the scheduler commits a draft
from its own start); its head s was verified when it was written, so rows s .. s + B - 2, all commit rows of that
run, check positions s + 1 .. s + B - 1. Before that forward the slot's state (the state after s) is saved; if the
draft is rejected, the next forward first puts it back (worker/cache/state_step.py), so the GDN state and conv
ring end where the kept tokens start to be committed again. Attention K/V need no copy: the rejected positions are
written again before any query that may see them reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diffuserve.core.step import ScheduledRequest
from diffuserve.core.writes import Verification
from diffuserve.worker.cache.state_step import state_slot


@dataclass
class StepDrafts:
    """A step's drafted blocks, as the batch is built: the rows that check them and their state slots."""

    rows: list[int] = field(default_factory=list)
    """The batch row predicting each checked position, drafts one after another."""
    slots: list[int] = field(default_factory=list)
    """The state slots of the requests whose draft the step commits (saved before the forward)."""

    def add(self, work: ScheduledRequest, first_row: int, positions: list[int]) -> None:
        """`work`'s commit run, which checks the drafted `positions`, starts at batch row `first_row`."""
        self.rows += [first_row + p - 1 - work.commit_start for p in positions]
        self.slots.append(state_slot(work.request))


def rejected_slots(scheduled: list[ScheduledRequest], verdicts: dict[str, Verification]) -> list[int]:
    """The state slots of the drafts `verdicts` rejected (the next forward puts them back first)."""
    rejected = [w for w in scheduled if (v := verdicts.get(w.request.request_id)) is not None and v.token is not None]
    return [state_slot(work.request) for work in rejected]
