"""`scripts/gpu_check.sh --graphs --dry-run` on the CPU: the CUDA-graph check's own code runs end to end on both
engine shapes (attention only, and GDN state beside attention) at the tiny sizes, with dynamo's capture only. Its
steps needed padding, the model saw bucket shapes only (the script asserts it), nothing was traced again after the
warm-up, the padded compiled engine's tokens equal eager's (on the CPU the same kernels run), and its decode speed
is read eager, compiled and compiled with overlapped outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_graphs_dry_run(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--graphs", "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary == json.loads((tmp_path / "gpu_check_graphs.json").read_text())
    for family in ("sdar-moe", "clover-moe"):
        replay = summary[family]["replay"]
        assert replay["steps_padded"] > 0 and replay["graphs_traced"] == 0, family
        assert replay["same_tokens_as_eager"] and all(replay["same_tokens_as_eager"]), family
        assert summary[family]["warm_up"]["buckets"], family
        speeds = summary[family]["decode_tokens_per_s"]["batch_16"]
        assert speeds.keys() == {"eager", "compiled", "compiled_overlapped"}, family
