"""The gdn-rescan baseline of `bench compare` for models with recurrent layers, never a serving mode: the engine
as it is (paged K/V for the attention layers, one flattened batch, fused commit, the decoders) except that no GDN
state is carried between steps. The GDN layers keep each committed position's scan inputs in this runner's
history buffers and rebuild every scheduled sequence's state from them at each step (gdn_rescan.py): the runner
observes the GDN steps of its own forwards (gdn_step.observing), so nothing of it travels in the step's inputs.

The state slots still exist (they are where a step's rebuilt state lives while the step runs, and where the
slot's `last_hidden` row is kept) but are overwritten before every read. The engine runs without prefix caching
(a snapshot would have to carry the history too); a preempted request rescans what its resumed commits rewrite,
as the kept state path recomputes it.

History buffers, per GDN layer: [num_slots, history_length, ...] (`GdnInputs`: conv_dim in the model dtype, g and
beta fp32), sized for the longest sequence and its last block.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch

from diffuserve.bench.baselines.gdn_rescan import GdnRescan, PrefixGroup
from diffuserve.core.request import Request
from diffuserve.core.step import ScheduledRequest, StepResult
from diffuserve.decoding.block_decoding import BlockDecoding
from diffuserve.model.families.clover_moe.gated_deltanet import GatedDeltaNet, GdnInputs
from diffuserve.model.families.clover_moe.gdn_step import observing
from diffuserve.worker.cache.state_step import StatePlan, state_slot
from diffuserve.worker.executor import ModelExecutor
from diffuserve.worker.model_runner import ModelRunner


class RescanRunner(ModelRunner):
    supports_prompt_scoring = False  # the baseline rebuilds slots from kept commits; its variants are untested

    def __init__(
        self, executor: ModelExecutor, decoding: BlockDecoding, history_length: int, expert_stats: bool = False
    ) -> None:
        super().__init__(executor, decoding, expert_stats)
        cache = executor.caches.state
        assert cache is not None, "the rescan baseline needs a recurrent state"
        self.history_length = history_length

        def buffer(width: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(cache.num_slots, history_length, width, dtype=dtype, device=self.device)

        self.rescan: GdnRescan | None = None
        """The step's rebuild of its sequences' states (planned with the step's batch)."""
        self.history = [
            GdnInputs(
                buffer(conv.shape[1], conv.dtype),
                buffer(state.shape[1], torch.float32),
                buffer(state.shape[1], torch.float32),
            )
            for conv, state in zip(cache.conv_caches, cache.recurrent_caches)
        ]

    def plan_state(self, scheduled: list[ScheduledRequest], variants: list[tuple[int, Request]]) -> StatePlan:
        """The serving plan, with the GDN layers observed: every slot rebuilt, every commit's inputs kept (and
        moved with a sequence that moves to another slot)."""
        plan = super().plan_state(scheduled, variants)
        if plan.moves is not None:
            src, dst = plan.moves
            for inputs in self.history:
                for t in inputs:
                    t.index_copy_(0, dst, t[src])
        self.rescan = GdnRescan(self.history, self._prefixes(scheduled), self._write_rows(scheduled))
        return plan

    def execute(self, scheduled: list[ScheduledRequest], beside: Callable[[], object] | None = None) -> StepResult:
        """The serving step, its GDN layers observed by this step's rescan (set while its batch is planned)."""
        with observing(self):
            return super().execute(scheduled, beside)

    def before_layer(
        self, layer: GatedDeltaNet, gdn_index: int, conv_cache: torch.Tensor, recurrent_cache: torch.Tensor
    ) -> None:
        assert self.rescan is not None, "the step's plan sets its rescan before the forward"
        self.rescan.before_layer(layer, gdn_index, conv_cache, recurrent_cache)

    def on_commit(self, gdn_index: int, rows: torch.Tensor, projected: GdnInputs) -> None:
        assert self.rescan is not None, "the step's plan sets its rescan before the forward"
        self.rescan.on_commit(gdn_index, rows, projected)

    def _prefixes(self, scheduled: list[ScheduledRequest]) -> tuple[PrefixGroup, ...]:
        """The step's sequences by committed length: everything before their commit tokens is committed."""
        by_length: dict[int, list[int]] = defaultdict(list)
        for work in scheduled:
            if work.commit_start:
                by_length[work.commit_start].append(state_slot(work.request))
        groups = []
        for length, slots in sorted(by_length.items()):
            slot_ids = torch.tensor(slots, dtype=torch.long, device=self.device)
            rows = slot_ids[:, None] * self.history_length + torch.arange(length, device=self.device)
            groups.append(PrefixGroup(rows, slot_ids))
        return tuple(groups)

    def _write_rows(self, scheduled: list[ScheduledRequest]) -> torch.Tensor:
        """[N] the flat history row of each step-batch row (its slot's row at its position)."""
        rows = [
            state_slot(work.request) * self.history_length + torch.arange(work.query_start, work.query_end)
            for work in scheduled
        ]
        return torch.cat(rows).to(self.device)
