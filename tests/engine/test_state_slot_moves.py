"""Running sequences of a hybrid model are kept in one range of state slots: when requests finish out of order, a
sequence above the range moves down into the lowest free slot, its state and kept row copied by the next forward
(`ScheduledRequest.move_from`, `StatePlan.moves`). Checked on tiny Clover checkpoints with requests of different
lengths: autoregressive (block length 1) against transformers' Qwen3_5MoeForCausalLM recomputing every prefix (no
engine code), with and without prefix caching and fused commits; block diffusion and verified decoding against the
engine decoding each prompt alone (one sequence never moves). Each run must move sequences, and its last step's GDN
groups must be one range of slots (read in place). A move copies the whole slot, reading every source before any
write."""

from __future__ import annotations

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.model.shapes import RecurrentState
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.worker.cache.state_step import StatePlan, StateTensors
from tests.engine.clover_greedy import greedy_by_recompute

pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

PREFIX = [5, 9, 11, 40, 41, 42, 7, 8, 100, 101, 102, 103, 13, 14, 15, 16, 17]
PROMPTS = [PREFIX + [60 + i] * (i % 5) + [i] for i in range(6)]
MAX_TOKENS = [3, 16, 5, 16, 8, 12]  # the first, third and fifth finish first: holes below running sequences


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    config = make_clover_moe_config(block_length=4)
    return write_clover_moe_checkpoint(tmp_path_factory.mktemp("moves"), config, seed=5, init_std=0.1)


@pytest.fixture(scope="module")
def expected(model_dir) -> list[list[int]]:
    return greedy_by_recompute(model_dir, PROMPTS, MAX_TOKENS)


def _params(**options) -> list[SamplingParams]:
    return [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **options) for n in MAX_TOKENS]


def _run(model_dir, params, **options) -> tuple[list[list[int]], list]:
    """The engine's tokens for all prompts at once, and the state plan of every forward."""
    llm = LLM(str(model_dir), device="cpu", max_model_len=64, **options)
    state = llm.engine.runner.executor.caches.state
    before_forward, plans = state.before_forward, []

    def recording(plan):
        plans.append(plan)
        return before_forward(plan)

    state.before_forward = recording
    tokens = [list(out.outputs[0].token_ids) for out in llm.generate(PROMPTS, params)]
    return tokens, plans


def _alone(model_dir, params, **options) -> list[list[int]]:
    llm = LLM(str(model_dir), device="cpu", max_model_len=64, **options)
    return [list(llm.generate([p], [q])[0].outputs[0].token_ids) for p, q in zip(PROMPTS, params, strict=True)]


def _check_moved(plans) -> None:
    assert sum(0 if p.moves is None else p.moves[0].numel() for p in plans) > 0
    last = plans[-1]
    groups = [*last.commits, *([last.blocks] if last.blocks is not None else [])]
    assert groups and all(g.first_slot is not None for g in groups)


@pytest.mark.parametrize(
    "options",
    [
        dict(enable_prefix_caching=False),
        dict(enable_prefix_caching=True),
        dict(enable_prefix_caching=False, fused_commit=False),  # steps with no commit rows run no forward
        dict(enable_prefix_caching=False, fused_commit=False, max_num_batched_tokens=8),  # ... out of phase
    ],
    ids=["no prefix cache", "prefix cache", "no fused commit", "no fused commit, short budget"],
)
def test_autoregressive_moves_equal_transformers(model_dir, expected, options):
    tokens, plans = _run(model_dir, _params(), block_length=1, **options)
    assert tokens == expected
    _check_moved(plans)


@pytest.mark.parametrize("decoder", ["threshold", "verified"])
def test_diffusion_moves_equal_each_prompt_alone(model_dir, decoder):
    params = _params(decoder=decoder)
    tokens, plans = _run(model_dir, params, block_length=4, enable_prefix_caching=False)
    assert tokens == _alone(model_dir, params, block_length=4, enable_prefix_caching=False)
    _check_moved(plans)


def test_a_move_copies_the_whole_slot_reading_every_source_first():
    """Slot 5 moves into 3 while slot 3 moves to 0 in the same step: 3's old contents must reach 0."""
    spec = RecurrentState(2, 2, 4, 4, 4, conv_dtype="fp32")
    tensors = StateTensors.allocate([spec, spec], num_slots=6, hidden_size=8, tp=1, device=torch.device("cpu"))
    every = tensors._tensors()
    for t in every:
        t.copy_(torch.arange(6, dtype=t.dtype).view(6, *[1] * (t.dim() - 1)).expand_as(t))
    empty = torch.zeros(0, dtype=torch.long)
    moves = (torch.tensor([5, 3]), torch.tensor([3, 0]))
    tensors.before_forward(StatePlan((), None, True, empty, None, moves, empty, empty))
    for t in every:
        assert [int(t[i].flatten()[0]) for i in range(6)] == [3, 1, 2, 5, 4, 5]
