"""One owner of "finished": every way a request ends (a stop string, a stop id, the length, an abort, a failed
step) passes through the scheduler's one transition exactly once, and the output processor never reads an end
the scheduler has not made yet."""

from __future__ import annotations

import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.core.scheduler import Scheduler
from diffuserve.model.default_model import DEFAULT_MODEL_DIR
from diffuserve.text.chat_template import chat_token_ids


@pytest.fixture
def finishes(monkeypatch) -> list[tuple[str, str]]:
    """(request id, finish reason) of every call of the scheduler's one transition into a finished status."""
    calls: list[tuple[str, str]] = []
    transition = Scheduler._finish

    def recorded(self, request, status):
        calls.append((request.request_id, status.finish_reason))
        transition(self, request, status)

    monkeypatch.setattr(Scheduler, "_finish", recorded)
    return calls


def _prompt(llm: LLM) -> list[int]:
    return chat_token_ids(llm.engine.tokenizer, [{"role": "user", "content": "What is 27+15?"}])


def _chat(llm: LLM, text: str, params: SamplingParams) -> str:
    out = llm.chat([{"role": "user", "content": text}], params)
    return out.outputs[0].finish_reason


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        (SamplingParams(max_tokens=40, temperature=0.0, stop=["2"]), "stop"),  # a stop string: 27+15 answers 42
        (SamplingParams(max_tokens=40, temperature=0.0), "stop"),  # the model's stop id
        (SamplingParams(max_tokens=1, temperature=0.0), "length"),
    ],
    ids=["stop-string", "stop-id", "length"],
)
def test_each_end_passes_through_the_scheduler_once(finishes, params, reason):
    llm = LLM(str(DEFAULT_MODEL_DIR))
    assert _chat(llm, "What is 27+15?", params) == reason
    assert [r for _, r in finishes] == [reason]


def test_an_abort_passes_through_the_scheduler(finishes):
    llm = LLM(str(DEFAULT_MODEL_DIR))
    llm.engine.add_request("a", _prompt(llm), SamplingParams(max_tokens=200, ignore_eos=True))
    llm.engine.step()
    llm.engine.abort_request("a")
    assert finishes == [("a", "abort")]
    assert not llm.engine.has_unfinished_requests()


def test_the_output_shows_no_stop_before_the_scheduler_made_it(monkeypatch):
    """With the finishing call disabled, a stop string reached is not reported as an end by anyone else."""
    llm = LLM(str(DEFAULT_MODEL_DIR))
    monkeypatch.setattr(llm.engine, "_finish_requests", lambda ids, status, error=None: None)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, stop=["4"])
    assert _chat(LLM(str(DEFAULT_MODEL_DIR)), "What is 27+15?", params) == "stop"  # it does reach the stop string
    llm.engine.add_request("a", _prompt(llm), params)
    seen = []
    while llm.engine.has_unfinished_requests():
        seen += [o.outputs[0].finish_reason for o in llm.engine.step()]
    assert "stop" not in seen  # only the scheduler could have said it, and it was never asked
    assert seen[-1] == "length"
