"""Decoders and sampling as pure functions, on hand-set confidences and logits."""

from __future__ import annotations

import math

import torch

from diffuserve.decoding.mask_policies import MASK_POLICIES, Proposal, filter_logits, num_transfer_tokens, propose
from diffuserve.reference import reference_decoders
from diffuserve.sampling_defaults import MASK_DECODER_NAMES
from diffuserve.sampling_params import SamplingParams

NEG = float("-inf")


def proposal(conf: list[float], entropy: list[float] | None = None) -> Proposal:
    tokens = torch.arange(len(conf))
    return Proposal(tokens, torch.tensor(conf), None if entropy is None else torch.tensor(entropy))


def accepted(decoder: str, prop: Proposal, step: int = 0, **params) -> list[int]:
    mask = MASK_POLICIES[decoder].select(prop, step, SamplingParams(**params).with_defaults({}), len(prop.confidence))
    return mask.nonzero().flatten().tolist()


def test_every_decoder_name_has_its_policy():
    assert tuple(MASK_POLICIES) == MASK_DECODER_NAMES
    assert [type(d).__name__ for d in MASK_POLICIES.values()] == [
        "ThresholdPolicy",
        "FixedStepsPolicy",
        "EntropyBoundPolicy",
        "EditPolicy",
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


# The LLaDA2 release's temperature-0 rule, restated literally: argmax of the logits, confidence = that token's
# probability under the softmax of the whole vocabulary (the mask token included), strict threshold, top-k
# fallback over the block.
def released_greedy_accept(logits: torch.Tensor, threshold: float, count: int) -> list[int]:
    probs = torch.softmax(logits, dim=-1)
    confidence = probs.gather(-1, logits.argmax(dim=-1, keepdim=True)).squeeze(-1)
    above = (confidence > threshold).nonzero().flatten().tolist()
    return above if len(above) >= count else sorted(torch.topk(confidence, count).indices.tolist())


MASK = 3
# Position 0 leaves much of its mass on the mask token, position 1 little: under the whole vocabulary position 1
# is the more confident (0.45 > 0.42), renormalised without the mask token position 0 is (0.68 > 0.47), and
# position 0 even passes a 0.5 threshold.
MASS_ON_MASK = torch.log(torch.tensor([[0.42, 0.10, 0.10, 0.38], [0.45, 0.25, 0.25, 0.05]]))


def greedy_accepted(logits: torch.Tensor, threshold: float, mask_token_id: int | None = MASK) -> list[int]:
    params = SamplingParams(temperature=0.0, threshold=threshold).with_defaults({})
    prop = propose(logits, torch.arange(len(logits)), len(logits), params, None, mask_token_id=mask_token_id)
    return MASK_POLICIES["threshold"].select(prop, 0, params, len(logits)).nonzero().flatten().tolist()


def test_greedy_confidence_is_the_whole_vocabularys_probability():
    greedy = SamplingParams(temperature=0.0).with_defaults({})
    prop = propose(MASS_ON_MASK, torch.arange(2), 2, greedy, None, need_entropy=True, mask_token_id=MASK)
    probs = torch.softmax(MASS_ON_MASK, -1)
    assert prop.tokens.tolist() == [0, 0]
    assert torch.equal(prop.confidence, probs[:, 0])  # bit for bit the released file's softmax(...).gather
    assert torch.allclose(prop.entropy, -(probs * probs.log()).sum(-1))


def test_the_mask_tokens_mass_decides_threshold_and_fallback_as_in_the_released_file():
    for threshold in (0.5, 0.95):
        expected = released_greedy_accept(MASS_ON_MASK, threshold, 1)
        assert greedy_accepted(MASS_ON_MASK, threshold) == expected == [1]


def test_the_naive_reference_states_the_same_rule():
    """The oracle of the parity tests (its own code) must hold the released rule too, or both could drift."""
    params = SamplingParams(temperature=0.0, threshold=0.5)
    prop = reference_decoders.propose(MASS_ON_MASK, [0, 1], 2, params, None, mask_token=MASK)
    assert torch.equal(prop.confidence, torch.softmax(MASS_ON_MASK, -1)[:, 0])
    for threshold in (0.5, 0.95):
        chosen = reference_decoders.threshold_positions(prop.confidence, 1, threshold)
        assert chosen == released_greedy_accept(MASS_ON_MASK, threshold, 1) == [1]
    first = torch.tensor([[1.0, 3.0, 2.0, 5.0]])
    assert reference_decoders.propose(first, [0], 1, params, None, mask_token=MASK).tokens == {0: 1}


def test_a_row_ranking_the_mask_token_first_proposes_its_best_other_token():
    logits = torch.tensor([[1.0, 3.0, 2.0, 5.0], [4.0, 3.0, 2.0, 1.0]])
    greedy = SamplingParams(temperature=0.0).with_defaults({})
    prop = propose(logits, torch.arange(2), 2, greedy, None, num_logprobs=4, mask_token_id=MASK)
    assert prop.tokens.tolist() == [1, 0]
    assert torch.equal(prop.confidence, torch.softmax(logits, -1)[[0, 1], [1, 0]])
    # the logprobs' distribution gives the mask token nothing (renormalised without it)
    assert prop.logprobs is not None
    without = torch.log_softmax(logits[:, :MASK], -1)
    assert torch.allclose(prop.logprobs.chosen, without[[0, 1], [1, 0]])
    assert MASK not in prop.logprobs.top_ids[:, :MASK].flatten().tolist()
    assert torch.isinf(prop.logprobs.top_values[:, MASK]).all()


def test_greedy_ties_go_to_the_lowest_token_id():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
    greedy = SamplingParams(temperature=0.0).with_defaults({})
    assert propose(logits, torch.arange(2), 2, greedy, None).tokens.tolist() == [1, 0]
    assert propose(logits, torch.arange(2), 2, greedy, None, mask_token_id=0).tokens.tolist() == [1, 1]
    # distinct logits whose probabilities round to one value: the logits' argmax, as the released file takes it
    near = torch.tensor([[-1e-9, 0.0, -5.0]])
    assert torch.softmax(near, -1)[0, 0] == torch.softmax(near, -1)[0, 1]
    assert propose(near, torch.arange(1), 1, greedy, None).tokens.tolist() == [1]


def test_sampling_never_draws_the_mask_token():
    logits = torch.tensor([[0.0, 1.0, 0.5, 9.0]]).repeat(64, 1)
    params = SamplingParams(temperature=1.0, top_k=1).with_defaults({})
    prop = propose(logits, torch.arange(64), 64, params, torch.Generator().manual_seed(0), mask_token_id=MASK)
    # the mask token is removed before top-k: the top-1 of the others, drawn with certainty
    assert prop.tokens.tolist() == [1] * 64 and torch.equal(prop.confidence, torch.ones(64))
