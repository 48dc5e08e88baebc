"""`enforce_eager`: its default per device, the bare `--enforce-eager` flag of the engine CLIs, the eager forward
being the model itself, and a compiled forward that never recompiles for a new batch (dynamo's graph capture
only: inductor's code generation takes minutes on the test machines)."""

from __future__ import annotations

import argparse
import functools
import random

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.config import EngineConfig, add_config_arguments, engine_config_from_args
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint
from diffuserve.worker.executor import CompiledForward, bucket_size, should_compile


def test_default_compiles_on_cuda_only_and_the_flag_decides_otherwise():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert (should_compile(None, cpu), should_compile(None, cuda)) == (False, True)
    assert (should_compile(True, cuda), should_compile(False, cpu)) == (False, True)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], None),
        (["--enforce-eager"], True),
        (["--enforce-eager", "false"], False),
        (["--moe-backend", "bmm", "--enforce-eager", "true"], True),
    ],
)
def test_engine_cli_flags(argv, expected):
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, EngineConfig, skip=("model",))
    config = engine_config_from_args("m", parser.parse_args(argv))
    assert config.enforce_eager is expected
    assert config.moe_backend == ("bmm" if "bmm" in argv else "auto")


def test_eager_forward_is_the_model_and_costs_no_compile_time():
    model = torch.nn.Linear(4, 4)
    forward = CompiledForward(model, False, torch.device("cpu"))
    x = torch.randn(2, 4)
    assert torch.equal(forward(x), model(x)) and forward.compile_s == 0.0 and not forward.compiled


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, 200) for _ in range(rng.randrange(3, 30))] for _ in range(rng.randrange(2, 6))]


def _generate(llm: LLM, prompts: list[list[int]], seed: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=random.Random(seed).randrange(6, 20), temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_compiled_forward_does_not_recompile_when_the_batch_changes(tmp_path, monkeypatch):
    """Batches of different sizes, prompt lengths and mixes of prefill and denoising steps run through the
    graphs compiled for the first step (dynamo raises on any recompile), with the eager engine's tokens.
    Attention and the routed experts are where the graph breaks: what they trace (the step's sequences, the
    routing's counts) changes every step. The graphs are dynamo's own capture without inductor's code
    generation (`backend="eager"`), since the guards, not the kernels, decide recompiles."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    torch._dynamo.reset()
    config = make_config("sdar-moe-tiny", num_hidden_layers=10)  # more layers than dynamo's recompile limit (8)
    model = str(write_random_checkpoint(tmp_path / "m", config, seed=0, logit_scale=20.0))
    eager, compiled = LLM(model, enforce_eager=True), LLM(model, enforce_eager=False)
    assert compiled.engine.runner.executor.run_model.compiled
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed in (0, 1, 2, 3):
            assert _generate(compiled, _prompts(seed), seed) == _generate(eager, _prompts(seed), seed)
    torch._dynamo.reset()


def test_bucketed_forward_pads_to_a_few_shapes_with_the_eager_tokens(tmp_path, monkeypatch):
    """CUDA graphs record one graph per shape, so there the step's tokens are padded to bucket sizes. Forced on
    here (on the CPU, dynamo's capture only): the model sees bucket sizes only, the padding rows change no token,
    and no new batch recompiles."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    torch._dynamo.reset()
    model = str(write_random_checkpoint(tmp_path / "m", make_config("sdar-moe-tiny"), seed=0, logit_scale=20.0))
    eager, bucketed = LLM(model, enforce_eager=True), LLM(model, enforce_eager=True)
    executor = bucketed.engine.runner.executor
    forward = executor.run_model = CompiledForward(executor.model, True, torch.device("cpu"), bucketed=True)
    seen: set[int] = set()
    compiled = forward._fn
    forward._fn = lambda input_ids, *rest: seen.add(input_ids.shape[0]) or compiled(input_ids, *rest)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed in (0, 1, 2):
            assert _generate(bucketed, _prompts(seed), seed) == _generate(eager, _prompts(seed), seed)
    torch._dynamo.reset()
    assert seen and seen <= {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024}


def test_bucket_sizes():
    assert [bucket_size(n) for n in (1, 3, 4, 5, 33, 256, 257, 700)] == [1, 4, 4, 8, 64, 256, 512, 768]
