"""The tables of docs/benchmarks/quantization.md: batch-1 latency per weight format,
the peak host memory of loading, and the bundled model's accuracy and TPF per format."""

from __future__ import annotations

from scripts.doc_tables.cells import Load, sig3, table

QUANT_LATENCY_RUNS = ("latency-quant-sdar", "latency-quant-clover", "latency-quant-sdar-fp32")


def quant_latency(load: Load) -> str:
    rows = []
    for name in QUANT_LATENCY_RUNS:
        run = load(name)["result"]
        base = run["variants"][0]  # the unquantized run: "vs 16/32-bit" below
        for v in run["variants"]:
            r = v["result"]
            rows.append(
                [
                    f"`{name}.json`",
                    run["model"]["name"].split(" ")[0],
                    v["weight_dtype"],
                    f"{v['weight_bytes'] / 2**20:.1f}",
                    f"{v['weight_bytes_per_forward'] / 1e6:.1f}",
                    f"{v['weight_bytes_per_forward'] / base['weight_bytes_per_forward']:.2f}x",
                    sig3(r["decode_tokens_per_s"]),
                    f"{r['decode_tokens_per_s'] / base['result']['decode_tokens_per_s']:.2f}x",
                    f"{1000 * r['mean_decode_step_s']:.1f}",
                    f"{base['result']['mean_decode_step_s'] / r['mean_decode_step_s']:.2f}x",
                    f"{r['tpf']:.2f}",
                ]
            )
    return table(
        [
            "run",
            "model",
            "weights",
            "MiB",
            "MB read / forward",
            "vs first",
            "decode tok/s",
            "vs first",
            "ms / step",
            "vs first",
            "TPF",
        ],
        rows,
    )


def load_memory(load: Load) -> str:
    rows = []
    for name in ("load-memory-before", "load-memory"):
        for r in load(name)["result"]["rows"]:
            gib = 2**30
            rows.append(
                [
                    f"`{name}.json`",
                    r["quantization"],
                    f"{r['peak_rss'] / gib:.2f}",
                    f"{r['baseline_rss'] / gib:.2f}",
                    f"{r['weights'] / gib:.2f}",
                    f"{r['largest_shard'] / gib:.2f}",
                    f"{r['bound'] / gib:.2f}",
                    "yes" if r["within_bound"] else "NO",
                    f"{r['seconds']:.1f}",
                ]
            )
    return table(
        [
            "run",
            "quantization",
            "peak RSS GiB",
            "baseline GiB",
            "weights GiB",
            "largest shard GiB",
            "bound GiB",
            "within",
            "load s",
        ],
        rows,
    )


def quant_accuracy(load: Load) -> str:
    rows = []
    for name in ("eval-quant-bf16", "eval-quant-int8", "eval-quant-int4", "eval-quant-fp8"):
        run = load(name)["result"]
        default = run["results"][0]
        rows.append(
            [
                f"`{name}.json`",
                run.get("quantization") or "none (bf16)",
                f"{100 * default['accuracy']:.1f}",
                f"{default['tokens_per_forward']:.2f}",
                run["num_examples"],
            ]
        )
    return table(["run", "quantization", "accuracy %", "TPF", "examples"], rows)


def quant_kl(load: Load) -> str:
    run = load("quant-kl")["result"]
    rows = [[r["family"], r["method"], f"{r['kl']:.2e}", f"{100 * r['top1_agreement']:.1f}"] for r in run["rows"]]
    return table(["family", "weights", "KL(bf16 || quantized) nats / position", "top-1 same %"], rows)


def long_context_chunks(load: Load) -> str:
    """Prefill time of each 8K chunk as the context grows, bf16 K/V beside fp8 K/V (scripts/long_context.py)."""
    runs = load("long-context")["result"]["runs"]
    names = [r["cache_dtype"] for r in runs]
    rows = []
    for i, chunk in enumerate(runs[0]["chunks"]):
        rows.append([i + 1, f"{chunk['context_end']:,}", *(f"{r['chunks'][i]['seconds']:.2f}" for r in runs)])
    return table(["chunk", "context after it", *(f"{n} K/V s" for n in names)], rows)


def long_context_summary(load: Load) -> str:
    """Per K/V dtype: prefill and decode time, the request's K/V + state bytes against the planner's, peak RSS."""
    result = load("long-context")["result"]
    rows = []
    for r in result["runs"]:
        engine, plan = r["engine_bytes"], r["planned_bytes"]
        rows.append(
            [
                "`long-context.json`",
                r["cache_dtype"],
                f"{r['prompt_tokens']:,} + {r['output_tokens']}",
                f"{sum(c['seconds'] for c in r['chunks']):.1f}",
                f"{1000 * r['decode_mean_s']:.1f}",
                f"{engine['kv'] / 2**20:.2f} + {engine['state'] / 2**10:.1f} KiB",
                f"{plan['kv'] / 2**20:.2f} + {plan['state'] / 2**10:.1f} KiB",
                "yes" if engine["kv"] + engine["state"] == plan["kv"] + plan["state"] else "no",
                f"{r['peak_rss'] / 2**30:.2f}",
            ]
        )
    return table(
        [
            "run",
            "K/V",
            "tokens",
            "prefill s",
            "decode ms / step",
            "engine K/V MiB + state",
            "planned",
            "equal",
            "peak RSS GiB",
        ],
        rows,
    )
