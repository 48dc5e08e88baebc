"""One `diffuserve bench` command (or a script of this checkout, `--script`) at two git revisions, interleaved, as
ratios (new / old).

    python scripts/ab_commits.py --old e5e42ab --new HEAD --rounds 2 -- compare --threads 1 --block-lengths 32

Each revision is checked out once (a detached `git worktree` under --work-dir) and the bench command runs with
that checkout first on PYTHONPATH, in a fresh process, in the order old, new, new, old, old, ... so that a drift
in the machine's load falls on both sides alike. Every run's final JSON line is read back; each row's tokens/s
(`bench compare`: per block length and variant; `bench throughput`: per block length, mode and concurrency) is
reduced to the median over rounds, and the table prints old, new and new / old. The last line is JSON. A script
may rate its rows by another rate than tokens/s: its JSON names the rows' key (`"rate": "request_steps_per_s"`),
and the result carries it on. With `--phases`, a script whose rows carry the engine's step phases
(`phases_us_per_request_step`, as scripts/decode_cases.py's) is compared phase by phase too, in microseconds per
request-step (lower is better): a change of a microsecond or two in one phase shows there long before the
end-to-end rate can resolve it.

Knows nothing of the engine: it only runs the CLI and reads its JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def checkout(rev: str, work_dir: Path) -> Path:
    """A detached worktree of `rev` (reused if it is already there)."""
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, text=True, capture_output=True, check=True)
    path = work_dir / sha.stdout.strip()
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=REPO, check=True)
    return path


def run_bench(tree: Path, bench_args: list[str], script: Path | None = None) -> dict:
    """The bench's final JSON, run from `tree`'s code (`script`: this checkout's script instead of `diffuserve
    bench`, with `tree`'s package on the path)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        runner = [str(script.resolve())] if script is not None else ["-m", "diffuserve", "bench"]
        command = [sys.executable, *runner, *bench_args, "--json-out", out.name]
        subprocess.run(command, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
        return json.loads(Path(out.name).read_text())


def rows(result: dict) -> dict[str, float]:
    """tokens/s per row of a `bench compare` or `bench throughput` result, or a script's rate of its `rows`."""
    if "rows" in result:
        return {row["row"]: row[rate(result)] for row in result["rows"]}
    found = {}
    for row in result["results"]:
        if "variants" in row:
            for variant, numbers in row["variants"].items():
                found[f"block {row['block_length']} {variant}"] = numbers["tokens_per_s"]
        else:
            found[f"block {row['block_length']} {row['mode']} x{row['concurrency']}"] = row["tokens_per_s"]
    return found


def phase_rows(result: dict) -> dict[str, float]:
    """Microseconds per request-step of each row's step phases, named `row: phase`, and the engine's own time (every
    phase but the forward) as `row: engine`."""
    found = {}
    for row in result.get("rows", []):
        phases = row.get("phases_us_per_request_step", {})
        for phase, micros in phases.items():
            found[f"{row['row']}: {phase}"] = micros
        if phases:
            found[f"{row['row']}: engine"] = sum(us for phase, us in phases.items() if phase != "forward")
    return found


def compare(samples: dict[str, dict[str, list[float]]], label: str) -> list[dict]:
    """Per row the median over rounds of both sides and new / old; printed as a table under `label`."""
    table = []
    print(f"{'row':32} {'old':>10} {'new':>10} {'new/old':>8}  ({label})")
    for name in samples["old"]:
        old, new = (statistics.median(samples[s][name]) for s in ("old", "new"))
        table.append({"row": name, "old": old, "new": new, "ratio": round(new / old, 3)})
        print(f"{name:32} {old:10.2f} {new:10.2f} {new / old:8.3f}")
    return table


def rate(result: dict) -> str:
    """The key of the rate a result's rows carry (tokens/s unless a script says otherwise)."""
    return result.get("rate", "tokens_per_s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", default="HEAD")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "diffuserve-ab")
    parser.add_argument(
        "--script", type=Path, default=None, help="run this script (e.g. scripts/decode_cases.py) instead of the bench"
    )
    parser.add_argument(
        "--phases", action="store_true", help="also compare the rows' step phases (us per request-step)"
    )
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then the `diffuserve bench` arguments")
    args = parser.parse_args()
    bench_args = [a for a in args.bench_args if a != "--"]
    args.work_dir.mkdir(parents=True, exist_ok=True)
    trees = {"old": checkout(args.old, args.work_dir), "new": checkout(args.new, args.work_dir)}
    samples: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    phases: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    rated = "tokens_per_s"
    for i in range(args.rounds):
        for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
            result = run_bench(trees[side], bench_args, args.script)
            rated = rate(result)
            for name, value in rows(result).items():
                samples[side].setdefault(name, []).append(value)
            for name, value in phase_rows(result).items() if args.phases else ():
                phases[side].setdefault(name, []).append(value)
    revs = {side: tree.name for side, tree in trees.items()}
    summary = {"bench": bench_args, "revisions": revs, "rounds": args.rounds, "rate": rated}
    summary["rows"] = compare(samples, rated)
    if args.phases:
        summary["phase_rows"] = compare(phases, "us per request-step, lower is better")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
