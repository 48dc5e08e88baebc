"""The denoising stream under decoder=verified (what the web console's denoising view draws): each causal check
of a drafted block is an entry with `check`, naming the drafts kept, the drafts rejected and where the causal
token went. Checked against what is known by other means: verified decoding's answer is the model's greedy
causal one (checked with one forward of the model itself), so a kept draft is the answer's token and the first
rejected draft is not; the checks' counts add up to /metrics' speculative counters; and replaying every write,
checks included, spells the streamed text. The bundled model drafts well but not perfectly on a sorting prompt
longer than it was trained on, so both kept and rejected drafts occur.

Mutation (by hand): recording a check with no rejected drafts fails test_checks_name_kept_and_rejected_drafts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from diffuserve.model.default_model import DEFAULT_MODEL_DIR
from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.loader import load_model
from diffuserve.server.config import ServerConfig
from diffuserve.text.chat_template import chat_token_ids
from diffuserve.text.tokenizer import Tokenizer
from tests.server.conftest import LiveServer, sse_events

PROMPT = chat_token_ids(Tokenizer(DEFAULT_MODEL_DIR), [{"role": "user", "content": "Sort 8 2 6 4 9 1 3 5 7"}])


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return Path(DEFAULT_MODEL_DIR)


@pytest.fixture(scope="module")
def server(model_dir: Path, single_threaded_torch: None):
    live = LiveServer(model_dir, ServerConfig(served_model_name="v"), max_num_seqs=4, max_model_len=128).start()
    yield live
    live.stop()


def _body(decoder: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "v",
        "prompt": PROMPT,
        "max_tokens": 10,  # "1 2 3 5 7 ": the answer before its end-of-text token
        "temperature": 0,
        "threshold": 0.5,
        "decoder": decoder,
        **extra,
    }


def _steps(server: LiveServer) -> tuple[list[dict[str, Any]], list[int]]:
    """The verified request's denoising entries and its answer's token ids (the trace's last writes, checked to
    spell the streamed text)."""
    body = _body("verified", stream=True, stream_options={"include_usage": True, "include_denoising": True})
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        events = [e for e in sse_events(response) if isinstance(e, dict)]
    steps = [step for e in events for step in e.get("denoising", [])]
    final: dict[int, int] = {}
    for step in steps:
        final.update(zip(step["positions"], step["token_ids"]))
    answer = [final[p] for p in range(events[-1]["usage"]["completion_tokens"])]
    text = "".join(c["text"] for e in events for c in e["choices"])
    assert server.post("/detokenize", {"tokens": answer}).json()["prompt"] == text
    return steps, answer


def _greedy_causal(model_dir: Path, answer: list[int]) -> list[int]:
    """The model's causal path's greedy choice at each answer position, given the answer before it: one forward of
    the model itself (no engine code), its row before each position predicting it."""
    model = load_model(model_dir)[1]
    with torch.no_grad():
        hidden, _ = DenseClover(model).forward_causal(torch.tensor([PROMPT + answer[:-1]]))
        rows = model.compute_logits(hidden[0, len(PROMPT) - 1 :])
    return rows.argmax(dim=-1).tolist()


def test_checks_name_kept_and_rejected_drafts(server: LiveServer, model_dir: Path):
    drafts_before = server.metric("spec_decode_num_draft_tokens_total")
    accepted_before = server.metric("spec_decode_num_accepted_tokens_total")
    steps, answer = _steps(server)
    assert answer == _greedy_causal(model_dir, answer)  # verified decoding is greedy AR: the answer judges drafts
    checks = [s for s in steps if s["check"] is not None]
    assert any(s["check"]["rejected_positions"] for s in checks)  # random weights: some drafts rejected
    assert any(s["check"]["accepted_positions"] for s in checks)  # and some kept
    written: dict[int, int] = {}  # position -> the token the trace wrote there last (drafts, then checks)
    for step in steps:
        check = step["check"]
        if check is not None:
            kept, rejected = check["accepted_positions"], check["rejected_positions"]
            judged = kept + rejected
            assert judged == list(range(judged[0], judged[-1] + 1))
            assert all(step["block_start"] <= p < step["block_end"] for p in judged)
            # the drafts it judged are those the drafting steps wrote; kept ones are the answer's tokens
            assert [written[p] for p in rejected] == check["rejected_token_ids"]
            assert [written[p] for p in kept] == [answer[p] for p in kept]
            if rejected:
                first = rejected[0]
                assert check["causal_position"] == first and check["rejected_token_ids"][0] != answer[first]
                assert step["positions"] == [*kept, first] and step["token_ids"][-1] == answer[first]
            else:
                assert check["causal_position"] is None and step["positions"] == kept
        written.update(zip(step["positions"], step["token_ids"]))
    # the trace's checks are the engine's: /metrics counted the same drafted and kept tokens
    judged_total = sum(len(s["check"]["accepted_positions"]) + len(s["check"]["rejected_positions"]) for s in checks)
    kept_total = sum(len(s["check"]["accepted_positions"]) for s in checks)
    server.wait_for(lambda: server.metric("spec_decode_num_draft_tokens_total") - drafts_before == judged_total)
    assert server.metric("spec_decode_num_accepted_tokens_total") - accepted_before == kept_total


def test_other_decoders_have_no_checks(server: LiveServer):
    body = _body("threshold", stream=True, stream_options={"include_denoising": True})
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as response:
        steps = [s for e in sse_events(response) if isinstance(e, dict) for s in e.get("denoising", [])]
    assert steps and all(s["check"] is None for s in steps)


def test_auto_steps_are_counted_by_mode(model_dir: Path, single_threaded_torch: None):
    """--auto-draft-tokens 8 at block 4: one auto request drafts, three at once decide one token each; /metrics
    counts the steps of each mode, and the replies are the same either way."""
    live = LiveServer(model_dir, ServerConfig(served_model_name="v"), max_num_seqs=4, auto_draft_tokens=8).start()
    try:
        alone = live.post("/v1/completions", _body("auto")).json()["choices"][0]["text"]
        assert live.metric("auto_decoding_steps_total", mode="verified") > 0
        assert live.metric("auto_decoding_steps_total", mode="autoregressive") == 0
        body = {**_body("auto"), "n": 3}
        texts = {c["text"] for c in live.post("/v1/completions", body).json()["choices"]}
        assert texts == {alone}
        assert live.metric("auto_decoding_steps_total", mode="autoregressive") > 0
    finally:
        live.stop()
