"""The planner's hybrid memory model against the engine, on the `clover-moe-bench` shape (the published layer
pattern at small width: 6 GDN + 2 gated attention layers): the KV bytes per token and the constant recurrent
state per sequence that `diffuserve plan --json` reports are what the engine allocates, within 5%."""

from __future__ import annotations

import argparse
import json

import pytest

from diffuserve import LLM
from diffuserve.cli import plan as cli
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint

CONTEXT = 1024


def _plan(capsys, model_dir: str) -> dict:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args([model_dir, "--context-length", str(CONTEXT), "--json"])
    assert cli.run(args) == 0
    return json.loads(capsys.readouterr().out)


def test_planned_kv_and_state_are_what_the_engine_allocates(tmp_path, capsys):
    config = make_clover_moe_config("clover-moe-bench", torch_dtype="bfloat16")
    model_dir = str(write_clover_moe_checkpoint(tmp_path / "bench", config, seed=0))
    executor = LLM(model_dir, max_model_len=CONTEXT, max_num_seqs=2, num_pages=80).engine.runner.executor
    kv_pool = sum(
        t.numel() * t.element_size()
        for t in executor.caches.paged["kv"].k_caches + executor.caches.paged["kv"].v_caches
    )
    kv_per_token = kv_pool / (executor.sizes.num_pages * executor.page_size)
    state = executor.caches.state.state_bytes_per_slot()
    assert len(executor.caches.paged["kv"].k_caches) == 2 and len(executor.caches.state.recurrent_caches) == 6

    plan = _plan(capsys, model_dir)
    memory, capacity = plan["memory_per_device"], plan["capacity"]
    assert memory["kv_bytes_per_token"] == pytest.approx(kv_per_token, rel=0.05)
    assert memory["state_bytes_per_sequence"] == pytest.approx(state, rel=0.05)
    measured = kv_per_token * CONTEXT + state  # CONTEXT is a whole number of pages
    planned = capacity["kv_bytes_per_sequence"] + capacity["state_bytes_per_sequence"]
    assert planned == pytest.approx(measured, rel=0.05)
