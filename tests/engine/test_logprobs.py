"""Output-token logprobs (SamplingParams.logprobs) against the naive recompute reference, which computes them
from the model's logits on its own: for every token, the logprob, rank and top alternatives under the
distribution the decoder accepted it from (greedy; sampled with temperature and top-k; the edit decoder, where
the step that last wrote a token counts), plus the grammar mask of structured output, the hybrid runners, the
hold-back of tokens whose text is not shown yet, and that asking for logprobs changes no token of anyone."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.bench.baselines.engines import baseline_llm
from diffuserve.core.outputs import CompletionOutput, Logprob
from diffuserve.core.request import Request
from diffuserve.engine.completion import Completion
from diffuserve.errors import RequestError
from diffuserve.reference.llada2_checkpoint import write_llada2_checkpoint
from diffuserve.reference.reference_decode import reference_generate
from diffuserve.reference.reference_model import ReferenceModel, load_reference
from diffuserve.sampling_params import MAX_LOGPROBS
from diffuserve.structured_outputs import StructuredOutputsParams

TOLERANCE = 1e-4
"""fp32 on CPU: the engine's cached forward and the reference's recompute differ by ~1e-6 in the logits."""
PROMPTS = [[(s * 131 + i * 17) % 250 + 1 for i in range(n)] for s, n in enumerate([1, 5, 8, 13])]
CASES = {
    "greedy-threshold": ("sdar", SamplingParams(threshold=0.7, logprobs=5)),
    "greedy-fixed": ("sdar", SamplingParams(decoder="fixed", steps=2, logprobs=0)),
    "sampled-top-k": ("sdar", SamplingParams(temperature=0.8, top_k=6, logprobs=MAX_LOGPROBS)),
    "sampled-top-p": ("sdar", SamplingParams(temperature=1.0, top_p=0.8, decoder="entropy", logprobs=3)),
    "edit": ("llada2", SamplingParams(decoder="edit", threshold=0.7, max_post_edit_steps=4, logprobs=4)),
}


@pytest.fixture(scope="module")
def model_dirs(tiny_model_dir: Path, tmp_path_factory) -> dict[str, Path]:
    """The block-4 sdar-moe-tiny, and a tiny LLaDA2 (block 8) whose blocks really get edited."""
    llada2 = write_llada2_checkpoint(tmp_path_factory.mktemp("logprobs") / "llada2", seed=2, logit_scale=40.0)
    return {"sdar": tiny_model_dir, "llada2": llada2}


def _block(family: str) -> dict[str, int]:
    return {"block_length": 8} if family == "llada2" else {}


@pytest.mark.parametrize("case", list(CASES))
def test_logprobs_equal_the_reference_computed_from_the_logits(model_dirs, case):
    """Free-running, then cut by stop ids taken from the middle of each answer."""
    family, base = CASES[case]
    llm = LLM(str(model_dirs[family]), num_pages=256, max_num_seqs=8, **_block(family))
    reference = load_reference(model_dirs[family], **_block(family))
    params = [base.replace(max_tokens=6 + 5 * i, ignore_eos=True, seed=7 + i) for i in range(len(PROMPTS))]
    answers, edits = _check_against_reference(llm, reference, params)
    assert edits > 0 or family != "llada2"  # the edit case really rewrote tokens
    stops = [p.replace(stop_token_ids=[a[len(a) // 2]], ignore_eos=False) for p, a in zip(params, answers)]
    stopped, _ = _check_against_reference(llm, reference, stops)
    assert sum(len(s) < len(a) for s, a in zip(stopped, answers)) >= 2


def _check_against_reference(
    llm: LLM, reference: ReferenceModel, params: list[SamplingParams]
) -> tuple[list[list[int]], int]:
    """Asserts every output's tokens and logprobs equal the reference's; returns the answers and the edits."""
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    answers, edits = [], 0
    for prompt, p, out in zip(PROMPTS, params, outputs):
        completion = out.outputs[0]
        expected = reference_generate(reference, prompt, p, _generator(p))
        assert completion.token_ids == expected.token_ids
        assert completion.logprobs is not None and expected.logprobs is not None
        assert len(completion.logprobs) == len(completion.token_ids)
        for token, entry, ref in zip(completion.token_ids, completion.logprobs, expected.logprobs):
            assert math.isclose(entry[token].logprob, ref.logprob, abs_tol=TOLERANCE)
            assert entry[token].rank == ref.rank
            alternatives = {t: lp for t, lp in entry.items() if t in ref.top or t != token}
            assert alternatives.keys() == ref.top.keys()
            assert all(math.isclose(lp.logprob, ref.top[t], abs_tol=TOLERANCE) for t, lp in alternatives.items())
            assert all(lp.decoded_token == llm.engine.tokenizer.decode([t], False) for t, lp in entry.items())
        answers.append(completion.token_ids)
        edits += expected.num_edits
    return answers, edits


def _generator(params: SamplingParams) -> torch.Generator | None:
    return None if params.temperature in (None, 0.0) else torch.Generator().manual_seed(params.seed)


def test_alternatives_are_ranked_and_sampled_ones_form_the_filtered_distribution(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), num_pages=256, max_num_seqs=8)
    greedy = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=3)
    sampled = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.8, top_k=4, seed=3, logprobs=10)
    for params in (greedy, sampled):
        completion = llm.generate({"prompt_token_ids": PROMPTS[2]}, params)[0].outputs[0]
        assert completion.logprobs is not None
        for token, entry in zip(completion.token_ids, completion.logprobs):
            top = sorted(entry.values(), key=lambda lp: lp.rank)
            assert [lp.logprob for lp in top] == sorted((lp.logprob for lp in top), reverse=True)
            assert all(lp.rank == 1 + sum(o.logprob > lp.logprob for o in top) for lp in top)
            if params is greedy:
                assert entry[token].rank == 1 and entry[token].logprob == top[0].logprob
            else:  # top_k 4 under logprobs 10: the alternatives are the whole support, and it sums to 1
                assert len(entry) == 4 and token in entry
                assert math.isclose(sum(math.exp(lp.logprob) for lp in entry.values()), 1.0, abs_tol=1e-5)


def test_asking_for_logprobs_changes_no_token(tiny_model_dir):
    """Requests without logprobs decode the same tokens (and get no logprobs) beside ones that ask, greedy or
    seeded; the ones that ask get the tokens they would without."""
    llm = LLM(str(tiny_model_dir), num_pages=256, max_num_seqs=8)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    plain = [
        SamplingParams(max_tokens=10, ignore_eos=True, **({"temperature": 0.9, "seed": i} if i % 2 else {}))
        for i in range(len(PROMPTS))
    ]
    alone = [o.outputs[0] for o in llm.generate(prompts, plain)]
    mixed_params = [p.replace(logprobs=2) if i < 2 else p for i, p in enumerate(plain)]
    mixed = [o.outputs[0] for o in llm.generate(prompts, mixed_params)]
    assert [c.token_ids for c in mixed] == [c.token_ids for c in alone]
    assert [c.logprobs is None for c in mixed] == [False, False, True, True]


def test_structured_output_logprobs_are_under_the_grammar_mask(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), num_pages=256, max_num_seqs=8)
    spec = StructuredOutputsParams(regex=r"[ab]{6}")
    params = SamplingParams(max_tokens=8, structured_outputs=spec, logprobs=MAX_LOGPROBS)
    completion = llm.generate("hello", params)[0].outputs[0]
    assert re.fullmatch("[ab]{6}", completion.text[:6]) and completion.logprobs is not None
    for token, entry in zip(completion.token_ids[:6], completion.logprobs):
        assert {lp.decoded_token for lp in entry.values()} <= {"a", "b"} and token in entry
        assert math.isclose(sum(math.exp(lp.logprob) for lp in entry.values()), 1.0, abs_tol=1e-5)


def test_hybrid_runners_give_the_same_logprobs(tmp_path):
    """clover_moe: the state-pool runner and the recompute runner (the AR checkpoint's next-token path too)."""
    from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint

    params = SamplingParams(max_tokens=7, ignore_eos=True, threshold=0.5, logprobs=2)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS[:3]]
    for diffusion in (True, False):
        config = make_clover_moe_config(block_length=4)
        model_dir = write_clover_moe_checkpoint(
            tmp_path / str(diffusion), config, seed=12, init_std=0.1, logit_scale=20.0, diffusion=diffusion
        )
        runs = [
            [o.outputs[0] for o in llm.generate(prompts, params)]
            for llm in (
                LLM(str(model_dir), device="cpu", max_model_len=256),
                baseline_llm(str(model_dir), "recompute", device="cpu", max_model_len=256),
            )
        ]
        for kept, recomputed in zip(*runs):
            assert kept.token_ids == recomputed.token_ids and kept.logprobs is not None
            assert recomputed.logprobs is not None and len(kept.logprobs) == len(kept.token_ids)
            for token, a, b in zip(kept.token_ids, kept.logprobs, recomputed.logprobs):
                assert a.keys() == b.keys() and a[token].rank == 1
                assert all(math.isclose(a[t].logprob, b[t].logprob, abs_tol=TOLERANCE) for t in a)


def test_a_request_keeps_the_logprobs_of_the_latest_write_and_cuts_them_with_its_tokens():
    mask = 99
    params = SamplingParams(max_tokens=12, stop_token_ids=[50], logprobs=0).with_defaults({})
    request = Request("r", [1, 2], params, 4, mask)  # canvas [1, 2, MASK, MASK]
    entry = {t: {t: Logprob(-float(t), 1)} for t in (5, 6, 7, 50)}
    request.apply_step([(2, 5), (3, 6)], [entry[5], entry[6]])
    request.apply_step([(3, 7)], [entry[7]])  # a rewrite (decoder=edit) replaces its logprobs
    request.finish_block()
    assert request.output_logprobs == [entry[5], entry[7]]
    request.apply_step([(0, 50), (1, 6)], [entry[50], entry[6]])  # the stop id, and a token after it
    stop = request.stop_check()
    assert stop is not None
    request.apply_stop(stop)
    assert request.output_token_ids == [5, 7, 50] and request.output_logprobs == [entry[5], entry[7], entry[50]]


class _Chars:
    """A tokenizer whose token i is the i-th string of `vocab`."""

    def __init__(self, vocab: list[str]) -> None:
        self.vocab = vocab

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.vocab[t] for t in token_ids)


def test_logprobs_of_held_back_text_follow_it():
    """A suffix that may grow into a stop string is held back, and so are the logprobs of its tokens; the
    tokens of the stop string itself come with the final output, one per token."""
    tokenizer = _Chars(["he", "llo", " w", "or", "ld", "!"])
    params = SamplingParams(stop=[" wor"], logprobs=0).with_defaults({}, max_tokens_limit=16)
    completion = Completion(0, params)
    logprobs = [{t: Logprob(-0.1 * t, 1)} for t in range(6)]

    def step(tokens: list[int], finished: bool = False) -> tuple[bool, CompletionOutput]:
        hit = completion.update(tokenizer, tokens, finished)
        completion.show_logprobs(logprobs[: len(tokens)], lambda t: tokenizer.vocab[t])
        return hit, completion.output

    hit, out = step([0, 1, 2])
    assert not hit and out.text == "hello" and out.logprobs is not None and len(out.logprobs) == 2
    assert [lp[t].decoded_token for t, lp in zip(out.token_ids, out.logprobs)] == ["he", "llo"]
    hit, out = step([0, 1, 2, 3, 4])
    assert hit and out.text == "hello" and out.token_ids == [0, 1, 2, 3] and len(out.logprobs or ()) == 4


@pytest.mark.parametrize("value", [-1, MAX_LOGPROBS + 1, True, 2.0])
def test_logprobs_out_of_range_is_a_named_error(value):
    with pytest.raises(RequestError, match=rf"^logprobs: got {value!r}, must be an integer in \[0, {MAX_LOGPROBS}\]"):
        SamplingParams(logprobs=value)
