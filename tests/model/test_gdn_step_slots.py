"""A GDN layer's engine step reads and writes its state slots the same way whether they form one range of the pool
(read and advanced in place, as views) or not (gathered and scattered copies): against the layer's own `forward`
per sequence, for one-token commits (the recurrent rule, in place), multi-token commits (the chunked rule), block
previews (read only) and causal blocks (state dropped). The slot pool hands out the lowest free slot, so
sequences admitted together hold one range; the one-token rule advances a state in place only when asked."""

from __future__ import annotations

import pytest
import torch

from diffuserve.model.families.clover_moe.config import clover_moe_args_from_hf, hybrid_args
from diffuserve.model.families.clover_moe.delta_rule import recurrent_delta_rule
from diffuserve.model.families.clover_moe.dense import gdn_causal, gdn_preview
from diffuserve.model.families.clover_moe.gated_deltanet import GatedDeltaNet, GdnState
from diffuserve.model.families.clover_moe.gdn_step import gdn_step
from diffuserve.model.step_inputs import RecurrentStepInputs, RowGroup
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config
from diffuserve.worker.cache.state_step import consecutive_start

NUM_SLOTS, HIDDEN = 9, 64


def _layer(diffusion: bool) -> GatedDeltaNet:
    """A tiny clover_moe GDN layer with seeded random weights (and block-diffusion tensors with `diffusion`)."""
    args = clover_moe_args_from_hf(make_clover_moe_config())
    layer = GatedDeltaNet(args.hidden_size, hybrid_args(args).gdn, args.rms_norm_eps, diffusion=diffusion)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
        layer.A_log.copy_(torch.linspace(0.0, 2.5, layer.A_log.numel()))
    return layer.eval()


def _pool(layer: GatedDeltaNet) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    gdn = layer.gdn
    conv = torch.randn(NUM_SLOTS, gdn.conv_dim, gdn.conv_kernel - 1, generator=gen)
    recurrent = torch.randn(NUM_SLOTS, gdn.num_value_heads, gdn.key_head_dim, gdn.value_head_dim, generator=gen) * 0.3
    return conv, recurrent


def _group(slots: list[int], starts: list[int], length: int, as_range: bool) -> RowGroup:
    rows = torch.tensor(starts)[:, None] + torch.arange(length)
    first = consecutive_start(slots) if as_range else None
    return RowGroup(rows, torch.tensor(slots), None, first)


def _step(layer, x, pool, commit_slots, commit_len, block_slots, block_len, preview, as_range):
    """One gdn_step: each sequence's commit run, then each sequence's block, rows in that order."""
    conv, recurrent = (t.clone() for t in pool)
    commits = _group(commit_slots, [i * commit_len for i in range(len(commit_slots))], commit_len, as_range)
    first_block = len(commit_slots) * commit_len
    starts = [first_block + i * block_len for i in range(len(block_slots))]
    blocks = _group(block_slots, starts, block_len, as_range) if block_slots else None
    inputs = RecurrentStepInputs([conv], [recurrent], (commits,), blocks, preview)
    with torch.no_grad():
        out = gdn_step(layer, x, inputs, 0)
    return out, conv, recurrent


def _expected(layer, x, pool, commit_slots, commit_len, block_slots, block_len, preview):
    """The layer read whole (causal / preview), one sequence at a time from its slot's state."""
    conv, recurrent = (t.clone() for t in pool)
    out = torch.empty_like(x)
    with torch.no_grad():
        for i, slot in enumerate(commit_slots):
            rows = slice(i * commit_len, (i + 1) * commit_len)
            state = GdnState(conv[slot : slot + 1], recurrent[slot : slot + 1])
            out[rows], after = gdn_causal(layer, x[None, rows], state)
            conv[slot], recurrent[slot] = after.conv[0], after.recurrent[0]
        first_block = len(commit_slots) * commit_len
        for i, slot in enumerate(block_slots):
            rows = slice(first_block + i * block_len, first_block + (i + 1) * block_len)
            state = GdnState(conv[slot : slot + 1], recurrent[slot : slot + 1])
            out[rows] = (
                gdn_preview(layer, x[None, rows], state) if preview else gdn_causal(layer, x[None, rows], state)[0]
            )
    return out, conv, recurrent


CASES = {
    "one-token commits": ([2, 3, 4, 5], 1, [], 0, False),
    "prompt commits": ([4, 5, 6], 5, [], 0, False),
    "commits and previews": ([1, 2, 3], 4, [1, 2, 3], 4, True),
    "causal blocks": ([6, 7], 1, [6, 7], 1, False),
}


def _setup(case: str, seed: int):
    """The case's layer, slot pool, step input [rows, H] and (commit slots, commit length, block slots, block
    length, preview)."""
    commit_slots, commit_len, block_slots, block_len, preview = CASES[case]
    layer = _layer(diffusion=preview)
    rows = len(commit_slots) * commit_len + len(block_slots) * block_len
    x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(seed))
    return layer, _pool(layer), x, CASES[case]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("as_range", [True, False], ids=["views", "copies"])
def test_step_equals_the_layer_per_sequence(case, as_range):
    layer, pool, x, args = _setup(case, seed=6)
    commit_slots = args[0]
    out, conv, recurrent = _step(layer, x, pool, *args, as_range=as_range)
    want_out, want_conv, want_recurrent = _expected(layer, x, pool, *args)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(conv, want_conv, atol=1e-5, rtol=0)  # the ring holds projections: batched rounding
    torch.testing.assert_close(recurrent, want_recurrent, atol=1e-5, rtol=0)
    untouched = [s for s in range(NUM_SLOTS) if s not in commit_slots]
    assert torch.equal(recurrent[untouched], pool[1][untouched]) and torch.equal(conv[untouched], pool[0][untouched])


@pytest.mark.parametrize("case", CASES)
def test_views_and_copies_give_the_same_bits(case):
    layer, pool, x, args = _setup(case, seed=7)
    views = _step(layer, x, pool, *args, as_range=True)
    copies = _step(layer, x, pool, *args, as_range=False)
    assert all(torch.equal(a, b) for a, b in zip(views, copies))


def test_consecutive_start():
    assert consecutive_start([3, 4, 5]) == 3 and consecutive_start([7]) == 7
    assert consecutive_start([3, 5, 6]) is None and consecutive_start([4, 3]) is None
    assert consecutive_start([2, 2]) is None


def test_one_token_rule_in_place_only_when_asked():
    gen = torch.Generator().manual_seed(8)
    q, k = (torch.nn.functional.normalize(torch.randn(3, 2, 1, 8, generator=gen), dim=-1) for _ in range(2))
    v, g, beta = torch.randn(3, 2, 1, 6, generator=gen), -torch.rand(3, 2, 1, generator=gen), torch.rand(3, 2, 1)
    state = torch.randn(3, 2, 8, 6, generator=gen)
    kept = state.clone()
    out, final = recurrent_delta_rule(q, k, v, g, beta, state)
    assert torch.equal(state, kept) and final.data_ptr() != state.data_ptr()
    out_in_place, final_in_place = recurrent_delta_rule(q, k, v, g, beta, state, in_place=True)
    assert final_in_place.data_ptr() == state.data_ptr()
    assert torch.equal(out_in_place, out) and torch.equal(final_in_place, final)
