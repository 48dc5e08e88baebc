"""examples/rl_rollout.py against a live server: rollouts with logprobs, an update from disk, rollouts again,
and the new weights' greedy output served (its own check against the new checkpoint run offline)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from diffuserve.server.config import ServerConfig
from tests.conftest import tiny_checkpoint
from tests.server.conftest import LiveServer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rl_rollout.py"


def test_rollout_loop_serves_the_new_weights(tmp_path, single_threaded_torch, capsys):
    spec = importlib.util.spec_from_file_location("rl_rollout", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    old, new = tiny_checkpoint(tmp_path, "step-1", seed=1), tiny_checkpoint(tmp_path, "step-2", seed=2)
    server = LiveServer(old, ServerConfig(served_model_name="policy"), num_pages=256).start()
    try:
        example.rollout_loop(server.url, str(new), n=2, check=True)
    finally:
        server.stop()
    printed = capsys.readouterr().out
    assert "greedy changed: True" in printed and "the server serves the new weights' greedy output" in printed
    assert printed.count("before  prompt") == printed.count("after   prompt") == len(example.PROMPTS)
