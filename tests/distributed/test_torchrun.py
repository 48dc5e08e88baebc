"""`torchrun --standalone --nproc-per-node 2` (its own free rendezvous port): rank 0 runs the engine, rank 1 the
worker loop, and the tokens are those of one process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from diffuserve import LLM, SamplingParams

SCRIPT = Path(__file__).with_name("torchrun_generate.py")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="no torchrun")
def test_torchrun_ranks_give_the_same_tokens_as_one_process(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), num_pages=128)
    prompts = [{"prompt_token_ids": [(i * 11 + j * 5) % 250 + 1 for j in range(2 + 6 * i)]} for i in range(5)]
    params = SamplingParams(max_tokens=16, ignore_eos=True, threshold=0.7)
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", str(SCRIPT), str(tiny_model_dir), "ep"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected
