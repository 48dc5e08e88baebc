"""`scripts/gpu_check.sh --smoke --dry-run` on the CPU: the GPU smoke plan's scripts exist, their --help runs and
they take every option the plan passes them (scripts/gpu_smoke.py); a plan naming a missing script or an option a
script does not declare is refused."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _smoke_module():
    spec = importlib.util.spec_from_file_location("gpu_smoke", ROOT / "scripts" / "gpu_smoke.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_smoke"] = module  # dataclasses resolve the module by name
    spec.loader.exec_module(module)
    return module


def test_smoke_dry_run_validates_and_prints_the_plan(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--smoke", "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "plan ok: 6 steps" in done.stdout
    names = ["engine-tokens", "gdn-kernels", "compiled", "quant-fp8", "quant-int4", "speed"]
    positions = [done.stdout.index(f". {name} ") for name in names]
    assert positions == sorted(positions)  # in priority order


def test_smoke_plan_with_a_missing_script_or_an_unknown_option_is_refused():
    smoke = _smoke_module()
    plan = (
        smoke.Step("a", "gpu_check_engine.py", ("--phase", "tokens", "--no-such-option"), 1),
        smoke.Step("b", "gpu_check_nowhere.py", (), 1),
        smoke.Step("c", "gpu_check_quant.py", ("fp4", "--device", "cuda"), 1),
    )
    assert smoke.validate(plan) == [
        "a: scripts/gpu_check_engine.py takes no --no-such-option",
        "b: scripts/gpu_check_nowhere.py does not exist",
        "c: scripts/gpu_check_quant.py takes no positional 'fp4'",
    ]
    assert sum(step.share_s for step in smoke.PLAN) <= smoke.BUDGET_S <= 8 * 60
