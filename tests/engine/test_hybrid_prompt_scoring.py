"""Prompt scoring on clover_moe (hybrid GDN + attention): the engine's variants (block previews of the request's
state slot, the AR shift's row p - 1, a block's first position from the last committed row) equal the naive
reference (one uncached forward per scored position, reference/reference_scoring.py) with and without the
block-diffusion tensors (without: a plain causal LM), whole and chunked; scoring requests leave generating
requests' tokens unchanged; reading row p, or letting a variant advance the state, fails the equality."""

from __future__ import annotations

import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.bench.baselines.engines import baseline_llm
from diffuserve.core.cache import recurrent
from diffuserve.errors import UnsupportedParameter
from diffuserve.model.loader import load_model
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.reference_scoring import reference_hybrid_prompt_log_probs
from diffuserve.worker import prompt_scoring
from diffuserve.worker.cache import state_step
from tests.engine.test_oracle_mutations import apply_source_mutation
from tests.engine.test_prompt_scoring import _mismatches

BLOCK = 4
PROMPT = [7, 42, 99, 3, 15, 200, 61, 61, 8, 120, 33, 250, 5, 77]
"""14 tokens: three whole blocks of 4 and a tail of 2."""
TOLERANCE = 1e-4
KINDS = {"diffusion": {}, "no-shift": {"diffusion_prediction_shift": False}, "autoregressive": {}}


@pytest.fixture(scope="module", params=list(KINDS))
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def model_dir(kind, tmp_path_factory):
    config = make_clover_moe_config(block_length=BLOCK, **KINDS[kind])
    path = tmp_path_factory.mktemp(kind)
    return write_clover_moe_checkpoint(path, config, seed=5, init_std=0.1, diffusion=kind != "autoregressive")


@pytest.fixture(scope="module")
def expected(model_dir):
    """Per prompt length, the reference's log-distributions of PROMPT[:length]."""
    _, model = load_model(model_dir)
    return {n: reference_hybrid_prompt_log_probs(model, PROMPT[:n]) for n in (14, 12, 5, 2)}


def _llm(model_dir, **kwargs) -> LLM:
    return LLM(str(model_dir), device="cpu", **{"max_model_len": 128, "page_size": 8, **kwargs})


def _score(llm: LLM, prompt: list[int], k: int = 2):
    return llm.generate({"prompt_token_ids": prompt}, SamplingParams(prompt_logprobs=k, max_tokens=0))[0]


@pytest.mark.parametrize("budget", [4096, 9, 4], ids=["one-step", "chunked", "one-block"])
def test_prompt_logprobs_equal_the_naive_reference(model_dir, expected, budget):
    """A budget of 9 tokens commits one block and scores one variant beside it, or two variants alone."""
    llm = _llm(model_dir, max_num_batched_tokens=budget)
    for length, log_probs in expected.items():
        prompt = PROMPT[:length]
        out = _score(llm, prompt)
        assert out.outputs[0].token_ids == [] and len(out.prompt_logprobs) == length
        assert not _mismatches(out.prompt_logprobs, log_probs, prompt), length
    assert llm.engine.pool.num_free_pages == llm.engine.pool.num_pages  # scratch pages returned


def test_scoring_requests_leave_generating_requests_unchanged(model_dir, expected):
    """Greedy generation beside scoring requests (one also generates) gives the tokens it gives alone; the
    scores equal the reference's."""
    prompts = [{"prompt_token_ids": p} for p in (PROMPT[:9], PROMPT[2:13], PROMPT[:6], PROMPT, PROMPT[:12])]
    generate = SamplingParams(max_tokens=10, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in _llm(model_dir).generate(prompts[:3], generate)]
    params = [generate, generate, generate.replace(prompt_logprobs=2), SamplingParams(max_tokens=0, prompt_logprobs=1)]
    llm = _llm(model_dir, max_num_batched_tokens=24)
    mixed = llm.generate(prompts[:4], params)
    assert [o.outputs[0].token_ids for o in mixed[:3]] == alone
    assert not _mismatches(mixed[3].prompt_logprobs, expected[14], PROMPT)
    assert not _mismatches(mixed[2].prompt_logprobs, expected[14][:6], PROMPT[:6])


def test_a_scoring_request_restores_no_state_past_its_next_scored_block(model_dir, expected, monkeypatch):
    """The prefix cache holds PROMPT's state after 8 positions; PROMPT[:12] must still score blocks 0 and 1
    against the states before them (a hit covering them makes positions 1-8 wrong)."""
    llm = _llm(model_dir)
    _score(llm, PROMPT)
    assert not _mismatches(_score(llm, PROMPT[:12]).prompt_logprobs, expected[12], PROMPT[:12])
    apply_source_mutation(
        monkeypatch,
        recurrent,
        "if request.num_unscored:\n            # No state",
        "if False:\n            # No state",
    )
    mutated = _score(llm, PROMPT[:12])
    assert mutated.num_cached_tokens == 8
    assert len(_mismatches(mutated.prompt_logprobs, expected[12], PROMPT[:12])) >= 4


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        (prompt_scoring, "p % block - self.shift", "p % block"),
        (
            state_step,
            "previews.append((row, state_slot(request), -1))",
            "commits[(9, self.block_length, False)].append((row, state_slot(request), -1))",
        ),
    ],
    ids=["reads-row-p", "variant-advances-the-state"],
)
def test_broken_variants_fail_the_equality(kind, model_dir, expected, monkeypatch, module, old, new):
    if kind == "no-shift" and module is prompt_scoring:
        pytest.skip("without the AR shift the variant's own row p is the right one")
    llm = _llm(model_dir)
    assert not _mismatches(_score(llm, PROMPT).prompt_logprobs, expected[14], PROMPT)
    apply_source_mutation(monkeypatch, module, old, new)
    assert len(_mismatches(_score(llm, PROMPT).prompt_logprobs, expected[14], PROMPT)) >= 4


@pytest.mark.parametrize("mode", ["recompute", "rescan"])
def test_state_rebuilding_modes_refuse_prompt_logprobs(tmp_path, mode):
    config = make_clover_moe_config(block_length=BLOCK, num_hidden_layers=4)
    model_dir = write_clover_moe_checkpoint(tmp_path / "clover", config, seed=1)
    llm = baseline_llm(str(model_dir), mode, device="cpu", max_model_len=64)
    with pytest.raises(UnsupportedParameter, match="prompt_logprobs"):
        _score(llm, PROMPT)
    out = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(max_tokens=0))[0]
    assert out.outputs[0].token_ids == [] and out.outputs[0].finish_reason == "length"


def test_preempted_scoring_requests_score_the_same(model_dir):
    """Under a tight KV budget requests are preempted mid-scoring and resume: the scores and tokens equal an
    unconstrained run's."""
    prompts = [{"prompt_token_ids": (PROMPT * 3)[i : i + n]} for i, n in ((0, 30), (3, 21), (5, 26), (1, 17))]
    params = SamplingParams(max_tokens=8, ignore_eos=True, prompt_logprobs=1)
    free = _llm(model_dir).generate(prompts, params)
    tight = _llm(model_dir, num_pages=9, max_num_batched_tokens=16)
    got = tight.generate(prompts, params)
    assert tight.engine.stats().num_preemptions > 0
    for a, b in zip(got, free):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        tokens = a.prompt_token_ids
        assert [e and e[t].logprob for e, t in zip(a.prompt_logprobs, tokens)] == pytest.approx(
            [e and e[t].logprob for e, t in zip(b.prompt_logprobs, tokens)], abs=TOLERANCE
        )
