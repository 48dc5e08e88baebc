"""The `bench sweep` table of docs/benchmarks/throughput.md: per family, the engine against its batched peer at each
concurrency and workload, with the command that produced it (results sweep-<family>), and, where an earlier run of
the same command is kept (results sweep-<family>-<git>), that run's engine / peer ratio and overhead beside each
row."""

from __future__ import annotations

from typing import Any

from scripts.doc_tables.cells import Load, ms, sig3, table

FAMILIES = (
    "sdar",
    "llada2",
    "clover",
    "diffusiongemma",
    "sdar-bench",
    "llada2-bench",
    "clover-bench",
    "diffusiongemma-bench",
)
"""The results files sweep-<name>, in the order the tables show them (the tiny test shapes, then the bench shapes:
sdar-moe-bench, llada2-bench, clover-moe-bench, diffusiongemma-bench)."""
BEFORE = {
    "sdar": "sdar-0573c6d",
    "llada2": "llada2-0573c6d",
    "clover": "clover-e66cb12",
    "diffusiongemma": "diffusiongemma-0573c6d",
    "sdar-bench": "sdar-bench-63e3794",
    "clover-bench": "clover-bench-e66cb12",
    "diffusiongemma-bench": "diffusiongemma-bench-2192eb7",
}
"""Family -> the results file sweep-<family>-<commit> of the same command on the code of an earlier commit (0573c6d:
after the step's paged metadata as tensors, the batched renoise draws and the batched
greedy mask decode; 63e3794: the SDAR bench shape before those, at 16 and 64 concurrent only; e66cb12: Clover
before its GDN layers read their state slots in place; diffusiongemma-bench-2192eb7: the
same engine code timed with the LM head alone as the model's time, before the probe counted DiffusionGemma's logit
soft cap and self-conditioning pass as the model's)."""
HEADERS = [
    "reading: peer",
    "workload",
    "conc.",
    "engine tok/s",
    "peer tok/s",
    "engine / peer",
    "TTFT p50 / p99 ms: engine",
    "peer",
    "ITL p50 / p99 ms: engine",
    "peer",
    "peak MiB: engine",
    "peer",
    "engine overhead",
    "same tokens",
    "static-batch ceiling",
]


def _pair(stats: dict[str, float | None]) -> str:
    p50, p99 = stats["p50"], stats["p99"]
    return "–" if p50 is None or p99 is None else f"{ms(p50, 0)} / {ms(p99, 0)}"


def _mib(value: int | None) -> str:
    return "–" if value is None else f"{value / 2**20:.1f}"


def _verdict(text: str, row: dict[str, Any], targets: list[dict[str, Any]], what: str) -> str:
    """`text`, followed by the verdict of the row's target on `what` (ratio, overhead) where it has one."""
    for t in targets:
        key = (t["reading"], t["workload"], t["concurrency"], t["what"])
        if key == (row["reading"], row["workload"], row["concurrency"], what):
            return f"{text} ({'met' if t['met'] else '**not met**'}: {t['target']})"
    return text


def _before(row: dict[str, Any], before: dict[tuple[str, str, int], dict[str, Any]]) -> list[str]:
    """The earlier run's ratio and overhead on the row's reading, workload and concurrency (– where it has none)."""
    old = before.get((row["reading"], row["workload"], row["concurrency"]))
    if old is None:
        return ["–", "–"]
    return [f"{old['ratio']:.2f}x", f"{100 * old['engine']['overhead_fraction']:.0f} %"]


CANVAS_FAMILIES = ("diffusion_gemma",)
"""Families whose block is a renoise canvas: every request costs whole canvases (each denoised for the same number
of steps, whatever its max_tokens), in the engine and in transformers' `generate` alike."""


def _ceiling(row: dict[str, Any], output_tokens: int, family: str) -> str:
    """What a perfect continuous batcher could gain over a static batch on the row's requests when a block costs
    the same whatever else is batched (bench/sweep_metrics.static_batch_ceiling, in blocks: recorded by runs since
    this column was added). Older runs recorded only the total tokens: for them, (rows x longest) / tokens, the
    same ratio counted in tokens (marked "tok"), and for a renoise canvas one canvas per request on both sides
    (outputs no longer than a canvas): 1.00x."""
    if row["workload"] == "best-case":
        return "–"
    if "static_batch_ceiling" in row:
        return f"{row['static_batch_ceiling']:.2f}x"
    tokens = row["engine"]["generated_tokens"]
    if family in CANVAS_FAMILIES and output_tokens <= row["block_length"]:
        return "1.00x"
    return f"{row['concurrency'] * output_tokens / tokens:.2f}x tok" if tokens else "–"


def _row(row: dict[str, Any], targets: list[dict[str, Any]], output_tokens: int, family: str) -> list[str]:
    e, p = row["engine"], row["peer_result"]
    same = "–" if row["same_tokens"] is None else ("yes" if row["same_tokens"] else "no")
    return [
        f"{row['reading']}: {row['peer']}",
        row["workload"],
        str(row["concurrency"]),
        sig3(e["tokens_per_s"]),
        sig3(p["tokens_per_s"]),
        _verdict(f"{row['ratio']:.2f}x", row, targets, "ratio"),
        _pair(e["ttft_s"]),
        _pair(p["ttft_s"]),
        _pair(e["itl_s"]),
        _pair(p["itl_s"]),
        _mib(e["peak_memory_bytes"]),
        _mib(p["peak_memory_bytes"]),
        _verdict(f"{100 * e['overhead_fraction']:.0f} %", row, targets, "overhead"),
        same,
        _ceiling(row, output_tokens, family),
    ]


def _family(load: Load, family: str) -> str:
    """One family's heading (model, commit, command) and table, with the earlier run's columns where BEFORE has one."""
    data = load(f"sweep-{family}")
    result = data["result"]
    workload = result["workload"]
    rows = [_row(r, result["targets"], workload["output_tokens"], workload["family"]) for r in result["results"]]
    headers = HEADERS
    if family in BEFORE:
        old = load(f"sweep-{BEFORE[family]}")
        before = {(r["reading"], r["workload"], r["concurrency"]): r for r in old["result"]["results"]}
        rows = [cells + _before(r, before) for cells, r in zip(rows, result["results"], strict=True)]
        commit = BEFORE[family].rsplit("-", 1)[1]
        headers = [*HEADERS, f"before ({commit}): engine / peer", "before: overhead"]
    git = f", git {data['git']}" if data.get("git") else ""
    head = f"**{result['workload']['family']}** ({result['model']['name']}{git}): `{data['command']}`"
    return f"{head}\n\n{table(headers, rows)}"


def sweep(load: Load) -> str:
    return "\n\n".join(_family(load, family) for family in FAMILIES)


PHASE_NAMES = ("schedule", "batch", "forward", "decode", "update", "outputs")
"""engine/step_phases.py's PHASES (the renderers do not import the package)."""


def phases(load: Load) -> str:
    """The engine's step phases at 128 concurrent, microseconds per request-step, for every sweep run that recorded
    them (engine/step_phases.py): where the engine's per-request time goes beside the forward."""
    rows = []
    for family in FAMILIES:
        data = load(f"sweep-{family}")
        result = data["result"]
        for row in result["results"]:
            figures = row["engine"].get("phases_us_per_request_step")
            if figures is None or row["concurrency"] != 128:
                continue
            rows.append(
                [f"{result['model']['name']} (git {data['git']}): {row['reading']}", row["workload"]]
                + [f"{figures[name]:.1f}" for name in PHASE_NAMES]
                + [f"{sum(figures[name] for name in PHASE_NAMES if name != 'forward'):.1f}"]
            )
    headers = ["model: reading", "workload", *(f"{name} µs" for name in PHASE_NAMES), "all but the forward µs"]
    return table(headers, rows)


PREFILL_BUDGETS = (4096, 128, 256, 512)
"""The results files sweep-prefill-<tokens>-r<run>: runs of the same sweep row per --max-prefill-tokens (4096, the
step's whole budget, is the engine without a prefill budget of its own; 256 the CPU default)."""
PREFILL_RUNS = 3


def _median_range(values: list[float], fmt: str) -> str:
    ordered = sorted(values)
    return f"{fmt.format(ordered[len(ordered) // 2])} ({fmt.format(ordered[0])}–{fmt.format(ordered[-1])})"


def prefill_budget(load: Load) -> str:
    """Clover's autoregressive reading at 128 concurrent, realistic workload, per prefill budget, over its runs:
    throughput, TTFT p50 and the ITL p99 / p50 ratio (median, and the runs' range), and the steps."""
    rows, first = [], None
    for tokens in PREFILL_BUDGETS:
        runs = [load(f"sweep-prefill-{tokens}-r{run}") for run in range(1, PREFILL_RUNS + 1)]
        first = first or runs[0]
        engines = [data["result"]["results"][0]["engine"] for data in runs]
        rows.append(
            [
                f"{tokens} (no budget of its own)" if tokens == PREFILL_BUDGETS[0] else str(tokens),
                _median_range([e["tokens_per_s"] for e in engines], "{:.0f}"),
                _median_range([1000 * e["ttft_s"]["p50"] for e in engines], "{:,.0f}"),
                _median_range([1000 * e["itl_s"]["p50"] for e in engines], "{:.0f}"),
                _median_range([1000 * e["itl_s"]["p99"] for e in engines], "{:.0f}"),
                _median_range([e["itl_s"]["p99"] / e["itl_s"]["p50"] for e in engines], "{:.1f}x"),
                str(engines[0]["num_steps"]),
            ]
        )
    assert first is not None
    head = (
        f"`{first['command']}` (git {first['git']}; each row with its own --max-prefill-tokens, "
        f"{PREFILL_RUNS} runs each: median (lowest–highest))"
    )
    headers = ["max_prefill_tokens", "engine tok/s", "TTFT p50 ms", "ITL p50 ms", "ITL p99 ms", "ITL p99 / p50"]
    headers.append("steps")
    return f"{head}\n\n{table(headers, rows)}"
