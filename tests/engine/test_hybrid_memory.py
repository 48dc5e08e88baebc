"""Memory of a hybrid model (clover_moe) through the engine: the recurrent state does not grow with the context.
Each run is a fresh process (its peak resident memory is the measurement): one request whose prompt fills a
1K- or an 8K-token context, the same step budget, a KV cache sized to exactly that context. The 8K peak must
be within 10% of the 1K peak plus the extra K/V pages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint

RUN = """
import json, resource, sys, torch
torch.set_num_threads(1)
from diffuserve import LLM, SamplingParams
model_dir, context = sys.argv[1], int(sys.argv[2])
block, page = 32, 32
llm = LLM(model_dir, device="cpu", max_model_len=context + block, max_num_seqs=1, max_num_batched_tokens=256,
          num_pages=(context + 2 * block) // page, enable_prefix_caching=False)
prompt = [(7 * i) % 200 + 10 for i in range(context - block)]
out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=block, ignore_eos=True))[0]
executor = llm.engine.runner.executor
kv = executor.caches.paged["kv"].num_bytes
state = executor.caches.state.state_bytes_per_slot() * executor.caches.state.num_slots
print(json.dumps({"peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "kv": kv, "state": state,
                  "tokens": len(out.outputs[0].token_ids)}))
"""


def _measure(model_dir: Path, context: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(model_dir), str(context)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_peak_memory_at_8k_is_the_1k_peak_plus_the_extra_kv_pages(tmp_path):
    config = make_clover_moe_config(block_length=32, max_position_embeddings=16384)
    model_dir = write_clover_moe_checkpoint(tmp_path / "m", config, seed=1, init_std=0.1)
    short, long = _measure(model_dir, 1024), _measure(model_dir, 8192)
    assert short["tokens"] == long["tokens"] == 32
    assert short["state"] == long["state"]  # one slot whatever the context
    bound = 1.10 * (short["peak"] + long["kv"] - short["kv"])
    assert long["peak"] <= bound, (short, long)
