"""`torchrun --standalone --nproc-per-node 2` (its own free rendezvous port): rank 0 runs the engine, rank 1 the
worker loop, and the tokens are those of one process: SDAR-MoE with expert parallelism, and clover_moe (Gated
DeltaNet + gated attention) with tensor parallelism under a page budget that forces preemption."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from diffuserve import LLM
from tests.distributed.torchrun_generate import PARAMS, PROMPTS

SCRIPT = Path(__file__).with_name("torchrun_generate.py")
CASES = {
    "sdar-ep": ("tiny_model_dir", "ep", dict(num_pages=128)),
    "clover-tp": ("clover_dirs", "tp", dict(num_pages=6, max_num_seqs=4, state_snapshot_interval=1)),
}


def _torchrun(*args: str) -> subprocess.CompletedProcess:
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [torchrun, "--standalone", "--nproc-per-node", "2", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, check=False)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="no torchrun")
@pytest.mark.parametrize("name", list(CASES))
def test_torchrun_ranks_give_the_same_tokens_as_one_process(request, name):
    fixture, mode, options = CASES[name]
    model_dir = request.getfixturevalue(fixture)
    model_dir = str(model_dir[True] if isinstance(model_dir, dict) else model_dir)
    llm = LLM(model_dir, **options)
    expected = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)]
    if name.startswith("clover"):
        assert llm.engine.stats().num_preemptions > 0, "the page budget should force preemption"
    result = _torchrun(str(SCRIPT), model_dir, mode, json.dumps(options))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected
