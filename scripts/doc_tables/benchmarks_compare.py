"""The `bench compare` tables of docs/benchmarks/ (against-peers.md, decoders.md, throughput.md): the engine against its
baselines on sdar-moe-bench (`compare`, `compare-quiet`) and on the hybrid clover-moe-bench (`compare-hybrid`);
autoregressive, diffusion and verified decoding on the bundled model (`compare-verified`) and on clover-moe-bench
(`compare-verified-clover-moe`); DiffusionGemma against transformers' `generate` with the engine's overhead at 128
concurrent (`compare-renoise`, `renoise-overhead`)."""

from __future__ import annotations

from scripts.doc_tables.cells import Load, sig3, table

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


VERIFIED_ROWS = {
    "ar": "(d) autoregressive (block length 1)",
    "engine": "(a) diffusion: threshold decoder",
    "verified": "(i) verified: one-forward drafts, causal check",
    "auto": "(i) auto: drafts while they pay, else autoregressive",
    "ar-batched": "(d) autoregressive, all prompts at once",
    "engine-batched": "(e) diffusion, all prompts at once",
    "verified-batched": "(i) verified, all prompts at once",
    "auto-batched": "(i) auto, all prompts at once",
}
"""The rows of the verified-decoding tables, in order: those the run measured."""
AUTOREGRESSIVE_PEER = {"verified": "ar", "auto": "ar", "verified-batched": "ar-batched", "auto-batched": "ar-batched"}


def compare_verified(load: Load) -> str:
    """Autoregressive, diffusion, verified and auto decoding of the same prompts on the bundled model, one at a time
    and 16 at once (`compare-verified`)."""
    return _verified_table(load, "compare-verified")


def compare_verified_64(load: Load) -> str:
    """The same prompts, 64 at once (`compare-verified-64`)."""
    return _verified_table(load, "compare-verified-64")


def compare_verified_clover_moe(load: Load) -> str:
    """The same on the random clover-moe-bench shape (`compare-verified-clover-moe`)."""
    return _verified_table(load, "compare-verified-clover-moe")


def _verified_table(load: Load, name: str) -> str:
    record = load(name)["result"]
    r, at_once = record["results"][0], record["workload"]["num_prompts"]
    rows = []
    for variant, label in VERIFIED_ROWS.items():
        v = r["variants"].get(variant)
        if v is None:
            continue
        accepted = f"{v['acceptance_rate']:.0%} / {v['mean_acceptance_length']:.2f}" if "acceptance_rate" in v else "–"
        peer = AUTOREGRESSIVE_PEER.get(variant)
        ratio = r["ratios"].get(f"{variant}_vs_{peer}") if peer else None
        concurrent = at_once if variant.endswith("-batched") else 1
        speed = "–" if ratio is None else f"{ratio:.2f}x"
        rows.append([label, concurrent, sig3(v["tokens_per_s"]), v["nfe"], f"{v['tpf']:.2f}", accepted, speed])
    header = ["variant", "concurrent", "tokens/s", "NFE", "TPF", "drafts kept / tokens per checked draft", "vs AR"]
    return table(header, rows)


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


HYBRID_VARIANTS = {
    "engine": "(a) engine: state pool + paged K/V, fused commit",
    "reference": "(b) naive clover_moe decode: prefix recomputed every step",
    "recompute-state": "(f) engine recomputing the prefix every step (no cache at all)",
    "gdn-rescan": "(g) engine with paged K/V, GDN state rebuilt every step (prefix rescanned)",
}
HYBRID_TARGETS = ("reference", "gdn-rescan")
"""The variants a hybrid model's speed-up target is against (bench/compare.py TARGETS), printed bold."""


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


ATTENTION_RUNS = ("attention-backends-1", "attention-backends-16", "attention-backends-64")
"""The batched attention backend against the per-sequence loop at 1, 16 and 64 concurrent sequences."""


def attention_backends(load: Load) -> str:
    rows = []
    for name in ATTENTION_RUNS:
        run = load(name)["result"]
        r = run["results"][0]
        batched, loop = r["variants"]["engine-batched"], r["variants"]["attention-loop"]
        rows.append(
            [
                run["workload"]["num_prompts"],
                f"`{name}.json`",
                sig3(batched["tokens_per_s"]),
                sig3(loop["tokens_per_s"]),
                batched["nfe"],
                f"**{r['ratios']['engine-batched_vs_attention-loop']:.2f}x**",
                "yes" if r["identical_tokens"] else "NO",
                f"{run['environment']['load_average_start'][0]:.1f} -> {run['environment']['load_average_end'][0]:.1f}",
            ]
        )
    return table(
        [
            "concurrent sequences",
            "run",
            "batched tokens/s",
            "loop tokens/s",
            "NFE",
            "batched vs loop",
            "same tokens",
            "load",
        ],
        rows,
    )


RENOISE_VARIANTS = {
    "engine": "engine, 1 request at a time",
    "transformers": "transformers `generate`, 1 at a time",
    "engine-batched": "engine, 16 concurrent",
    "transformers-batched": "transformers `generate`, batch of 16",
}
RENOISE_RATIOS = {"engine_vs_transformers": "engine / transformers, 1 at a time"}
RENOISE_RATIOS["engine-batched_vs_transformers-batched"] = "engine 16 concurrent / transformers batch of 16"


def compare_renoise(load: Load) -> str:
    """DiffusionGemma: the engine against transformers' `generate`, before (per-request generators, one decode
    per canvas: `compare-renoise-before`) and after (counter-based draws, one batched decode: `compare-renoise`)."""
    before, after = (load(n)["result"]["results"][0] for n in ("compare-renoise-before", "compare-renoise"))
    agreement = after["token_agreement_with_transformers"]
    rows = []
    for name, label in RENOISE_VARIANTS.items():
        b, a = before["variants"][name], after["variants"][name]
        same = "-" if name == "transformers" else f"{agreement[name]:.0%}"
        rows.append(
            [label, sig3(b["tokens_per_s"]), sig3(a["tokens_per_s"]), f"{b['wall_s']:.1f}", f"{a['wall_s']:.1f}", same]
        )
    for key, label in RENOISE_RATIOS.items():
        rows.append([f"**{label}**", f"{before['ratios'][key]:.2f}x", f"**{after['ratios'][key]:.2f}x**", "", "", ""])
    headers = [
        "variant",
        "tok/s before",
        "tok/s after",
        "wall s before",
        "wall s after",
        "tokens = transformers' (after)",
    ]
    return table(headers, rows)


RENOISE_OVERHEAD_RUNS = (
    ("renoise-overhead-before", "before, run 1"),
    ("renoise-overhead", "after, run 1"),
    ("renoise-overhead-before-2", "before, run 2"),
    ("renoise-overhead-2", "after, run 2"),
)
"""Two before / after pairs, each run back to back (the machine's load moves a single run by tens of %)."""


def renoise_overhead(load: Load) -> str:
    """diffusiongemma-tiny at 128 concurrent (`bench throughput`): step time and the engine's share of it (time
    outside the model's forward and LM head), before and after, two pairs."""
    rows = []
    for name, label in RENOISE_OVERHEAD_RUNS:
        r = load(name)["result"]["results"][0]
        eff = r["efficiency"]
        rows.append(
            [
                label,
                sig3(r["tokens_per_s"]),
                f"{1000 * r['mean_decode_step_s']:.0f}",
                f"{1000 * eff['overhead_s_per_step']:.0f}",
                f"{100 * eff['overhead_fraction']:.0f} %",
            ]
        )
    return table(["code", "tokens/s", "step ms", "outside the model, ms/step", "engine overhead"], rows)
