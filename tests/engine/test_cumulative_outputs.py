"""A cumulative request's output is one CompletionOutput the engine updates after every step: its token and
logprob lists grow in place, a step appending its new entries (engine/completion.py: a step's output work does not
copy the whole output), always equal to the request's tokens so far; a token list that does not extend the shown
one replaces it. The server keeps each step's view by copying the lists (tests/server/test_whole_responses.py)."""

from __future__ import annotations

from diffuserve import LLM, SamplingParams
from diffuserve.engine.completion import Completion
from tests.engine.mixed_workload import write_mixed_checkpoint


def test_a_cumulative_output_grows_in_place_as_the_steps_add_tokens(tmp_path):
    llm = LLM(str(write_mixed_checkpoint(tmp_path)))
    params = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.0, logprobs=2, decoder="fixed", steps=2)
    engine = llm.engine
    engine.add_request("r", [40, 41, 42, 43, 44], params)
    seen = []  # per output: (the completion, its token list, its logprobs list, copies of both)
    while engine.has_unfinished_requests():
        for out in engine.step():
            c = out.outputs[0]
            seen.append((c, c.token_ids, c.logprobs, list(c.token_ids), list(c.logprobs or [])))
    completion, tokens, logprobs = seen[0][:3]
    assert len(seen) > 2 and all(s[0] is completion and s[1] is tokens and s[2] is logprobs for s in seen)
    lengths = [len(s[3]) for s in seen]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1] == 12
    assert all(s[3] == tokens[: len(s[3])] and len(s[4]) <= len(s[3]) for s in seen)  # views of one growing list
    assert all(s[4] == logprobs[: len(s[4])] for s in seen)
    final = llm.generate({"prompt_token_ids": [40, 41, 42, 43, 44]}, params, use_tqdm=False)[0].outputs[0]
    assert tokens == final.token_ids and logprobs == final.logprobs


def test_a_token_list_that_does_not_extend_the_shown_one_replaces_it():
    completion = Completion(0, SamplingParams().with_defaults({}, max_tokens_limit=16))
    completion.update(None, [5, 6, 7], finished=False)
    shown = completion.output.token_ids
    completion.update(None, [5, 6, 7, 8], finished=False)
    assert completion.output.token_ids is shown == [5, 6, 7, 8]
    completion.update(None, [5, 6], finished=True)
    assert completion.output.token_ids == [5, 6] and shown == [5, 6, 7, 8]  # the earlier view is left as it was
