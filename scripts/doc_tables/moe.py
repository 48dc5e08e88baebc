"""The tables of docs/serving/moe.md and docs/benchmarks/moe.md from `bench moe`: the expert backends per step, the
dispatch paths against dense matmuls of the same FLOPs, and expert offload's cache hit rates and bytes moved."""

from __future__ import annotations

from scripts.doc_tables.cells import Load, ms, table


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
