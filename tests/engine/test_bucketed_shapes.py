"""Bucketed shapes on a model with recurrent state (Clover: GDN state slots beside paged attention).

CUDA graphs record one graph per input shape, so a compiled CUDA forward pads the step's tokens to a few bucket
sizes (worker/executor.py). Forced on here, on the CPU: over the long mixed workload (arrivals, prefix hits,
preemption, a prefill budget, every decoder) the model sees bucket sizes only and every request's output is the
unpadded engine's. And the compiled forward (dynamo's capture only: inductor's code generation takes minutes here)
never recompiles as the batch changes, since attention and the GDN step are where its graph breaks."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.worker.executor import CompiledForward, bucket_size
from tests.engine.mixed_workload import assert_same, mixed_requests, run_mixed, tight_llm, write_mixed_checkpoint

BUCKETS = {bucket_size(n) for n in range(1, 4097)}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_mixed_checkpoint(tmp_path_factory.mktemp("bucketed"))


def _recording(fn: Callable[..., Any], sizes: list[int]) -> Callable[..., Any]:
    """`fn`, noting each call's token count (its first argument's length) in `sizes`."""

    def recorded(input_ids: torch.Tensor, *rest: Any) -> Any:
        sizes.append(input_ids.shape[0])
        return fn(input_ids, *rest)

    return recorded


def _bucketed(llm: LLM, compiled: bool) -> tuple[list[int], list[int]]:
    """Pads `llm`'s forwards to bucket sizes -> (the steps' token counts, the token counts the model saw)."""
    executor = llm.engine.runner.executor
    forward = CompiledForward(executor.model, compiled, torch.device("cpu"), bucketed=True)
    steps: list[int] = []
    seen: list[int] = []
    forward._fn = _recording(forward._fn, seen)
    executor.run_model = _recording(forward, steps)
    return steps, seen


def test_a_long_mixed_run_sees_only_bucket_shapes_with_the_same_outputs(checkpoint):
    requests = mixed_requests()
    plain, bucketed = tight_llm(checkpoint), tight_llm(checkpoint)
    steps, seen = _bucketed(bucketed, compiled=False)
    want = run_mixed(plain.engine, requests)
    got = run_mixed(bucketed.engine, requests)
    assert got.keys() == want.keys()
    for request_id, expected in want.items():
        assert_same(got[request_id], expected, f"request {request_id} ({requests[int(request_id)][2]})")
    assert set(seen) <= BUCKETS and len(seen) == len(steps)
    assert any(size not in BUCKETS for size in steps), "no step needed padding: the test would show nothing"
    assert bucketed.engine.stats().num_preemptions > 0


def _generate(llm: LLM, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(10, 200) for _ in range(rng.randrange(3, 30))] for _ in range(rng.randrange(2, 6))]
    decoder = ("threshold", "verified", "auto")[seed % 3]
    params = SamplingParams(max_tokens=rng.randrange(6, 14), temperature=0.0, ignore_eos=True, decoder=decoder)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_the_compiled_forward_of_a_recurrent_model_never_recompiles(checkpoint, monkeypatch):
    """The GDN step's row groups (which rows commit into which state slot) change every step; traced, they would
    specialise the graph on every batch composition. The graph breaks at the step instead. The first batch traces
    the decoder layer's code once per layer kind (dynamo specialises it on `is_gdn`); no later batch traces again."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    torch._dynamo.reset()
    eager, compiled = LLM(str(checkpoint), enforce_eager=True), LLM(str(checkpoint), enforce_eager=False)
    assert compiled.engine.runner.executor.run_model.compiled
    steps, seen = _bucketed(compiled, compiled=True)
    assert _generate(compiled, 0) == _generate(eager, 0)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed in range(1, 6):
            assert _generate(compiled, seed) == _generate(eager, seed)
    torch._dynamo.reset()
    assert set(seen) <= BUCKETS and any(size not in BUCKETS for size in steps)
