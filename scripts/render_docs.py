"""Writes the result tables of the documentation pages (DOCS: the benchmark pages, the bundled model's, MoE's,
structured output's, the planner's calibration and testing's) from docs/results/.

Each file in docs/results/ is one run: {"command": the command line, "result": the final JSON line it printed,
"provenance": only where the line was not kept and was transcribed from older docs}. A doc marks each generated
table with `<!-- results:NAME -->` ... `<!-- /results:NAME -->`; this script rewrites what lies between them
from TABLES[NAME] and never touches the prose around it (whose numbers a person checks against the same files).
This file is the machinery and the registry; the renderers are scripts/doc_tables/, grouped by the doc they fill.

    python scripts/render_docs.py                  # rewrite the tables in place
    python scripts/render_docs.py --check          # exit 1 if a doc is out of date (tests/docs does this)
    python scripts/render_docs.py --record NAME OUTPUT -- COMMAND...   # store OUTPUT's last JSON line as NAME
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The renderers live beside this script (scripts/doc_tables), not in the package: importable from the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.doc_tables import (
    benchmarks_batch1,
    benchmarks_compare,
    benchmarks_phases,
    benchmarks_quant,
    benchmarks_serving,
    benchmarks_sweep,
    models,
    moe,
    testing,
)
from scripts.doc_tables.cells import Load

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
DOCS = (
    "benchmarks/against-peers.md",
    "benchmarks/decoders.md",
    "benchmarks/latency.md",
    "benchmarks/moe.md",
    "benchmarks/quantization.md",
    "benchmarks/redesigns.md",
    "benchmarks/throughput.md",
    "decoding/structured-output.md",
    "internals/testing.md",
    "models/bundled.md",
    "planning/calibration.md",
    "serving/adapters.md",
    "serving/moe.md",
)
"""The pages under docs/ that hold generated tables (tests/docs checks that each region is in one of them)."""
REGION = re.compile(r"(<!-- results:([\w-]+) -->\n)(.*?)(<!-- /results:\2 -->)", re.S)


def load_results(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{name}.json").read_text())


TABLES: dict[str, Callable[[Load], str]] = {
    "compare": benchmarks_compare.compare,
    "compare-quiet": benchmarks_compare.compare_quiet,
    "compare-hybrid": benchmarks_compare.compare_hybrid,
    "compare-verified": benchmarks_compare.compare_verified,
    "compare-verified-64": benchmarks_compare.compare_verified_64,
    "compare-verified-clover-moe": benchmarks_compare.compare_verified_clover_moe,
    "compare-renoise": benchmarks_compare.compare_renoise,
    "renoise-overhead": benchmarks_compare.renoise_overhead,
    "attention-backends": benchmarks_compare.attention_backends,
    "throughput": benchmarks_serving.throughput,
    "ab-sampled-decoding": benchmarks_serving.ab_commits("ab-sampled-decoding"),
    "ab-decode-cases": benchmarks_serving.ab_commits("ab-decode-cases"),
    "ab-step-records": benchmarks_serving.ab_commits("ab-step-records"),
    "ab-page-tables": benchmarks_serving.ab_commits("ab-page-tables"),
    "ab-page-tables-short": benchmarks_serving.ab_commits("ab-page-tables-short"),
    "ab-whole-responses": benchmarks_serving.ab_commits("ab-whole-responses"),
    "ab-whole-responses-default": benchmarks_serving.ab_commits("ab-whole-responses-default"),
    "ab-final-only-whole-1": benchmarks_serving.ab_commits("ab-final-only-whole-1"),
    "ab-final-only-whole-2": benchmarks_serving.ab_commits("ab-final-only-whole-2"),
    "serve-whole-phases": benchmarks_serving.serve_whole("serve-whole-phases"),
    "ab-phases-same-revision": benchmarks_serving.ab_phases("ab-phases-same-revision"),
    "ab-engine-hot-path": benchmarks_serving.ab_phases("ab-engine-hot-path"),
    "ab-engine-hot-path-sdar": benchmarks_serving.ab_phases("ab-engine-hot-path-sdar"),
    "ab-long-outputs": benchmarks_serving.ab_phases("ab-long-outputs"),
    "ab-verified-draft-params": benchmarks_serving.ab_phases("ab-verified-draft-params"),
    "ab-verified-draft-checks": benchmarks_serving.ab_phases("ab-verified-draft-checks"),
    "ab-penalties": benchmarks_serving.ab_phases("ab-penalties"),
    "ab-bundled-final-only": benchmarks_serving.ab_rates_and_phases("ab-bundled-final-only"),
    "ab-decode-cases-block4": benchmarks_serving.ab_commits("ab-decode-cases-block4"),
    "ab-auto-heads": benchmarks_serving.ab_commits("ab-auto-heads"),
    "decode-cases": benchmarks_serving.decode_cases,
    "ab-grammar-walks": benchmarks_serving.ab_commits("ab-grammar-walks"),
    "overlap-outputs": benchmarks_serving.decode_engines("overlap-outputs"),
    "overlap-outputs-2threads": benchmarks_serving.decode_engines("overlap-outputs-2threads"),
    "overlap-outputs-bench": benchmarks_serving.decode_engines("overlap-outputs-bench"),
    "calibration": benchmarks_serving.calibration,
    "compare-batch1": benchmarks_batch1.compare_batch1,
    "profiles": benchmarks_batch1.profiles,
    "moe-backends": moe.moe_backends,
    "roofline": benchmarks_batch1.roofline,
    "ab-engines": benchmarks_batch1.ab_engines,
    "redesign32-ab": benchmarks_batch1.redesign32_ab,
    "gdn-roofline": benchmarks_batch1.gdn_roofline,
    "skinny-gemm": benchmarks_batch1.skinny_gemm,
    "latency": benchmarks_serving.latency,
    "serve": benchmarks_serving.serve,
    "gateway": benchmarks_serving.gateway,
    "adapters": benchmarks_serving.adapters,
    "moe-dispatch": moe.moe_dispatch,
    "moe-offload": moe.moe_offload,
    "training": models.training,
    "accuracy-vs-tpf": models.accuracy_vs_tpf,
    "structured-tpf": models.structured_tpf,
    "coreset-accuracy": models.coreset_accuracy,
    "draft-adapter": models.draft_adapter,
    "quant-latency": benchmarks_quant.quant_latency,
    "load-memory": benchmarks_quant.load_memory,
    "quant-accuracy": benchmarks_quant.quant_accuracy,
    "quant-kl": benchmarks_quant.quant_kl,
    "long-context-chunks": benchmarks_quant.long_context_chunks,
    "long-context": benchmarks_quant.long_context_summary,
    "option-matrix": testing.option_matrix,
    "fuzz-http": testing.fuzz_http,
    "sweep": benchmarks_sweep.sweep,
    "sweep-phases": benchmarks_sweep.phases,
    "sweep-phases-change": benchmarks_phases.phases_change,
    "output-kinds": benchmarks_serving.decode_engines("output-kinds", "final-only"),
    "sweep-prefill": benchmarks_sweep.prefill_budget,
}
"""Region name -> the renderer that fills it (tests/docs checks that each has exactly one region)."""


def render(text: str, load: Load = load_results) -> str:
    """`text` with every results region rewritten; KeyError names a region no table renders."""

    def fill(match: re.Match) -> str:
        name = match.group(2)
        if name not in TABLES:
            raise KeyError(f"results region {name!r}: no such table; known: {', '.join(TABLES)}")
        return f"{match.group(1)}\n{TABLES[name](load)}\n\n{match.group(4)}"

    return REGION.sub(fill, text)


def record(name: str, output: Path, command: list[str]) -> Path:
    """Stores the last JSON line of a command's output as docs/results/NAME.json, with the commit it ran at (its
    environment's, when clean; else this checkout's HEAD)."""
    lines = [line for line in output.read_text().splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"record: {output} holds no JSON line; pass the file the command's stdout went to")
    result = json.loads(lines[-1])
    ran_at = (result.get("environment") or {}).get("git") or {}  # the commit the command ran at, where it says
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    git = ran_at["sha"][:7] if ran_at.get("sha") and not ran_at.get("dirty") else sha.stdout.strip() or None
    data = {"command": " ".join(command), "git": git, "result": result}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a doc differs from its results")
    parser.add_argument("--record", nargs=2, metavar=("NAME", "OUTPUT"), help="store OUTPUT's last JSON line")
    parser.add_argument("command", nargs="*", help="with --record: the command line that printed OUTPUT")
    args = parser.parse_args(argv)
    if args.record:
        print(f"wrote {record(args.record[0], Path(args.record[1]), args.command)}")
        return 0
    stale = []
    for doc in DOCS:
        path = ROOT / "docs" / doc
        text = path.read_text()
        rendered = render(text)
        if rendered != text:
            stale.append(doc)
            if not args.check:
                path.write_text(rendered)
    verb = "out of date (run scripts/render_docs.py)" if args.check else "rewritten"
    print(f"{verb}: {', '.join(stale)}" if stale else "docs match docs/results")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
