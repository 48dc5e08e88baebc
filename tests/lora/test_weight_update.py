"""Live weight updates through the offline API: after `update_weights` to checkpoint B (a directory or a state
dict) the engine's greedy outputs equal a fresh engine on B, the prefix cache is flushed, adapters stay loaded,
requests in flight are refused; `sleep` / `wake_up` change nothing on a CPU."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from diffuserve import LLM, LoRARequest, SamplingParams
from tests.lora.adapters import adapter_for_checkpoint, merge_into_checkpoint, write_base

PROMPTS = [{"prompt_token_ids": [(i * 11 + j * 5) % 90 + 1 for j in range(9 + i)]} for i in range(3)]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("weights")
    base = write_base(root, "dense")
    adapter = adapter_for_checkpoint(base, root / "policy", seed=5)
    return base, merge_into_checkpoint(base, adapter, root / "policy-merged"), adapter


def _tokens(llm: LLM, **kwargs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, **kwargs)]


def test_update_from_disk_and_from_a_state_dict(checkpoints):
    base, new, adapter = checkpoints
    llm = LLM(str(base), enable_lora=True, max_lora_rank=4, page_size=4)
    before, with_adapter = _tokens(llm), _tokens(llm, lora_request=LoRARequest("a", 1, str(adapter)))
    assert llm.generate(PROMPTS[:1], GREEDY)[0].num_cached_tokens > 0
    llm.update_weights(str(new))
    expected = _tokens(LLM(str(new)))
    assert expected != before
    assert llm.generate(PROMPTS[:1], GREEDY)[0].num_cached_tokens == 0  # the old weights' pages are not reused
    assert _tokens(llm) == expected
    llm.update_weights(load_file(base / "model.safetensors"))
    assert _tokens(llm) == before
    assert _tokens(llm, lora_request=LoRARequest("a", 1, str(adapter))) == with_adapter  # the adapter stayed


def test_update_refuses_requests_in_flight_and_bad_checkpoints(checkpoints, tmp_path):
    base, new, _ = checkpoints
    llm = LLM(str(base))
    llm.engine.add_request("r", [1, 2, 3], GREEDY)
    with pytest.raises(RuntimeError, match="update_weights: 1 requests are in flight; let them finish or abort"):
        llm.update_weights(str(new))
    llm.engine.abort_request("r")
    llm.engine.step()
    tensors = load_file(new / "model.safetensors")
    tensors.pop("model.norm.weight")
    with pytest.raises(ValueError, match=r"missing weights model.norm.weight"):
        llm.update_weights(tensors)
    with pytest.raises(ValueError, match="does not exist"):
        llm.update_weights(str(tmp_path / "nowhere"))


def test_sleep_and_wake_up_are_no_ops_on_cpu(checkpoints):
    llm = LLM(str(checkpoints[0]))
    before = _tokens(llm)
    llm.sleep()
    llm.wake_up()
    assert _tokens(llm) == before
