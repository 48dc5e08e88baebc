"""Gated DeltaNet over an engine step: a flattened batch of many sequences, each reading and advancing its own
state slot in a preallocated state pool (the recurrent counterpart of attention's paged K/V).

Per sequence the step holds `commit` tokens (prompt blocks, or the block finished last step) and then optionally
one `block` of B tokens being denoised. Each GDN layer, for every sequence:

    1. advances the slot's state causally over the commit tokens (written back into the slot),
    2. runs the block against the advanced state: the block-diffusion preview (state read only) or, for a model
       without the diffusion tensors, a causal pass whose resulting state is dropped.

A commit run may be split at a page boundary whose state is kept as a prefix snapshot (its groups come first).
Sequences whose commit runs have the same length are batched together (in steady state every fused commit is
one block, so they form one group), and all blocks are batched in one preview. The row and slot indices are
built once per step by the engine (`RecurrentStepInputs`); this module only reads the slots (views of the pool
where a group's slots are one range, else gathered copies), runs and writes back. Knows nothing of requests or
pages.

Pool layout, per GDN layer (slot = a sequence's or a prefix snapshot's place in the pool):

    conv_cache       [num_slots, conv_dim, k - 1]  model dtype
    recurrent_cache  [num_slots, Hv, Dk, Dv]       fp32
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

import torch

from diffuserve.model.families.clover_moe.gated_deltanet import GatedDeltaNet, GdnInputs, GdnState
from diffuserve.model.step_inputs import RecurrentStepInputs, RowGroup


class GdnStepObserver(Protocol):
    """A hook into every GDN layer's step, for a benchmark baseline that rebuilds the state differently
    (bench/baselines/rescan.py), installed around its forwards by `observing`; never set when serving."""

    def before_layer(
        self, layer: GatedDeltaNet, gdn_index: int, conv_cache: torch.Tensor, recurrent_cache: torch.Tensor
    ) -> None:
        """`layer` is the `gdn_index`-th GDN layer, about to read its slot tensors."""

    def on_commit(self, gdn_index: int, rows: torch.Tensor, projected: GdnInputs) -> None:
        """The `gdn_index`-th GDN layer's scan inputs for the commit rows `rows`."""


_OBSERVER: ContextVar[GdnStepObserver | None] = ContextVar("gdn_step_observer", default=None)


@contextmanager
def observing(observer: GdnStepObserver) -> Iterator[None]:
    """Every GDN step inside it reports to `observer`."""
    token = _OBSERVER.set(observer)
    try:
        yield
    finally:
        _OBSERVER.reset(token)


def gdn_step(layer: GatedDeltaNet, x: torch.Tensor, inputs: RecurrentStepInputs, gdn_index: int) -> torch.Tensor:
    """x [N, H] (the step batch, normed) -> the layer's output [N, H]; advances the commit sequences' slots.

    The projections (in and out) run once over all N rows: at batch 1 a step's commit and its block would
    otherwise each read the layer's projection weights. Rows in no group (a bucket-padded forward's padding) get
    0: they advance no state, and their output stays finite."""
    conv_cache, recurrent_cache = inputs.conv_caches[gdn_index], inputs.recurrent_caches[gdn_index]
    observer = _OBSERVER.get()
    if observer is not None:
        observer.before_layer(layer, gdn_index, conv_cache, recurrent_cache)
    projected = layer.project(x)  # [N, ...]
    gdn = layer.gdn
    o = x.new_zeros(x.shape[0], gdn.num_value_heads, gdn.value_head_dim, dtype=torch.float32)
    for group in inputs.commits:
        group_inputs = GdnInputs(*(t[group.rows] for t in projected))  # [S, L, ...]
        if observer is not None:
            observer.on_commit(gdn_index, group.rows, group_inputs)
        # in_place: the state read is the pool's own rows (a view) or our gathered copy, overwritten below anyway
        group_o, state = layer.scan(group_inputs, slot_state(conv_cache, recurrent_cache, group), in_place=True)
        o[group.rows] = group_o.transpose(1, 2)
        store_state(conv_cache, recurrent_cache, group, state)
        if group.snapshot_slots is not None:
            # Copies: where the group's slots are one range, the state is the pool's own rows, and index_copy_
            # refuses a source that overlaps its destination.
            conv_cache.index_copy_(0, group.snapshot_slots, state.conv.to(conv_cache.dtype, copy=True))
            recurrent_cache.index_copy_(0, group.snapshot_slots, state.recurrent.clone())
    blocks = inputs.blocks
    if blocks is not None:
        # Read after the commits above: a block sees its own sequence's state advanced by this step's commit.
        state = slot_state(conv_cache, recurrent_cache, blocks)  # read only: the preview and scan copy it
        block_inputs = GdnInputs(*(t[blocks.rows] for t in projected))  # [S, B, ...]
        block_o = layer.preview_mix(block_inputs, state) if inputs.preview else layer.scan(block_inputs, state)[0]
        o[blocks.rows] = block_o.transpose(1, 2)
    return layer.gated_output(o, layer.in_proj_z(x))


def slot_state(conv_cache: torch.Tensor, recurrent_cache: torch.Tensor, group: RowGroup) -> GdnState:
    """The group's slots' state [S, ...]: the pool's rows themselves when they are one range (`first_slot`; a
    decode step of 128 clover-moe-bench sequences would otherwise copy 16 MiB out and back per layer), else a copy."""
    if group.first_slot is None:
        return GdnState(conv_cache[group.slots], recurrent_cache[group.slots])
    rows = slice(group.first_slot, group.first_slot + group.slots.shape[0])
    return GdnState(conv_cache[rows], recurrent_cache[rows])


def store_state(conv_cache: torch.Tensor, recurrent_cache: torch.Tensor, group: RowGroup, state: GdnState) -> None:
    """Writes the group's advanced state into its slots (nothing to copy where the scan advanced the pool's rows
    in place)."""
    if group.first_slot is None:
        conv_cache.index_copy_(0, group.slots, state.conv.to(conv_cache.dtype))
        recurrent_cache.index_copy_(0, group.slots, state.recurrent)
        return
    rows = slice(group.first_slot, group.first_slot + group.slots.shape[0])
    conv_cache[rows].copy_(state.conv)
    if state.recurrent.data_ptr() != recurrent_cache[rows].data_ptr():
        recurrent_cache[rows].copy_(state.recurrent)
