"""Fixtures of the benchmark tests: a tiny Qwen3-MoE-shaped model (transformers can build it for the compare
reference) and a helper that runs `diffuserve bench ...` in-process and returns its final JSON line."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from diffuserve.cli.main import main
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint

FAST = ["--probe-seconds", "0.02", "--threads", "1"]
"""Options every tiny offline run passes: short probes, one thread."""


@pytest.fixture(scope="session")
def bench_model_dir(tmp_path_factory) -> Path:
    """sdar-moe-tiny (4 experts top-2, block 4) with a peaky LM head, so threshold decoding accepts several
    tokens at some steps."""
    config = make_config("sdar-moe-tiny", block_length=4)
    return write_random_checkpoint(tmp_path_factory.mktemp("bench-model") / "tiny", config, seed=3, logit_scale=40)


@pytest.fixture
def run_bench(capsys) -> Callable[[list[str]], tuple[int, dict, str]]:
    """Runs `diffuserve bench ARGS`; returns (exit code, the final JSON line parsed, everything before it)."""

    def run(argv: list[str]) -> tuple[int, dict, str]:
        code = main(["bench", *argv])
        lines = capsys.readouterr().out.strip().splitlines()
        return code, json.loads(lines[-1]), "\n".join(lines[:-1])

    return run


def plot_args(out_dir: Path) -> list[str]:
    """`--plot DIR` when matplotlib (the `plot` extra) is installed, else nothing."""
    return ["--plot", str(out_dir)] if importlib.util.find_spec("matplotlib") else []


def pngs(out_dir: Path) -> set[str]:
    return {p.name for p in out_dir.glob("*.png")} if out_dir.is_dir() else set()
