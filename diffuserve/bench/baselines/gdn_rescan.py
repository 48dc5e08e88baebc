"""The GDN-prefix rescan: a benchmark baseline (`bench compare`'s gdn-rescan, bench/baselines/rescan.py) for the
question "what does keeping the recurrent state buy?". It is the engine with its K/V pages cached as usual, but
no GDN state carried from one step to the next: each GDN layer keeps, per committed position, the inputs of its
causal scan (`GdnInputs`: the pre-conv qkv projection, g and beta; the cheapest tensors the state is a function
of) and, at every step, rebuilds each scheduled sequence's state from zero by scanning its whole committed prefix
with the chunked delta rule the commits use. The step then runs as gdn_step always does (commit, then block).

So a step costs the GDN layers the whole prefix's conv and delta rule, where the kept state costs them only the
step's own tokens. Neither the layer projections (kept) nor the prefix's outputs (`scan_state` computes the state
alone) are recomputed: this is the cheapest way to do without the state.

History layout, per GDN layer: `GdnInputs` with B = state slots and T = positions ([num_slots, max_len, ...]),
addressed flat as row slot * max_len + position. The rescan runner builds the row indices. It is the GDN
step's observer (model/families/clover_moe/gdn_step.py's GdnStepObserver): `before_layer` rebuilds, `on_commit`
records.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffuserve.model.families.clover_moe.gated_deltanet import GatedDeltaNet, GdnInputs


@dataclass(frozen=True)
class PrefixGroup:
    """Sequences whose committed prefix has the same length L (> 0)."""

    rows: torch.Tensor
    """[S, L] long: the flat history row of each prefix position."""
    slots: torch.Tensor
    """[S] long: each sequence's state slot (where its rebuilt state goes)."""


@dataclass(frozen=True)
class GdnRescan:
    history: list[GdnInputs]
    """Per GDN layer (in layer order): the scan inputs of every slot's committed positions."""
    prefixes: tuple[PrefixGroup, ...]
    """The step's sequences with a non-empty committed prefix (an empty one is the executor's slot reset)."""
    write_rows: torch.Tensor
    """[N] the flat history row of each step-batch row (only commit rows are written)."""

    def before_layer(
        self, layer: GatedDeltaNet, gdn_index: int, conv_cache: torch.Tensor, recurrent_cache: torch.Tensor
    ) -> None:
        """Overwrites the step's slots with the state after their committed prefix, scanned from zero."""
        flat = [t.flatten(0, 1) for t in self.history[gdn_index]]
        for group in self.prefixes:
            empty = layer.empty_state(group.slots.shape[0], conv_cache.dtype, conv_cache.device)
            state = layer.scan_state(GdnInputs(*(t[group.rows] for t in flat)), empty)
            conv_cache.index_copy_(0, group.slots, state.conv.to(conv_cache.dtype))
            recurrent_cache.index_copy_(0, group.slots, state.recurrent)

    def on_commit(self, gdn_index: int, rows: torch.Tensor, projected: GdnInputs) -> None:
        """Keeps the scan inputs of the commit tokens at step-batch rows `rows` [S, L] (projected: [S, L, ...])."""
        targets = self.write_rows[rows].flatten()
        for kept, values in zip(self.history[gdn_index], projected):
            kept.flatten(0, 1).index_copy_(0, targets, values.flatten(0, 1).to(kept.dtype))
