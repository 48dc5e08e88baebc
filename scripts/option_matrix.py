"""Runs every cell of the family x option matrix (diffuserve/reference/option_matrix.py), the slow ones included
(worker processes, compilation), and prints one JSON line: per cell its family, options, outcome and seconds.
tests/test_option_matrix.py runs the fast cells in CI; this is the whole table.

    python scripts/option_matrix.py --json-out /tmp/matrix.json        # every cell (~10-20 min on 2 cores)
    python scripts/option_matrix.py --family clover_moe --fast          # a part of it
    python scripts/render_docs.py --record option-matrix /tmp/matrix.json -- python scripts/option_matrix.py
    python scripts/render_docs.py                                        # the table in docs/internals/testing.md
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diffuserve.reference.matrix_families import FAMILIES
from diffuserve.reference.option_matrix import cells, run_cell


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", choices=list(FAMILIES), help="only these families")
    parser.add_argument("--fast", action="store_true", help="only the cells CI runs")
    parser.add_argument("--json-out", type=Path, help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    chosen = [c for c in cells() if (not args.family or c.family in args.family) and not (args.fast and c.slow)]
    results, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="option-matrix-") as root:
        dirs: dict[str, Path] = {}
        for cell in chosen:
            if cell.family not in dirs:
                dirs[cell.family] = FAMILIES[cell.family].write(Path(root) / cell.family)
            result = run_cell(cell, dirs[cell.family])
            print(f"{result.seconds:7.2f} s  {cell.id:55s} {result.outcome}", file=sys.stderr, flush=True)
            row = {"family": cell.family, "options": list(cell.options), "slow": cell.slow}
            results.append({**row, "outcome": result.outcome, "seconds": round(result.seconds, 2)})
    failed = [r for r in results if r["outcome"].startswith("FAIL")]
    line = json.dumps({"cells": results, "failed": len(failed), "seconds": round(time.perf_counter() - started, 1)})
    print(line)
    if args.json_out:
        args.json_out.write_text(line + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
