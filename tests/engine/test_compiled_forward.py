"""`enforce_eager`: its default per device, the bare `--enforce-eager` flag of the engine CLIs, and the eager
forward being the model itself (no compile is run here: compiling takes minutes on the test machines)."""

from __future__ import annotations

import argparse

import pytest
import torch

from diffuserve.config import EngineConfig, add_config_arguments, engine_config_from_args
from diffuserve.engine.executor import CompiledForward, should_compile


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
