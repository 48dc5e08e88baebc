"""The tables of docs/benchmarks/latency.md's "Batch-1 speed" section: the side-by-side batch-1 runs, the operator
profiles, the roofline of a decode step, the interleaved engine configurations, the GEMM library's bytes/s at
expert shapes and the hybrid model's GDN layers against their floor."""

from __future__ import annotations

from scripts.doc_tables.benchmarks_compare import VARIANTS
from scripts.doc_tables.cells import Load, ms, pct, sig3, table

BATCH1_RUNS = (
    "compare-batch1-float32",
    "compare-batch1-bfloat16",
    "compare-batch16-float32",
    "compare-batch1-bfloat16-epyc",
    "compare-batch16-bfloat16-epyc",
)
"""The side-by-side batch-1 runs (docs/benchmarks/latency.md, "Batch-1 speed")."""


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


def skinny_gemm(load: Load) -> str:
    run = load("skinny-gemm")["result"]
    stream = run["stream_bytes_per_s"]
    rows = [
        [r["dtype"], r["rows"], r["way"], f"{r['bytes_per_s'] / 1e9:.2f}", pct(r["bytes_per_s"] / stream)]
        for r in run["results"]
    ]
    rows.append(["-", "-", "streaming read (sum of 256 MiB)", f"{stream / 1e9:.2f}", "100%"])
    return table(["dtype", "rows per expert", "way", "GB/s of weights", "vs streaming read"], rows)


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


def redesign32_ab(load: Load) -> str:
    """The families / decoders redesign's CPU-time A/B (scripts/ab_cpu_time.py), new / old per model and concurrency."""
    rows = []
    for name in ("redesign32-ab-cpu-sdar", "redesign32-ab-cpu-clover"):
        run = load(name)["result"]
        for row in run["rows"]:
            rows.append(
                [
                    run["model"],
                    row["concurrency"],
                    f"{row['old_cpu_ms']:.2f}",
                    f"{row['new_cpu_ms']:.2f}",
                    f"{row['ratio']:.3f}",
                    run["revisions"]["new"],
                ]
            )
    return table(["model", "concurrent", "old (6075498) ms/token", "new ms/token", "new / old", "new"], rows)
