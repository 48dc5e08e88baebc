"""The engine's batching against one-request-at-a-time runs: same tokens at temperature 0 and with seeded
sampling, under preemption, with prefix reuse and chunked prefill; and nothing leaks."""

from __future__ import annotations

import pytest

from diffuserve import LLM, SamplingParams


def _prompts(n: int) -> list[list[int]]:
    return [[(i * 37 + j * 11) % 250 + 1 for j in range(3 + (i * 13) % 45)] for i in range(n)]


def _params(n: int, temperature: float) -> list[SamplingParams]:
    return [
        SamplingParams(
            max_tokens=6 + (i * 5) % 30,
            threshold=(0.5, 0.7, 0.9, 0.99)[i % 4],
            temperature=temperature,
            seed=1000 + i,
            decoder=("threshold", "fixed", "entropy")[i % 3],
            steps=2,
        )
        for i in range(n)
    ]


def _run(llm: LLM, prompts, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]


def _one_at_a_time(llm: LLM, prompts, params) -> list[list[int]]:
    return [_run(llm, [p], [q])[0] for p, q in zip(prompts, params)]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batched_equals_sequential(tiny_model_dir, temperature):
    prompts, params = _prompts(18), _params(18, temperature)
    llm = LLM(str(tiny_model_dir), num_pages=512, max_num_seqs=32)
    batched = _run(llm, prompts, params)
    assert batched == _one_at_a_time(llm, prompts, params)
    assert llm.engine.pool.num_free_pages == llm.engine.pool.num_pages  # no leak (cached pages count as free)
    llm.engine.pool.check_invariants()


def test_tiny_page_budget_preempts_and_still_gives_the_same_tokens(tiny_model_dir):
    prompts = [[(i * 7 + j) % 250 + 1 for j in range(30 + i % 7)] for i in range(32)]
    params = [SamplingParams(max_tokens=24, ignore_eos=True, threshold=0.7) for _ in prompts]
    roomy = LLM(str(tiny_model_dir), num_pages=1024, max_num_seqs=32)
    expected = _run(roomy, prompts, params)
    # pages of 16 tokens: one request needs at most ceil((36 + 24) / 16) = 4 pages; 12 pages hold 3 at once
    tight = LLM(str(tiny_model_dir), num_pages=12, max_num_seqs=32, enable_prefix_caching=False)
    assert _run(tight, prompts, params) == expected
    assert tight.engine.stats().num_preemptions > 0
    assert tight.engine.pool.num_free_pages == 12


def test_shared_prefix_is_computed_once(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), num_pages=256, page_size=16)
    shared = [(j * 3) % 250 + 1 for j in range(70)]
    first = llm.generate({"prompt_token_ids": [*shared, 5, 6]}, SamplingParams(max_tokens=8))[0]
    before = llm.engine.stats()
    second = llm.generate({"prompt_token_ids": [*shared, 9, 9, 9]}, SamplingParams(max_tokens=8))[0]
    after = llm.engine.stats()
    # prompt 73: its complete blocks end at 72; the 4 full pages (64 tokens) of the shared prefix are reused
    assert second.num_cached_tokens == 64
    assert after.num_prefill_tokens - before.num_prefill_tokens == 72 - 64
    assert first.num_cached_tokens == 0


def test_prompt_longer_than_the_token_budget_is_chunked(tiny_model_dir):
    prompt = [(j * 5) % 250 + 1 for j in range(150)]
    params = SamplingParams(max_tokens=12, threshold=0.6)
    whole = _run(LLM(str(tiny_model_dir), num_pages=256), [prompt], [params])
    chunked_llm = LLM(str(tiny_model_dir), num_pages=256, max_num_batched_tokens=16)
    assert _run(chunked_llm, [prompt], [params]) == whole
    assert chunked_llm.engine.stats().num_steps > 150 // 16


def test_abort_frees_pages(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), num_pages=64, enable_prefix_caching=False)
    engine = llm.engine
    engine.add_request("a", list(range(1, 40)), SamplingParams(max_tokens=100, ignore_eos=True))
    engine.step()
    assert engine.pool.num_free_pages < 64
    engine.abort_request("a")
    assert engine.pool.num_free_pages == 64 and not engine.has_unfinished_requests()


def test_a_stop_string_finishes_the_request_through_the_scheduler(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), num_pages=64, enable_prefix_caching=False)
    free = llm.generate("abc", SamplingParams(max_tokens=24, ignore_eos=True))[0].outputs[0]
    text = free.text
    stop = next(
        text[i : i + 2]
        for i in range(len(text) // 3, len(text) - 1)
        if "\ufffd" not in text[i : i + 2] and text[i : i + 2].strip()
    )
    out = llm.generate("abc", SamplingParams(max_tokens=24, ignore_eos=True, stop=[stop]))[0].outputs[0]
    assert (out.text, out.finish_reason, out.stop_reason) == (text[: text.find(stop)], "stop", stop)
    engine = llm.engine
    assert not engine.scheduler.requests and engine.pool.num_free_pages == 64
