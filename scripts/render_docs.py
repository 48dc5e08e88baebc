"""Writes the result tables of docs/benchmarks.md, docs/moe.md, docs/default-model.md and docs/server.md from
docs/results/.

Each file in docs/results/ is one run: {"command": the command line, "result": the final JSON line it printed,
"provenance": only where the line was not kept and was transcribed from older docs}. A doc marks each generated
table with `<!-- results:NAME -->` ... `<!-- /results:NAME -->`; this script rewrites what lies between them
from TABLES[NAME] and never touches the prose around it (whose numbers a person checks against the same files).

    python scripts/render_docs.py                  # rewrite the tables in place
    python scripts/render_docs.py --check          # exit 1 if a doc is out of date (tests/docs does this)
    python scripts/render_docs.py --record NAME OUTPUT -- COMMAND...   # store OUTPUT's last JSON line as NAME
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
DOCS = ("benchmarks.md", "moe.md", "default-model.md", "server.md")
REGION = re.compile(r"(<!-- results:([\w-]+) -->\n)(.*?)(<!-- /results:\2 -->)", re.S)

Load = Callable[[str], dict[str, Any]]
"""Results file name (no .json) -> its contents ({"command", "result", ...})."""


def load_results(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{name}.json").read_text())


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def pct(x: float, space: str = "") -> str:
    return f"{100 * x:.1f}{space}%"


def sig3(x: float) -> str:
    """Three significant digits, trailing zeros kept (23.0, 5.36, 145)."""
    return f"{x:.{max(0, 2 - math.floor(math.log10(abs(x))))}f}" if x else "0"


def ms(seconds: float, digits: int = 1) -> str:
    return f"{1000 * seconds:,.{digits}f}"


# --- docs/benchmarks.md ---------------------------------------------------------------------------------------

VARIANTS = {
    "engine": "(a) engine: KV cache, fused commit",
    "engine-batched": "(e) engine, all prompts at once",
    "baseline": "(a0) engine eager, per-expert loop",
    "reference": "(b) transformers Qwen3-MoE, recompute every step",
    "transformers-kv": "(b2) transformers Qwen3-MoE + KV cache, SDAR scheme",
    "separate-commit": "(c) cached, separate commit forward",
    "ar": "(d) AR (block length 1)",
}
TARGETS = {32: "reference", 4: "separate-commit"}
"""The variant each block length's speed-up target is against (bench/compare.py TARGETS), printed bold."""


def compare(load: Load) -> str:
    rows = []
    for r in load("compare")["result"]["results"]:
        for name, v in r["variants"].items():
            ratio = "1" if name == "engine" else f"{r['ratios'][f'engine_vs_{name}']:.3g}x"
            if TARGETS[r["block_length"]] == name:
                ratio = f"**{ratio}**"
            rows.append(
                [
                    r["block_length"],
                    VARIANTS[name],
                    sig3(v["tokens_per_s"]),
                    v["nfe"],
                    f"{v['tpf']:.2f}",
                    sig3(v["forwards_per_s"]),
                    ratio,
                ]
            )
    return table(["block", "variant", "tokens/s", "NFE", "TPF", "forwards/s", "engine speed-up"], rows)


HYBRID_VARIANTS = {
    "engine": "(a) engine: state pool + paged K/V, fused commit",
    "reference": "(b) naive clover_moe decode: prefix recomputed every step",
    "recompute-state": "(f) engine recomputing the prefix every step (no cache at all)",
    "gdn-rescan": "(g) engine with paged K/V, GDN state rebuilt every step (prefix rescanned)",
}
HYBRID_TARGETS = ("reference", "gdn-rescan")
"""The variants a speed-up target of issue 14 is against (bench/compare.py TARGETS), printed bold."""


def compare_hybrid(load: Load) -> str:
    """docs/results/compare-clover-moe.json: a hybrid model's engine against the recomputing baselines."""
    rows = []
    for r in load("compare-clover-moe")["result"]["results"]:
        for name, v in r["variants"].items():
            ratio = "1" if name == "engine" else f"{r['ratios'][f'engine_vs_{name}']:.3g}x"
            rows.append(
                [
                    r["block_length"],
                    HYBRID_VARIANTS[name],
                    sig3(v["tokens_per_s"]),
                    v["nfe"],
                    f"{v['tpf']:.2f}",
                    sig3(v["forwards_per_s"]),
                    f"**{ratio}**" if name in HYBRID_TARGETS else ratio,
                    "yes" if r["identical_tokens"] else "NO",
                ]
            )
    return table(["block", "variant", "tokens/s", "NFE", "TPF", "forwards/s", "engine speed-up", "same tokens"], rows)


def compare_quiet(load: Load) -> str:
    rows = []
    for name in ("compare-quiet-block32", "compare-quiet-block4"):
        r = load(name)["result"]["results"][0]
        target = TARGETS[r["block_length"]]
        cells = {}
        for variant in ("separate-commit", "reference"):
            v = r["variants"].get(variant)
            ratio = "" if v is None or variant == target else f" ({r['ratios'][f'engine_vs_{variant}']:.3g}x)"
            cells[variant] = "–" if v is None else f"{sig3(v['tokens_per_s'])} tok/s{ratio}"
        versus = {"reference": "the reference", "separate-commit": "the separate commit"}[target]
        engine = f"{sig3(r['variants']['engine']['tokens_per_s'])} tok/s"
        rows.append(
            [
                r["block_length"],
                f"`{load(name)['command']}`",
                engine,
                cells["separate-commit"],
                cells["reference"],
                f"**{r['ratios'][f'engine_vs_{target}']:.3g}x** vs {versus}",
            ]
        )
    return table(["block", "command", "engine", "separate commit", "reference", "engine speed-up"], rows)


BATCH1_RUNS = (
    "compare-batch1-float32",
    "compare-batch1-bfloat16",
    "compare-batch16-float32",
    "compare-batch1-bfloat16-epyc",
    "compare-batch16-bfloat16-epyc",
)
"""Issue 18's side-by-side runs (docs/benchmarks.md, "Batch-1 speed")."""


def compare_batch1(load: Load) -> str:
    rows = []
    for name in BATCH1_RUNS:
        run = load(name)["result"]
        r = run["results"][0]
        fast = "engine-batched" if "engine-batched" in r["variants"] else "engine"
        for variant, v in r["variants"].items():
            ratio = (
                "1"
                if variant == fast
                else (f"{r['ratios'][f'{fast}_vs_{variant}']:.3g}x" if f"{fast}_vs_{variant}" in r["ratios"] else "")
            )
            rows.append(
                [
                    f"`{name}.json`",
                    run["dtype"],
                    run["workload"]["num_prompts"],
                    VARIANTS[variant],
                    sig3(v["tokens_per_s"]),
                    v["nfe"],
                    sig3(v["forwards_per_s"]),
                    ratio,
                    {True: "yes", False: "NO", None: "-"}[r["identical_tokens"]],
                ]
            )
    return table(
        ["run", "dtype", "prompts", "variant", "tokens/s", "NFE", "forwards/s", "speed-up of (a) / (e)", "same tokens"],
        rows,
    )


def roofline(load: Load) -> str:
    rows = []
    for name in ("latency-b1-float32", "latency-b1-bfloat16", "latency-b1-float32-epyc", "latency-b1-bfloat16-epyc"):
        run = load(name)["result"]
        r, eff = run["result"], run["result"]["efficiency"]
        rows.append(
            [
                f"`{name}.json`",
                run["dtype"],
                f"{r['decode_tokens_per_s']:.1f}",
                ms(r["mean_decode_step_s"]),
                f"{eff['bytes_per_s'] / 1e9:.2f}",
                f"{run['machine']['bandwidth_bytes_per_s'] / 1e9:.2f}",
                f"**{pct(eff['bandwidth_fraction'])}**",
                pct(eff["matmul_fraction"]),
                pct(eff["overhead_fraction"]),
            ]
        )
    return table(
        [
            "run",
            "dtype",
            "decode tokens/s",
            "decode step ms",
            "step GB/s (weights + K/V read)",
            "probe GB/s (same run)",
            "bytes/s vs probe",
            "FLOP/s vs matmul probe",
            "engine overhead",
        ],
        rows,
    )


GDN_RUNS = ("latency-clover-moe-b1-float32", "latency-clover-moe-b1-bfloat16")
"""`bench latency` on clover-moe-bench, batch 1: the GDN layers against their bytes floor."""


def gdn_roofline(load: Load) -> str:
    rows = []
    for name in GDN_RUNS:
        run = load(name)["result"]
        r, gdn = run["result"], run["result"]["gdn"]
        rows.append(
            [
                f"`{name}.json`",
                run["dtype"],
                f"{r['decode_tokens_per_s']:.1f}",
                ms(r["mean_decode_step_s"]),
                ms(gdn["gdn_s_per_step"]),
                pct(gdn["gdn_share_of_step"]),
                f"{gdn['gdn_bytes_per_step'] / 1e6:.1f} MB: {ms(gdn['gdn_bytes_floor_s_per_step'], 2)}",
                f"{gdn['gdn_flops_per_step'] / 1e9:.2f} GFLOP: {ms(gdn['gdn_flops_floor_s_per_step'], 2)}",
                f"**{pct(gdn['gdn_floor_fraction'])}**",
                pct(r["efficiency"]["bandwidth_fraction"]),
                pct(r["efficiency"]["matmul_fraction"]),
            ]
        )
    return table(
        [
            "run",
            "dtype",
            "decode tokens/s",
            "decode step ms",
            "GDN layers ms / step",
            "GDN share of step",
            "GDN bytes floor, ms",
            "GDN FLOP floor, ms",
            "GDN vs its floor",
            "whole step: bytes/s vs probe",
            "FLOP/s vs probe",
        ],
        rows,
    )


def skinny_gemm(load: Load) -> str:
    run = load("skinny-gemm")["result"]
    stream = run["stream_bytes_per_s"]
    rows = [
        [r["dtype"], r["rows"], r["way"], f"{r['bytes_per_s'] / 1e9:.2f}", pct(r["bytes_per_s"] / stream)]
        for r in run["results"]
    ]
    rows.append(["-", "-", "streaming read (sum of 256 MiB)", f"{stream / 1e9:.2f}", "100%"])
    return table(["dtype", "rows per expert", "way", "GB/s of weights", "vs streaming read"], rows)


AB_RUNS = ("ab-engines-1", "ab-engines-2", "ab-engines-3", "ab-engines-compiled")
"""scripts/ab_engines.py runs: engine configurations interleaved in one process."""


def ab_engines(load: Load) -> str:
    rows = []
    for name in AB_RUNS:
        run = load(name)["result"]
        first = run["results"][0]
        label = f"`{name}.json` (load {run['load_average'][0]:.1f})"
        for r in run["results"]:
            rows.append(
                [
                    label,
                    f"`{r['config']}`",
                    f"{r['tokens_per_s']:.1f}",
                    f"{r['forwards_per_s']:.2f}",
                    r["nfe"],
                    f"{r['tokens_per_s'] / first['tokens_per_s']:.2f}x",
                    f"{r['forwards_per_s'] / first['forwards_per_s']:.2f}x",
                    "yes" if r["same_tokens_as_first"] else "no",
                ]
            )
            label = ""
    return table(
        [
            "run",
            "dtype:backend:mode",
            "tokens/s",
            "forwards/s",
            "NFE",
            "tokens/s vs first",
            "forwards/s vs first",
            "same tokens as first",
        ],
        rows,
    )


PROFILE_RUNS = ("profile-float32-loop", "profile-bfloat16-loop")


def profiles(load: Load) -> str:
    rows = []
    for name in PROFILE_RUNS:
        run = load(name)["result"]
        head = (
            f"`{name}.json`: {run['dtype']}, {run['wall_ms_per_forward']:.1f} ms/forward, "
            f"{run['ops_per_forward']:.0f} ops/forward"
        )
        for op in run["top_ops"][:8]:
            rows.append(
                [
                    head,
                    f"`{op['op']}`",
                    pct(op["self_share"]),
                    f"{op['calls_per_forward']:.1f}",
                    f"{op['self_ms_per_forward']:.2f}",
                ]
            )
            head = ""
    return table(["profile", "op", "self time", "calls / forward", "ms / forward"], rows)


def throughput(load: Load) -> str:
    rows = []
    for r in load("throughput")["result"]["results"]:
        eff, lat, ex = r["efficiency"], r["latency"], r["experts"]
        rows.append(
            [
                r["block_length"],
                r["mode"],
                r["num_requests"],
                f"{r['tokens_per_s']:,.1f}",
                f"{r['decode_tokens_per_s']:,.1f}",
                f"{r['tpf']:.2f}",
                f"{r['nfe_per_request']:.1f}",
                f"{r['mean_seqs_per_decode_step']:.1f}",
                ms(r["mean_decode_step_s"]),
                pct(eff["matmul_fraction"]),
                pct(eff["bandwidth_fraction"]),
                pct(eff["overhead_fraction"]),
                f"{ex['experts_touched_per_step']:.1f}",
                f"{ex['experts_touched_per_block']:.1f}",
                f"{lat['ttft_s']['p50']:.2f}",
                f"{lat['e2e_s']['p50']:.1f}",
            ]
        )
    return table(
        [
            "block",
            "mode",
            "requests",
            "tokens/s",
            "decode tokens/s",
            "TPF",
            "NFE/request",
            "seqs/step",
            "step ms",
            "FLOP/s vs matmul",
            "bytes/s vs bandwidth",
            "engine overhead",
            "experts/step",
            "experts/block",
            "TTFT p50 s",
            "E2E p50 s",
        ],
        rows,
    )


CALIBRATION_RUNS = (
    "throughput",
    "latency-batch1",
    "latency-batch8",
    "throughput-51c63cc",
    "throughput-9d82d21",
    "latency-batch1-51c63cc",
    "latency-batch8-51c63cc",
    "calibration-clover-moe",
)


def calibration(load: Load) -> str:
    rows = []
    for name in CALIBRATION_RUNS:
        run, check = load(name)["result"], load(name)["calibrate"]["result"]["calibration"]
        c, work = run["calibration"], run["calibration"]["workload"]
        what = (
            f"throughput, {work['num_seqs']} concurrent, block {work['block_length']}"
            if run["bench"] == "throughput"
            else f"latency `--batch-size {work['num_seqs']}`"
        )
        if run.get("model", {}).get("name", "").startswith("clover-moe-bench"):
            what += ", clover-moe-bench"
        rows.append(
            [
                f"{what} (git {run['environment']['git']['sha']}, `{name}.json`)",
                f"{c['achieved_flops_fraction']:.2f}, {ms(c['step_overhead_s'])} ms",
                f"{check['predicted_tokens_per_s']:.1f}",
                f"{check['measured_tokens_per_s']:.1f}",
                f"{check['relative_error']:+.1%}",
            ]
        )
    return table(["bench run", "fitted MFU, overhead", "predicted decode tokens/s", "measured", "error"], rows)


def latency(load: Load) -> str:
    rows = []
    for name in ("latency-batch1", "latency-batch8"):
        run = load(name)["result"]
        lat, r = run["batch_latency_s"], run["result"]
        rows.append(
            [
                run["workload"]["batch_size"],
                " / ".join(f"{lat[k]:.3g}" for k in ("mean", "p50", "p99")),
                f"{r['tokens_per_s']:.1f}",
                f"{r['tpf']:.2f}",
                f"{r['nfe_per_request']:.1f}",
                f"{r['latency']['ttft_s']['p50']:.2f}",
                ms(r["latency"]["tpot_s"]["p50"]),
                pct(r["efficiency"]["matmul_fraction"]),
                pct(r["efficiency"]["overhead_fraction"]),
            ]
        )
    return table(
        [
            "batch",
            "latency mean / p50 / p99 s",
            "tokens/s",
            "TPF",
            "NFE/request",
            "TTFT p50 s",
            "TPOT p50 ms",
            "FLOP/s vs matmul",
            "overhead",
        ],
        rows,
    )


def serve(load: Load) -> str:
    rows = []
    for p in load("serve")["result"]["results"]:
        what = (
            f"{p['concurrency']} concurrent" if p["load"] == "concurrency" else f"Poisson {p['request_rate']:g} req/s"
        )
        rows.append(
            [
                what,
                p["completed"],
                p["errors"],
                f"{p['output_tokens_per_s']:.1f}",
                f"{p['request_throughput']:.3f}",
                f"{p['goodput_requests_per_s']:.3f} ({p['goodput_fraction']:.0%})",
                f"{p['ttft_s']['p50']:.2f} / {p['ttft_s']['p99']:.2f}",
                ms(p["tpot_s"]["p50"]),
                ms(p["itl_chunk_s"]["p50"], 0),
                ms(p["itl_token_s"]["p50"]),
                f"{p['e2e_s']['p50']:.2f} / {p['e2e_s']['p99']:.2f}",
            ]
        )
    return table(
        [
            "load",
            "ok",
            "errors",
            "output tok/s",
            "req/s",
            "goodput req/s (TTFT 2 s, TPOT 200 ms)",
            "TTFT p50 / p99 s",
            "TPOT p50 ms",
            "ITL per chunk p50 ms",
            "ITL per token p50 ms",
            "E2E p50 / p99 s",
        ],
        rows,
    )


# --- docs/moe.md ----------------------------------------------------------------------------------------------

DISPATCH_PATHS = {
    "grouped": "grouped (sorted runs)",
    "per_expert_loop": "per-expert loop over one-hot-gathered tokens (the usual implementation)",
    "dense_matmul": "dense matmuls with the same FLOPs (the yardstick)",
    "loop_per_request": "for context: the same loop per request's block (no step-level batching)",
}


def moe_dispatch(load: Load) -> str:
    new, old = load("moe")["result"]["dispatch"], load("moe-4d24bfc")["result"]["dispatch"]
    rows = []
    for key, label in DISPATCH_PATHS.items():
        # GFLOP/s = the expert matmuls' FLOPs over the path's time, as the bench computes it.
        rates = [d["expert_gflop"] / d["seconds"][key] for d in (new, old)]
        rows.append(
            [label, f"{ms(new['seconds'][key])} ({ms(old['seconds'][key])})", f"{rates[0]:.1f} ({rates[1]:.1f})"]
        )
    head = (
        f"dispatch path ({new['num_moe_layers']} layers, {new['tokens']} tokens, {new['expert_gflop']:.2f} "
        "GFLOP of expert matmuls)"
    )
    return table([head, "ms / step", "GFLOP/s"], rows)


def moe_backends(load: Load) -> str:
    rows = []
    for name in ("moe-backends-batch1", "moe-backends-batch16"):
        d = load(name)["result"]["dispatch"]
        loop = d["seconds"]["grouped"]
        cells = [f"{ms(d['seconds'][k], 2)} ({loop / d['seconds'][k]:.2f}x)" for k in ("grouped", "padded_bmm")]
        rows.append(
            [
                f"`{name}.json`",
                d["tokens"],
                f"{d['experts_touched_per_layer']:.1f}",
                *cells,
                ms(d["seconds"]["dense_matmul"], 2),
            ]
        )
    return table(
        [
            "run",
            "tokens / step",
            "experts touched / layer",
            "loop ms (x loop)",
            "bmm ms (x loop)",
            "dense matmul ms (same FLOPs)",
        ],
        rows,
    )


def moe_offload(load: Load) -> str:
    rows = [
        [
            f"{r['cache_fraction']:.0%} ({r['slots_per_layer']} slots per layer)",
            r["residency"],
            f"{r['hit_rate']:.3f}",
            f"{r['bytes_per_generated_token'] / 1e6:.3f}",
            r["residency_loads"],
            r["fetches"],
            r["host_computes"],
            "yes" if r["tokens_identical"] else "NO",
        ]
        for r in load("moe")["result"]["offload"]
        if r["cache_fraction"] is not None
    ]
    return table(
        [
            "expert cache",
            "residency",
            "hit rate",
            "MB moved / generated token",
            "residency loads",
            "fetches",
            "host computes",
            "tokens = no offload",
        ],
        rows,
    )


# --- docs/default-model.md ------------------------------------------------------------------------------------

TASKS = ("add", "reverse", "sort", "copy", "max", "lookup")
TRAINING_RUNS = {
    "train-clover-moe-3200": "clover_moe (ships), seed 0, 3,200 steps",
    "train-clover-moe-3200-rerun": "clover_moe, seed 0, 3,200 steps (retrained)",
    "train-clover-moe-3200-no-json": "clover_moe, seed 0, 3,200 steps, mix without add_json",
    "train-clover-moe-seed0": "clover_moe, seed 0, 3,000 steps, the sdar mix",
    "train-clover-moe-2000steps": "clover_moe, seed 0, 2,000 steps, the sdar mix",
    "train-seed0": "sdar (shipped before), seed 0",
    "train-seed0-retrain": "sdar, seed 0 (retrained)",
    "train-seed1": "sdar, seed 1",
}


def training(load: Load) -> str:
    rows = []
    for name, label in TRAINING_RUNS.items():
        r = load(name)["result"]
        cpu = f"{r['train_cpu_seconds']:,.0f} s" if "train_cpu_seconds" in r else "not kept"
        rows.append(
            [
                label,
                f"{r['train_seconds']:,.0f} s",
                cpu,
                f"{r['steps']:,}",
                f"**{pct(r['accuracy'], ' ')}**",
                *(pct(r["accuracy_by_task"][t], " ") for t in TASKS),
                f"{r['tokens_per_forward']:.2f}",
                f"`{r['weights_sha256'][:8]}...`",
            ]
        )
    return table(
        ["run", "training wall time", "CPU time", "steps", "accuracy", *TASKS, "TPF", "SHA-256 of the weights"], rows
    )


def accuracy_vs_tpf(load: Load) -> str:
    run = load("eval")["result"]
    default = f"default ({run['defaults']['decoder']} {run['defaults']['threshold']:g})"
    rows = [
        [
            default if r["decoding"] == "default" else r["decoding"],
            pct(r["accuracy"], " "),
            *(pct(r["accuracy_by_task"][t], " ") for t in TASKS),
            f"{r['tokens_per_forward']:.2f}",
            f"{r['nfe_per_example']:.2f}",
        ]
        for r in run["results"]
    ]
    return table(["decoding", "accuracy", *TASKS, "TPF", "NFE / example"], rows)


def structured_tpf(load: Load) -> str:
    run = load("structured-tpf")["result"]
    rows = [
        [
            name,
            "-" if r["correct"] is None else f"{r['correct']} / {r['prompts']}",
            r["tokens"],
            r["forwards"],
            f"{r['tpf']:.2f}",
        ]
        for name, r in run.items()
    ]
    return table(["prompts, output constraint", "correct", "tokens", "forwards", "TPF"], rows)


TABLES: dict[str, Callable[[Load], str]] = {
    "compare": compare,
    "compare-quiet": compare_quiet,
    "compare-hybrid": compare_hybrid,
    "throughput": throughput,
    "calibration": calibration,
    "compare-batch1": compare_batch1,
    "profiles": profiles,
    "moe-backends": moe_backends,
    "roofline": roofline,
    "ab-engines": ab_engines,
    "gdn-roofline": gdn_roofline,
    "skinny-gemm": skinny_gemm,
    "latency": latency,
    "serve": serve,
    "moe-dispatch": moe_dispatch,
    "moe-offload": moe_offload,
    "training": training,
    "accuracy-vs-tpf": accuracy_vs_tpf,
    "structured-tpf": structured_tpf,
}


def render(text: str, load: Load = load_results) -> str:
    """`text` with every results region rewritten; KeyError names a region no table renders."""

    def fill(match: re.Match) -> str:
        name = match.group(2)
        if name not in TABLES:
            raise KeyError(f"results region {name!r}: no such table; known: {', '.join(TABLES)}")
        return f"{match.group(1)}\n{TABLES[name](load)}\n\n{match.group(4)}"

    return REGION.sub(fill, text)


def record(name: str, output: Path, command: list[str]) -> Path:
    """Stores the last JSON line of a command's output as docs/results/NAME.json."""
    lines = [line for line in output.read_text().splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"record: {output} holds no JSON line; pass the file the command's stdout went to")
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    data = {"command": " ".join(command), "git": sha.stdout.strip() or None, "result": json.loads(lines[-1])}
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
