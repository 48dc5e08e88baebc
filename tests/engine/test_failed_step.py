"""A step that fails inside the engine is an error the offline caller sees: `LLM.generate` and `LLM.chat` raise
`GenerationFailed`, naming the request and the cause, once the call's other requests finished (their outputs
ride on the exception, token-exact); the engine goes on serving. The fault is injected into the runner's
forward for the steps that hold one poisoned prompt."""

from __future__ import annotations

import pytest

from diffuserve import LLM, SamplingParams
from diffuserve import llm as llm_module
from diffuserve.errors import GenerationFailed

POISON = 77
"""A prompt that starts with this token makes every step it is in raise."""
PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)
GOOD = {"prompt_token_ids": [9, 8, 7, 6, 5]}
BAD = {"prompt_token_ids": [POISON, 3, 4]}


@pytest.fixture(params=[False, True], ids=["plain", "overlapped-outputs"])
def llm(tiny_model_dir, monkeypatch, request):
    """One sequence a step, so that a poisoned request fails its own steps only; with and without the outputs
    made beside the next forward (engine/output_overlap.py), whose held outputs a failed step must not lose."""
    llm = LLM(str(tiny_model_dir), num_pages=64, max_num_seqs=1, overlap_outputs=request.param)
    execute = llm.engine.runner.execute

    def execute_or_fail(scheduled, beside=None):
        if any(w.request.prompt_token_ids[0] == POISON for w in scheduled):
            raise RuntimeError("injected forward fault")
        return execute(scheduled, beside)

    monkeypatch.setattr(llm.engine.runner, "execute", execute_or_fail)
    return llm


def test_a_failed_step_raises_naming_the_request_and_the_cause(llm: LLM):
    expected = llm.generate(GOOD, PARAMS)[0].outputs[0].token_ids
    assert len(expected) == 8
    with pytest.raises(GenerationFailed) as failed:
        llm.generate([BAD, GOOD], PARAMS)
    message = str(failed.value)
    assert "\n" not in message and message.startswith("request llm-1 failed inside the engine: RuntimeError: ")
    assert "injected forward fault" in message
    assert failed.value.failures.keys() == {"llm-1"}
    bad, good = failed.value.outputs
    assert bad.outputs[0].finish_reason == "error" and "injected forward fault" in (bad.outputs[0].error or "")
    assert good.outputs[0].finish_reason == "length" and good.outputs[0].token_ids == expected
    assert llm.generate(GOOD, PARAMS)[0].outputs[0].token_ids == expected  # the engine goes on serving
    assert llm.engine.pool.usage == 0


def test_chat_raises_too(llm: LLM, monkeypatch):
    monkeypatch.setattr(llm_module, "chat_token_ids", lambda *args, **kwargs: [POISON, 1])
    with pytest.raises(GenerationFailed, match=r"^request llm-0 failed inside the engine: .*injected forward fault"):
        llm.chat([{"role": "user", "content": "anything"}], PARAMS)


def test_every_failed_request_is_named(llm: LLM):
    with pytest.raises(GenerationFailed, match=r"; 2 more failed \(llm-1, llm-2\)$") as failed:
        llm.generate([BAD, BAD, BAD, GOOD], PARAMS)
    assert list(failed.value.failures) == ["llm-0", "llm-1", "llm-2"]
