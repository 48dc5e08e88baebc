"""Decoders and sampling as pure functions, on hand-set confidences and logits."""

from __future__ import annotations

import math

import torch

from diffuserve.engine.decoders import DECODERS, Proposal, filter_logits, num_transfer_tokens, propose
from diffuserve.sampling_params import MASK_DECODER_NAMES, SamplingParams

NEG = float("-inf")


def proposal(conf: list[float], entropy: list[float] | None = None) -> Proposal:
    tokens = torch.arange(len(conf))
    return Proposal(tokens, torch.tensor(conf), None if entropy is None else torch.tensor(entropy))


def accepted(decoder: str, prop: Proposal, step: int = 0, **params) -> list[int]:
    mask = DECODERS[decoder].select(prop, step, SamplingParams(**params).with_defaults({}), len(prop.confidence))
    return mask.nonzero().flatten().tolist()


def test_every_decoder_name_has_its_policy():
    assert tuple(DECODERS) == MASK_DECODER_NAMES
    assert [type(d).__name__ for d in DECODERS.values()] == [
        "ThresholdDecoder",
        "FixedStepsDecoder",
        "EntropyBoundDecoder",
        "EditDecoder",
    ]


def test_with_defaults_resolves_every_knob():
    model = {"threshold": 0.95, "steps": 8}
    resolved = SamplingParams(max_tokens=None, stop_token_ids=[7]).with_defaults(
        model, max_tokens_limit=40, eos_token_ids=[2]
    )
    assert (resolved.decoder, resolved.threshold, resolved.steps, resolved.temperature) == ("threshold", 0.95, 8, 0.0)
    assert (resolved.entropy_bound, resolved.edit_threshold, resolved.max_post_edit_steps) == (0.35, 0.5, 16)
    assert resolved.max_tokens == 40 and resolved.stop_ids == {2, 7}
    capped = SamplingParams(max_tokens=100, ignore_eos=True, decoder="edit", threshold=0.5).with_defaults(
        model, max_tokens_limit=40, eos_token_ids=[2]
    )
    assert (capped.max_tokens, capped.stop_ids, capped.threshold, capped.post_edit_budget) == (40, set(), 0.5, 16)
    assert SamplingParams().with_defaults({}).steps is None  # block_length steps: the run's block length


def test_schedule_splits_the_block_evenly_with_remainder_first():
    assert [num_transfer_tokens(32, 32, s) for s in range(3)] == [1, 1, 1]
    assert [num_transfer_tokens(10, 4, s) for s in range(4)] == [3, 3, 2, 2]


def test_threshold_is_strict_and_falls_back_to_top_k():
    prop = proposal([0.9, 0.95, NEG, 0.2])
    assert accepted("threshold", prop, threshold=0.9) == [1]  # 0.9 is not > 0.9
    assert accepted("threshold", prop, threshold=0.99) == [1]  # none above: the single most confident
    assert accepted("threshold", prop, threshold=0.1) == [0, 1, 3]  # never the unmasked position
    assert accepted("threshold", prop, threshold=0.99, steps=2) == [0, 1]  # schedule asks for 2 per step


def test_fixed_steps_accepts_the_schedules_count_clamped_to_masks():
    prop = proposal([0.3, NEG, 0.8, 0.5])
    assert accepted("fixed", prop, steps=2) == [2, 3]
    assert accepted("fixed", prop, steps=1) == [0, 2, 3]  # asks for 4, only 3 masked


def test_entropy_bound_accepts_the_low_entropy_prefix():
    inf = math.inf
    prop = proposal([0.9, 0.8, 0.7, NEG], entropy=[0.1, 0.2, 0.5, inf])
    # sorted: 0.1, 0.2, 0.5; sum minus largest member: 0, 0.1, 0.3
    assert accepted("entropy", prop, entropy_bound=0.15) == [0, 1]
    assert accepted("entropy", prop, entropy_bound=0.3) == [0, 1, 2]
    assert accepted("entropy", prop, entropy_bound=0.0) == [0]  # always at least one


def test_greedy_proposal_is_argmax_with_softmax_confidence():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    greedy = SamplingParams(temperature=0.0).with_defaults({})
    prop = propose(logits, torch.tensor([0, 2]), 3, greedy, None, need_entropy=True)
    assert prop.tokens[[0, 2]].tolist() == [1, 0]
    assert torch.allclose(prop.confidence[[0, 2]], torch.softmax(logits, -1).max(-1).values)
    assert prop.confidence[1] == NEG and prop.entropy[1] == math.inf


def test_seeded_sampling_is_reproducible_and_respects_top_k():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0, top_k=3).with_defaults({})
    masked = torch.arange(6)
    draws = [propose(logits, masked, 6, params, torch.Generator().manual_seed(7)).tokens for _ in range(2)]
    assert torch.equal(draws[0], draws[1])
    top3 = torch.topk(logits, 3, dim=-1).indices
    assert all(int(t) in top3[i].tolist() for i, t in enumerate(draws[0]))


def test_top_p_keeps_the_token_that_crosses_the_mass():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(filter_logits(logits, 0, 0.6))[0].tolist()
    assert kept == [True, True, False, False]
