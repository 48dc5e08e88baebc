"""The GPU smoke check (run by `scripts/gpu_check.sh --smoke`): the existing GPU checks, in priority order, each
under its own share of an 8-minute budget, on one H100 / H200:

    1. engine-tokens  the engine in bf16 on the GPU vs fp32 on the CPU, sdar-moe-bench and clover-moe-bench
    2. gdn-kernels    flash-linear-attention's GDN kernels vs the torch path
    3. compiled       the compiled / CUDA-graph step vs eager
    4. quant-fp8      fp8 matmuls vs the dequantised reference (then the engine quantized on load)
    5. quant-int4     the same for int4
    6. speed          decode tokens/s at 1 / 16 / 64 concurrent

A step's time limit is its deadline (start + the shares up to it, at most the budget) less the time now, so a
step that finishes early leaves its time to the next; a step past it is killed and reported as timed out, the
next starts. Before the steps the wheels that `scripts/gpu_wheels.sh` downloaded are installed from the wheel
folder when it holds any (the GPU machine has no network). Each step's log and JSON go to --out's folder; the
summary (each step's exit status, seconds and last JSON line) is the last line printed.

`--dry-run` validates the plan on the CPU: every script exists, its `--help` runs, and every option the plan passes
it is one it declares; then prints the plan. Nothing is installed or run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
WHEELS = ROOT / "wheels" / "gpu"
BUDGET_S = 460
"""Of the 8 minutes: the wheel install and the start take the rest."""


@dataclass(frozen=True)
class Step:
    name: str
    script: str
    args: tuple[str, ...]
    share_s: int


SPEED_ARGS = ("--phase", "speed", "--device", "cuda", "--concurrency", "1", "16", "64")
PLAN = (
    Step("engine-tokens", "gpu_check_engine.py", ("--phase", "tokens", "--device", "cuda"), 100),
    Step("gdn-kernels", "gpu_check_gdn_kernels.py", ("--device", "cuda"), 70),
    Step("compiled", "gpu_check_compiled.py", ("--device", "cuda"), 100),
    Step("quant-fp8", "gpu_check_quant.py", ("fp8", "--device", "cuda"), 60),
    Step("quant-int4", "gpu_check_quant.py", ("int4", "--device", "cuda"), 60),
    Step("speed", "gpu_check_engine.py", SPEED_ARGS, 70),
)


def _helps(scripts: set[str]) -> dict[str, str | None]:
    """Each existing script's --help text (None where it fails), the scripts started at once."""
    running = {
        name: subprocess.Popen([sys.executable, str(SCRIPTS / name), "--help"], stdout=subprocess.PIPE, text=True)
        for name in sorted(scripts)
        if (ROOT / "scripts" / name).exists()
    }
    helps: dict[str, str | None] = {}
    for name, proc in running.items():
        out, _ = proc.communicate(timeout=120)
        helps[name] = out if proc.returncode == 0 else None
    return helps


def validate(plan: tuple[Step, ...]) -> list[str]:
    """The plan's problems (none: it can run): a missing script, a failing --help, an option it does not take."""
    problems, helps = [], _helps({step.script for step in plan})
    for step in plan:
        if step.script not in helps:
            problems.append(f"{step.name}: scripts/{step.script} does not exist")
            continue
        text = helps[step.script]
        if text is None:
            problems.append(f"{step.name}: scripts/{step.script} --help failed")
            continue
        for arg in step.args:
            if arg.startswith("--") and arg not in text:
                problems.append(f"{step.name}: scripts/{step.script} takes no {arg}")
        for choice in (a for a in step.args[:1] if not a.startswith("--")):
            if choice not in text:
                problems.append(f"{step.name}: scripts/{step.script} takes no positional {choice!r}")
    return problems


def install_wheels() -> str:
    wheels = sorted(str(p) for p in WHEELS.glob("*.whl"))
    if not wheels:
        return f"no wheels in {WHEELS.relative_to(ROOT)}"
    command = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", *wheels]
    done = subprocess.run(command, capture_output=True, text=True)
    return f"installed {len(wheels)} wheels" if done.returncode == 0 else f"wheel install failed: {done.stderr[-300:]}"


def run_step(step: Step, limit_s: float, out_dir: Path) -> dict:
    if limit_s <= 0:
        return {"step": step.name, "status": "skipped (budget spent)"}
    command = [sys.executable, str(SCRIPTS / step.script), *step.args, "--out", str(out_dir / f"{step.name}.json")]
    started = time.perf_counter()
    with (out_dir / f"{step.name}.log").open("w") as log:
        try:
            rc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=limit_s).returncode
            status = "ok" if rc == 0 else f"failed (exit {rc})"
        except subprocess.TimeoutExpired:
            status = f"timed out after {limit_s:.0f} s"
    lines = (out_dir / f"{step.name}.log").read_text().strip().splitlines()
    last = lines[-1] if lines and lines[-1].startswith("{") else None
    return {"step": step.name, "status": status, "seconds": round(time.perf_counter() - started, 1), "result": last}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="validate and print the plan on the CPU")
    parser.add_argument("--out", type=Path, default=Path("/tmp/diffuserve-gpu-check/gpu_smoke.json"))
    args = parser.parse_args()
    for index, step in enumerate(PLAN, 1):
        print(f"{index}. {step.name:14s} {step.share_s:4d} s  scripts/{step.script} {' '.join(step.args)}")
    if args.dry_run:
        problems = validate(PLAN)
        print("\n".join(problems) if problems else f"plan ok: {len(PLAN)} steps, {BUDGET_S} s budget")
        return 1 if problems else 0
    out_dir = args.out.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict = {"wheels": install_wheels(), "steps": []}
    print(summary["wheels"], flush=True)
    start, deadline = time.perf_counter(), 0.0
    for step in PLAN:
        deadline = min(deadline + step.share_s, BUDGET_S)
        summary["steps"].append(run_step(step, deadline - (time.perf_counter() - start), out_dir))
        print(json.dumps(summary["steps"][-1]), flush=True)
    line = json.dumps(summary)
    args.out.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
