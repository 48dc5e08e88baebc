"""A request that asks for its finished output only (`RequestOutputKind.FINAL_ONLY`, what `LLM.generate` asks)
ends exactly as a cumulative one (tokens, text, finish reason, logprobs, every completion of n = 2, stop strings
and stop ids, with and without outputs made beside the next forward), returns nothing before it finishes, makes no
text while it runs unless a stop string may end it, keeps its time to first token, and reports its progress each
step (what the server's metrics read) as a cumulative request's outputs show it."""

from __future__ import annotations

from pathlib import Path

import pytest

from diffuserve import LLM, RequestOutputKind, SamplingParams
from diffuserve.core.outputs import RequestOutput, RequestProgress
from diffuserve.core.request import RequestStatus
from diffuserve.engine.llm_engine import LLMEngine
from tests.engine.mixed_workload import (
    assert_same,
    mixed_requests,
    run_steps,
    step_outputs,
    summary,
    tight_llm,
    write_mixed_checkpoint,
)

FINAL_ONLY = RequestOutputKind.FINAL_ONLY


def workload() -> list[tuple[int, list[int], SamplingParams]]:
    """The mixed workload, and n = 2 completions (sampled, one with stop strings that end its completions apart)."""
    two = dict(n=2, max_tokens=12, temperature=0.9, seed=5, decoder="threshold", threshold=0.5)
    return [
        *mixed_requests(),
        (2, [40, 41, 42], SamplingParams(**two)),
        (4, [43, 44, 45, 46], SamplingParams(stop=["a", "e"], **two)),
    ]


def run_all(engine: LLMEngine, requests: list[tuple[int, list[int], SamplingParams]]) -> dict[str, list[RequestOutput]]:
    """The requests run to the end (`step_outputs`) -> request id -> every output the steps returned for it."""
    outputs: dict[str, list[RequestOutput]] = {}
    for out in step_outputs(engine, requests):
        outputs.setdefault(out.request_id, []).append(out)
    return outputs


def completions(output: RequestOutput) -> list[tuple]:
    return [summary(RequestOutput(output.request_id, None, [], [c], output.metrics)) for c in output.outputs]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_mixed_checkpoint(tmp_path_factory.mktemp("kinds"))


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlapped"])
def test_final_only_requests_end_as_cumulative_ones(checkpoint: Path, overlap: bool):
    requests = workload()
    cumulative = run_all(tight_llm(checkpoint).engine, requests)
    final_llm = tight_llm(checkpoint, overlap_outputs=overlap)
    final = run_all(final_llm.engine, [(t, p, s.replace(output_kind=FINAL_ONLY)) for t, p, s in requests])
    assert final.keys() == cumulative.keys() == {str(i) for i in range(len(requests))}
    for request_id, outputs in final.items():
        (out,) = outputs  # nothing before it finished
        want = cumulative[request_id][-1]
        assert out.finished and want.finished and len(out.outputs) == len(want.outputs)
        for got_one, want_one in zip(completions(out), completions(want), strict=True):
            assert_same(got_one, want_one, request_id)
        assert [c.num_forwards for c in out.outputs] == [c.num_forwards for c in want.outputs]
        metrics = out.metrics
        assert metrics.first_token_time is not None and metrics.finished_time is not None, request_id
        assert metrics.arrival_time <= metrics.first_token_time <= metrics.finished_time, request_id
    two = [c.finish_reason for c in final["15"][0].outputs]
    assert "stop" in two and "length" in two  # a stop string ended one completion of the two, length the other
    for out in [outputs[-1] for outputs in (*final.values(), *cumulative.values())]:
        assert all(c.finish_reason == "stop" for c in out.outputs if isinstance(c.stop_reason, str))
    assert final_llm.engine.pool.usage == 0


def test_final_only_progress_is_what_cumulative_outputs_show_step_by_step(checkpoint: Path):
    """Both engines run the workload in lockstep: each step, the final-only engine reports the progress (token count,
    finished completions) of exactly the unfinished requests the cumulative engine returned an output for."""
    requests = workload()
    cumulative, final = tight_llm(checkpoint).engine, tight_llm(checkpoint).engine
    steps = zip(
        _steps(cumulative, requests),
        _steps(final, [(t, p, s.replace(output_kind=FINAL_ONLY)) for t, p, s in requests]),
        strict=True,
    )
    num_progress = 0
    for (cumulative_outputs, _), (final_outputs, progress) in steps:
        want = {
            out.request_id: RequestProgress(
                out.request_id, sum(len(c.token_ids) for c in out.outputs), [c.finish_reason for c in out.outputs]
            )
            for out in cumulative_outputs
            if not out.finished
        }
        assert {p.request_id: p for p in progress} == want
        assert [o.request_id for o in final_outputs] == [o.request_id for o in cumulative_outputs if o.finished]
        num_progress += len(progress)
    assert num_progress > 50
    assert final.take_progress() == []  # finished requests are forgotten


def test_a_completion_that_finishes_before_its_siblings_shows_in_the_progress(checkpoint: Path):
    """Even in a step that ran it alone (its sibling was not scheduled)."""
    engine = LLM(str(checkpoint), max_model_len=64).engine
    engine.add_request("two", [5, 6, 7], SamplingParams(n=2, max_tokens=8, ignore_eos=True, output_kind=FINAL_ONLY))
    engine.step()
    assert [(p.request_id, p.finish_reasons) for p in engine.take_progress()] == [("two", [None, None])]
    (first,) = engine.scheduler.finish_requests(["two#0"], RequestStatus.FINISHED_ABORTED)
    assert engine.output_processor.snapshot([first], {}) == []  # its sibling runs on: no output yet
    assert [(p.request_id, p.finish_reasons) for p in engine.take_progress()] == [("two", ["abort", None])]


def _steps(engine: LLMEngine, requests: list[tuple[int, list[int], SamplingParams]]):
    """`run_steps`, with the progress taken after each step: (the step's outputs, its progress)."""
    for outputs in run_steps(engine, requests):
        yield outputs, engine.take_progress()


class CountingTokenizer:
    """Counts decode calls of the tokenizer it wraps."""

    def __init__(self, inner: object) -> None:
        self.inner, self.calls = inner, 0

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        self.calls += 1
        return self.inner.decode(token_ids, skip_special_tokens)  # type: ignore[attr-defined]


def test_a_final_only_request_makes_text_only_when_it_finishes(checkpoint: Path):
    """Without stop strings no step decodes text but the steps that finish requests; with one, every step may."""
    engine = LLM(str(checkpoint), max_model_len=64).engine
    counting = CountingTokenizer(engine.output_processor.tokenizer)
    engine.output_processor.tokenizer = counting
    for i, prompt in enumerate(([5, 6, 7], [8, 9, 10, 11], [12, 13])):
        params = SamplingParams(max_tokens=6 + 3 * i, ignore_eos=True, output_kind=FINAL_ONLY)
        engine.add_request(str(i), prompt, params)
    finishing_steps = decoding_steps = 0
    while engine.has_unfinished_requests():
        before = counting.calls
        finished = [out for out in engine.step() if out.finished]
        finishing_steps += bool(finished)
        decoding_steps += counting.calls > before
        assert counting.calls == before or finished, "text made in a step that finished nothing"
    assert finishing_steps == decoding_steps == 3
    engine.add_request("stops", [5, 6, 7], SamplingParams(max_tokens=8, stop=["never there"], output_kind=FINAL_ONLY))
    searched = 0  # steps that made text without finishing: a stop string is searched as the text grows
    while engine.has_unfinished_requests():
        before = counting.calls
        searched += counting.calls > before if engine.step() else 0
    assert searched >= 1


def test_llm_generate_asks_the_engine_for_finished_outputs_only(checkpoint: Path):
    llm = LLM(str(checkpoint), max_model_len=64)
    returned: list[RequestOutput] = []
    step = llm.engine.step

    def recording_step() -> list[RequestOutput]:
        outputs = step()
        returned.extend(outputs)
        return outputs

    llm.engine.step = recording_step  # type: ignore[method-assign]
    outputs = llm.generate([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=8, ignore_eos=True))
    assert len(returned) == 2 and all(o.finished for o in returned)
    by_id = {o.request_id: o.outputs[0].token_ids for o in returned}
    assert [o.outputs[0].token_ids for o in outputs] == [by_id[o.request_id] for o in outputs]
