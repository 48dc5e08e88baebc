"""The model runner of `--recurrent-state rescan`: a benchmark baseline for hybrid models (the gdn-rescan variant
of `bench compare`), never a serving mode. The engine as it is (paged K/V for the attention layers, one flattened
batch, fused commit, the decoders) except that no GDN state is carried between steps: the GDN layers keep each
committed position's scan inputs in this runner's history buffers and rebuild every scheduled sequence's state
from them at each step (model/layers/gdn_rescan).

The state pool's slots still exist (they are where a step's rebuilt state lives while the step runs, and where
the slot's `last_hidden` row is kept) but are overwritten before every read. Prefix snapshots are off (a
snapshot would have to carry the history too), so a prefix-cache hit is never taken; a preempted request rescans
what its resumed commits rewrite, as the kept state path recomputes it.

History buffers, per GDN layer: [num_slots, history_length, ...] (`GdnInputs`: conv_dim in the model dtype, g and
beta fp32), sized for the longest sequence and its last block.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import torch

from diffuserve.engine.executor import ModelExecutor, StatePlan
from diffuserve.engine.hybrid_runner import HybridRunner
from diffuserve.engine.prompt_scoring import ScoringRows
from diffuserve.engine.request import ScheduledRequest
from diffuserve.model.clover_moe_config import hybrid_args
from diffuserve.model.layers.gated_deltanet import GdnInputs
from diffuserve.model.layers.gdn_rescan import GdnRescan, PrefixGroup


class RescanRunner(HybridRunner):
    supports_prompt_scoring = False  # the baseline rebuilds slots from kept commits; its variants are untested

    def __init__(
        self,
        executor: ModelExecutor,
        block_length: int,
        history_length: int,
        seed: int = 0,
        expert_stats: bool = False,
    ) -> None:
        super().__init__(executor, block_length, seed, expert_stats)
        cache = executor.state_cache
        assert cache is not None, "a hybrid model's executor has a state cache"
        gdn = hybrid_args(self.model.args).gdn
        self.history_length = history_length

        def buffer(width: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(cache.num_slots, history_length, width, dtype=dtype, device=self.device)

        model_dtype = cache.conv_caches[0].dtype
        self.history = [
            GdnInputs(
                buffer(gdn.conv_dim, model_dtype),
                buffer(gdn.num_value_heads, torch.float32),
                buffer(gdn.num_value_heads, torch.float32),
            )
            for _ in cache.conv_caches
        ]

    def _state_plan(self, scheduled: list[ScheduledRequest], scoring: ScoringRows) -> StatePlan:
        rescan = GdnRescan(self.history, self._prefixes(scheduled), self._write_rows(scheduled))
        return dataclasses.replace(super()._state_plan(scheduled, scoring), rescan=rescan)

    def _prefixes(self, scheduled: list[ScheduledRequest]) -> tuple[PrefixGroup, ...]:
        """The step's sequences by committed length: everything before their commit tokens is committed."""
        by_length: dict[int, list[int]] = defaultdict(list)
        for work in scheduled:
            if work.commit_start:
                by_length[work.commit_start].append(self._slot(work))
        groups = []
        for length, slots in sorted(by_length.items()):
            slot_ids = self._long(slots)
            rows = slot_ids[:, None] * self.history_length + torch.arange(length, device=self.device)
            groups.append(PrefixGroup(rows, slot_ids))
        return tuple(groups)

    def _write_rows(self, scheduled: list[ScheduledRequest]) -> torch.Tensor:
        """[N] the flat history row of each step-batch row (its slot's row at its position)."""
        rows = [
            self._slot(work) * self.history_length + torch.arange(work.query_start, work.query_end)
            for work in scheduled
        ]
        return torch.cat(rows).to(self.device)

    @staticmethod
    def _slot(work: ScheduledRequest) -> int:
        slot = work.request.state_slot
        assert slot is not None, "a running request of a hybrid model holds a state slot"
        return slot
