"""Prompt scoring (`prompt_logprobs`): the engine's batched variants equal the block chain rule computed by the
naive reference (one dense forward per scored position, reference/reference_scoring.py), on sdar and LLaDA2 at
block 4, whole and in chunks; top alternatives are sorted with ranks consistent with the full distribution;
scoring requests in a batch leave the other requests' tokens unchanged; max_tokens 0 only scores. Mutations of
the variants' masking (the scored token revealed, variants seeing each other) make the equality fail."""

from __future__ import annotations

import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.reference.reference_model import load_reference
from diffuserve.reference.reference_scoring import reference_prompt_log_probs
from diffuserve.worker import prompt_scoring
from tests.engine.test_oracle_mutations import apply_source_mutation

BLOCK = 4
PROMPT = [7, 42, 99, 3, 15, 200, 61, 61, 8, 120, 33, 250, 5, 77]
"""14 tokens: three whole blocks of 4 and a tail of 2."""
TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=["sdar", "llada2"])
def model_dir(request, tiny_model_dir, tiny_llada2_dir):
    return {"sdar": tiny_model_dir, "llada2": tiny_llada2_dir}[request.param]


@pytest.fixture(scope="module")
def reference(model_dir):
    return load_reference(model_dir, block_length=BLOCK, max_model_len=128)


def _llm(model_dir, **kwargs) -> LLM:
    options = {"device": "cpu", "max_model_len": 128, "block_length": BLOCK, "page_size": 8, "num_pages": 256, **kwargs}
    return LLM(str(model_dir), **options)


def _score(llm: LLM, prompt: list[int], k: int = 3, **params):
    return llm.generate({"prompt_token_ids": prompt}, SamplingParams(prompt_logprobs=k, max_tokens=0, **params))[0]


def _mismatches(scores, reference_log_probs, prompt: list[int]) -> list[int]:
    """Positions whose prompt token's logprob differs from the reference's."""
    bad = []
    for p, (entry, log_probs) in enumerate(zip(scores, reference_log_probs)):
        if log_probs is None:
            assert entry is None
        elif abs(entry[prompt[p]].logprob - float(log_probs[prompt[p]])) > TOLERANCE:
            bad.append(p)
    return bad


@pytest.mark.parametrize("budget", [4096, 9], ids=["one-step", "chunked"])
@pytest.mark.parametrize("length", [14, 12, 3], ids=["tail", "whole-blocks", "one-block"])
def test_prompt_logprobs_equal_the_naive_chain_rule(model_dir, reference, budget, length):
    """A budget of 9 tokens scores two variants per step beside a one-block prefill chunk."""
    prompt = PROMPT[:length]
    out = _score(_llm(model_dir, max_num_batched_tokens=budget), prompt)
    assert out.outputs[0].token_ids == [] and out.outputs[0].finish_reason == "length"
    assert len(out.prompt_logprobs) == length
    assert not _mismatches(out.prompt_logprobs, reference_prompt_log_probs(reference, prompt), prompt)


def test_top_alternatives_are_sorted_with_ranks_of_the_whole_distribution(model_dir, reference):
    out = _score(_llm(model_dir), PROMPT, k=5)
    for p, (entry, log_probs) in enumerate(zip(out.prompt_logprobs, reference_prompt_log_probs(reference, PROMPT))):
        if p == 0:
            continue
        token = PROMPT[p]
        assert next(iter(entry)) == token  # the prompt token first, then the alternatives by rank
        alternatives = [lp.logprob for lp in list(entry.values())[1:]]
        assert alternatives == sorted(alternatives, reverse=True)
        top = {t for t, lp in entry.items() if t != token or lp.rank <= 5}
        assert top == set(log_probs.topk(5).indices.tolist())
        for t, lp in entry.items():
            assert lp.rank == 1 + int((log_probs > log_probs[t]).sum())
            assert lp.logprob == pytest.approx(float(log_probs[t]), abs=TOLERANCE)
            assert lp.decoded_token is not None


def test_scoring_requests_leave_generating_requests_unchanged(model_dir):
    """Greedy generation with scoring requests in the same steps (and one that scores and generates) gives the
    tokens it gives alone; the scoring is the same as alone."""
    prompts = [{"prompt_token_ids": p} for p in (PROMPT[:9], PROMPT[2:13], PROMPT[:6], PROMPT, PROMPT[:11])]
    generate = SamplingParams(max_tokens=10, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in _llm(model_dir).generate(prompts[:3], generate)]
    scoring = [SamplingParams(max_tokens=0, prompt_logprobs=k) for k in (2, 1)]
    params = [generate, generate, generate.replace(prompt_logprobs=2), *scoring]
    mixed = _llm(model_dir, max_num_batched_tokens=24).generate(prompts, params)
    assert [o.outputs[0].token_ids for o in mixed[:3]] == alone
    scored = _score(_llm(model_dir), PROMPT, k=2).prompt_logprobs
    assert [e and e[t].logprob for e, t in zip(mixed[3].prompt_logprobs, PROMPT)] == pytest.approx(
        [e and e[t].logprob for e, t in zip(scored, PROMPT)], abs=TOLERANCE
    )
    assert mixed[2].prompt_logprobs is not None and mixed[0].prompt_logprobs is None


def test_cached_prefix_and_n_completions_score_the_same(model_dir, reference):
    """A prompt scored after another with the same prefix (its pages come from the prefix cache), and with n=3
    (scored once, by the first completion), gives the reference scores."""
    llm = _llm(model_dir)
    _score(llm, PROMPT[:12])
    again = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(n=3, prompt_logprobs=1, max_tokens=4))[0]
    assert again.num_cached_tokens >= 8 and len(again.outputs) == 3
    assert not _mismatches(again.prompt_logprobs, reference_prompt_log_probs(reference, PROMPT), PROMPT)


def test_max_tokens_zero_without_scoring_computes_nothing(tiny_model_dir):
    llm = _llm(tiny_model_dir)
    out = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(max_tokens=0))[0]
    assert out.outputs[0].token_ids == [] and out.outputs[0].finish_reason == "length"
    assert out.prompt_logprobs is None and llm.engine.stats().num_steps == 0  # no forward ran
    single = _score(llm, PROMPT[:1])
    assert single.prompt_logprobs == [None]
    assert llm.engine.pool.num_free_pages == llm.engine.pool.num_pages  # scratch pages returned


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("block_length * block_length : position]", "block_length * block_length : position + 1]"),
        ("own = variant_of[:, None] == variant_of[None, :]", "own = variant_of[:, None] >= variant_of[None, :]"),
    ],
    ids=["scored-token-revealed", "variants-see-each-other"],
)
def test_broken_variant_masking_fails_the_equality(tiny_model_dir, monkeypatch, old, new):
    reference = load_reference(tiny_model_dir, block_length=BLOCK, max_model_len=128)
    expected = reference_prompt_log_probs(reference, PROMPT)
    llm = _llm(tiny_model_dir)
    assert not _mismatches(_score(llm, PROMPT).prompt_logprobs, expected, PROMPT)
    apply_source_mutation(monkeypatch, prompt_scoring, old, new)
    assert len(_mismatches(_score(llm, PROMPT).prompt_logprobs, expected, PROMPT)) >= 4


def test_prompt_logprobs_is_validated():
    for bad in (-1, 21, 2.0, True):
        with pytest.raises(ValueError, match="prompt_logprobs"):
            SamplingParams(prompt_logprobs=bad)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=-1)
    assert SamplingParams(max_tokens=0, prompt_logprobs=20).prompt_logprobs == 20
