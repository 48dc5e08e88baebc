"""Serving metric math on synthetic event timings, worked by hand.

Request A: sent at 0.0; content chunks at 1.0, 1.5, 2.5 s carrying 4, 4, 2 tokens (running usage 4, 8, 10);
stream done at 2.6 s.
    TTFT = 1.0; E2E = 2.6; TPOT = (2.6 - 1.0) / (10 - 1) = 0.17778
    ITL per chunk = [0.5, 1.0]; ITL per token = 0.5 / 4 for each of 4 tokens, 1.0 / 2 for each of 2 tokens
Request B: sent at 0.5; one chunk of 3 tokens at 2.5; done at 2.7: TTFT 2.0, E2E 2.2, TPOT 0.1, no ITL.
Request C: sent at 0.2, failed.
Duration = 2.7 - 0.0; output tokens 13 -> 4.8148 tokens/s; 2 completed -> 0.7407 requests/s.
"""

from __future__ import annotations

import pytest

from diffuserve.bench.serve import TURN_SEPARATOR, arrival_offsets, as_conversations, chat_messages
from diffuserve.bench.serve_metrics import RequestTrace, meets_slos, parse_slos, summarize


def trace_a(usage: bool = True) -> RequestTrace:
    return RequestTrace(
        sent_at=0.0,
        chunk_times=[1.0, 1.5, 2.5],
        chunk_chars=[8, 8, 4],
        chunk_usage_tokens=[4, 8, 10] if usage else [None, None, None],
        done_at=2.6,
        output_tokens=10,
        prompt_tokens=7,
    )


def trace_b() -> RequestTrace:
    return RequestTrace(
        sent_at=0.5,
        chunk_times=[2.5],
        chunk_chars=[5],
        chunk_usage_tokens=[3],
        done_at=2.7,
        output_tokens=3,
        prompt_tokens=7,
    )


@pytest.mark.parametrize("usage", [True, False])
def test_request_metrics(usage):
    a = trace_a(usage)
    assert a.ttft() == 1.0 and a.e2e() == 2.6
    assert a.tpot() == pytest.approx(1.6 / 9)
    assert a.itl_chunks() == [0.5, 1.0]
    assert a.chunk_tokens() == [4, 4, 2]  # from running usage, or characters pro rata (8:8:4 of 10 tokens)
    assert a.itl_tokens() == [0.125] * 4 + [0.5] * 2
    assert a.tokens_exact is usage


def test_summary_counts_errors_and_goodput():
    failed = RequestTrace(sent_at=0.2, error="HTTP 500: boom")
    summary = summarize([trace_a(), trace_b(), failed], parse_slos(["ttft:1500", "tpot:200"]))
    assert (summary["completed"], summary["errors"]) == (2, 1)
    assert summary["error_examples"] == ["HTTP 500: boom"]
    assert summary["duration_s"] == pytest.approx(2.7)
    assert summary["output_tokens"] == 13
    assert summary["output_tokens_per_s"] == pytest.approx(13 / 2.7)
    assert summary["request_throughput"] == pytest.approx(2 / 2.7)
    assert summary["goodput_requests_per_s"] == pytest.approx(1 / 2.7)  # B misses TTFT 1.5 s
    assert summary["goodput_fraction"] == pytest.approx(1 / 3)
    assert summary["ttft_s"]["p50"] == pytest.approx(1.5) and summary["ttft_s"]["max"] == 2.0
    assert summary["itl_chunk_s"]["mean"] == pytest.approx(0.75)
    assert summary["itl_token_s"]["mean"] == pytest.approx((4 * 0.125 + 2 * 0.5) / 6)
    assert summary["tokens_per_chunk"] == pytest.approx(13 / 4)
    assert summary["chunk_token_counts"] == "usage"


def test_slos():
    assert parse_slos(["ttft:300", "e2e:2000", "itl:50"]) == {"ttft": 0.3, "e2e": 2.0, "itl": 0.05}
    assert meets_slos(trace_a(), {"itl": 0.5}) and not meets_slos(trace_a(), {"itl": 0.4})
    for bad in ("ttft", "speed:3", "ttft:abc", "ttft:0"):
        with pytest.raises(ValueError, match="goodput"):
            parse_slos([bad])


def test_arrivals():
    assert arrival_offsets(3, float("inf"), False, 0) == [0.0, 0.0, 0.0]
    assert arrival_offsets(3, 4.0, True, 0) == [0.0, 0.25, 0.5]
    poisson = arrival_offsets(2000, 10.0, False, 0)
    assert poisson == arrival_offsets(2000, 10.0, False, 0)  # seeded
    assert poisson[-1] / 1999 == pytest.approx(0.1, rel=0.1)  # mean gap 1 / rate


def test_prefix_hit_rate_is_cached_over_prompt_tokens():
    a, b = trace_a(), trace_a()
    a.cached_tokens, b.cached_tokens, b.prompt_tokens = 0, 6, 9  # (0 + 6) / (7 + 9)
    assert summarize([a, b], {})["prefix_hit_rate"] == pytest.approx(6 / 16)
    assert summarize([trace_a()], {})["prefix_hit_rate"] is None  # a server that reports no cached tokens


def test_conversations_resend_their_history():
    prompts = as_conversations(["p0", "p1", "p2", "p3", "p4"], 6, 2, seed=3)
    turns = [p.split(TURN_SEPARATOR) for p in prompts]
    assert turns[0][0] == turns[2][0] == turns[4][0] != turns[1][0] == turns[3][0] and len(turns[0][0].split()) == 6
    assert [t[1:] for t in turns] == [["p0"], ["p1"], ["p0", "p2"], ["p1", "p3"], ["p0", "p2", "p4"]]
    assert as_conversations(["p0"], 0, 8, seed=3) == ["p0"]
    assert [m["role"] for m in chat_messages(prompts[4])] == ["user", "assistant"] * 3 + ["user"]
    assert chat_messages(prompts[4])[-1]["content"] == "p4" and chat_messages("one") == [
        {"role": "user", "content": "one"}
    ]
