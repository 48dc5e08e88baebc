"""The tables of docs/benchmarks/ (throughput.md, latency.md), docs/planning/calibration.md and
docs/serving/adapters.md from `bench throughput`, the planner's calibration, `bench latency`, `bench serve` and
`bench adapters`: many requests at once, and what a client of `diffuserve serve` sees."""

from __future__ import annotations

from collections.abc import Callable

from scripts.doc_tables.cells import Load, ms, pct, table


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


def gateway(load: Load) -> str:
    """`scripts/bench_gateway.py`: bench serve straight to one server, then through a gateway per policy."""
    rows = []
    for p in load("gateway")["result"]["points"]:
        hit = p["prefix_hit_rate"]
        rows.append(
            [
                "none (direct)" if p["gateway"] == "none" else p["gateway"],
                p["policy"],
                p["replicas"],
                f"{p['completed']} / {p['errors']}",
                f"{p['output_tokens_per_s']:.1f}",
                f"{p['ttft_s']['p50']:.2f} / {p['ttft_s']['p99']:.2f}",
                f"{ms(p['itl_chunk_s']['p50'], 0)} / {ms(p['itl_chunk_s']['p99'], 0)}",
                f"{p['e2e_s']['p50']:.2f} / {p['e2e_s']['p99']:.2f}",
                "n/a" if hit is None else pct(hit),
            ]
        )
    return table(
        [
            "gateway",
            "policy",
            "replicas",
            "ok / errors",
            "output tok/s",
            "TTFT p50 / p99 s",
            "ITL per chunk p50 / p99 ms",
            "E2E p50 / p99 s",
            "prefix hit rate",
        ],
        rows,
    )


def adapters(load: Load) -> str:
    run = load("bench-adapters")["result"]
    rows = [
        [r["variant"], f"{r['tokens_per_s']:,.0f}", f"{r['wall_s']:.3f}", f"{r['vs_base']:.2f}x"]
        for r in run["results"]
    ]
    return table(["variant", "tokens/s", "wall s (best)", "vs the base model alone"], rows)


RATE_UNITS = {"tokens_per_s": "tok/s", "request_steps_per_s": "request-steps/s"}
"""How a recorded A/B's rate (its JSON's `rate`) is labelled."""


def ab_commits(name: str) -> Callable[[Load], str]:
    """The table of a recorded `scripts/ab_commits.py` run `name`: its rate (tokens/s unless it names another) per
    row at both revisions."""

    def render(load: Load) -> str:
        result = load(name)["result"]
        revisions = result["revisions"]
        unit = RATE_UNITS[result.get("rate", "tokens_per_s")]
        return table(
            ["row", f"before ({revisions['old']}) {unit}", f"after ({revisions['new']}) {unit}", "after / before"],
            [[r["row"], f"{r['old']:.0f}", f"{r['new']:.0f}", f"**{r['ratio']:.2f}x**"] for r in result["rows"]],
        )

    return render


def ab_phases(name: str) -> Callable[[Load], str]:
    """The step phases of a recorded `scripts/ab_commits.py --phases` run `name`: microseconds per request-step of
    each row's phase at both revisions (the forward, whose code neither revision changed, is the run's control)."""

    def render(load: Load) -> str:
        result = load(name)["result"]
        revisions = result["revisions"]
        return table(
            ["row: phase", f"before ({revisions['old']}) µs", f"after ({revisions['new']}) µs", "after / before"],
            [[r["row"], f"{r['old']:.1f}", f"{r['new']:.1f}", f"**{r['ratio']:.2f}x**"] for r in result["phase_rows"]],
        )

    return render


def ab_rates_and_phases(name: str) -> Callable[[Load], str]:
    """A recorded `scripts/ab_commits.py --phases` run `name`: its rates' table, then its phases'."""
    rates, phases = ab_commits(name), ab_phases(name)
    return lambda load: f"{rates(load)}\n\n{phases(load)}"


def serve_whole(name: str) -> Callable[[Load], str]:
    """A recorded `scripts/serve_whole.py` run `name`: per mode, tokens/s and the engine's outputs phase per
    generated token (the server's /metrics)."""

    def render(load: Load) -> str:
        rows = load(name)["result"]["rows"]
        return table(
            ["mode", "tok/s", "outputs phase µs per token"],
            [[r["row"], f"{r['tokens_per_s']:.0f}", f"**{r['outputs_us_per_token']:.1f}**"] for r in rows],
        )

    return render


def decode_cases(load: Load) -> str:
    """`scripts/decode_cases.py` before and after: per case, the decode and outputs phases (microseconds per
    request-step) and tokens/s."""
    before, after = ({r["row"]: r for r in load(name)["result"]["rows"]} for name in DECODE_CASES)
    rows = []
    for case, new in after.items():
        old = before[case]
        old_phases, new_phases = old["phases_us_per_request_step"], new["phases_us_per_request_step"]
        rows.append(
            [
                case,
                f"{old_phases['decode']:.0f} -> **{new_phases['decode']:.0f}**",
                f"{old_phases['outputs']:.0f} -> {new_phases['outputs']:.0f}",
                f"{old_phases['forward']:.0f} -> {new_phases['forward']:.0f}",
                f"{old['tokens_per_s']:.0f} -> {new['tokens_per_s']:.0f}",
            ]
        )
    return table(["case", "decode µs", "outputs µs", "forward µs", "tokens/s"], rows)


DECODE_CASES = ("decode-cases-before", "decode-cases-after")
"""scripts/decode_cases.py at the revision before the batched sampled / logprobs / penalised pass and after it."""


def decode_engines(name: str, other: str = "overlapped") -> Callable[[Load], str]:
    """A recorded `scripts/decode_cases.py --engines plain <other>` run `name`: per case, each engine's median
    tokens/s over the interleaved rounds (their range) and the ratio of the medians; the outputs and forward phases
    of each engine's fastest round (microseconds per request-step)."""

    def render(load: Load) -> str:
        rows: dict[str, dict[str, dict]] = {}
        for r in load(name)["result"]["rows"]:
            case, engine = r["row"].split(", ")
            rows.setdefault(case, {})[engine] = r
        cells = []
        for case, engines in rows.items():
            plain, variant = engines["plain"], engines[other]
            ratio = variant["median_tokens_per_s"] / plain["median_tokens_per_s"]
            cells.append(
                [case, _median_and_range(plain), _median_and_range(variant), f"**{ratio:.2f}x**"]
                + [
                    f"{plain['phases_us_per_request_step'][phase]:.0f} -> "
                    f"{variant['phases_us_per_request_step'][phase]:.0f}"
                    for phase in ("outputs", "forward")
                ]
            )
        headers = ["case", "plain tok/s", f"{other} tok/s", f"{other} / plain", "outputs µs", "forward µs"]
        return table(headers, cells)

    return render


def _median_and_range(row: dict) -> str:
    low, high = row["range_tokens_per_s"]
    return f"{row['median_tokens_per_s']:.0f} ({low:.0f}-{high:.0f})"
