"""The bundled model's tables: its training runs and its accuracy against TPF per decoding (docs/models/bundled.md),
its accuracy and TPF with and without grammars (docs/decoding/structured-output.md, "Measured cost"), and verified
decoding with its draft adapter (docs/benchmarks/decoders.md)."""

from __future__ import annotations

from scripts.doc_tables.cells import Load, pct, table

TASKS = ("add", "reverse", "sort", "copy", "max", "lookup")
TRAINING_RUNS = {
    "train-clover-moe-chat": "clover_moe (ships): the one below + 1,000 steps, next-token loss, chats",
    "train-clover-moe-3200": "clover_moe (shipped before), seed 0, 3,200 steps",
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


CORESET_RUNS = {
    "eval-coreset-c0": "0 (per-token routing)",
    "eval-coreset-c8": "8 (all experts)",
    "eval-coreset-c4": "4",
    "eval-coreset-c2": "2 (the top-k itself)",
}


def coreset_accuracy(load: Load) -> str:
    """The bundled model's accuracy under block expert coreset routing, per coreset size C."""
    rows = []
    for name, label in CORESET_RUNS.items():
        default = load(name)["result"]["results"][0]
        by_task = default["accuracy_by_task"]
        accuracy, sorting = pct(default["accuracy"], " "), pct(by_task["sort"], " ")
        rows.append([label, accuracy, f"{default['tokens_per_forward']:.2f}", sorting, f"`{name}.json`"])
    return table(["C", "accuracy", "tokens per forward", "sorting", "results"], rows)


def draft_adapter(load: Load) -> str:
    """Verified decoding of the held-out tasks at the model's block length, and at the draft adapter's without and
    with it (scripts/train_draft_adapter.py)."""
    run = load("draft-adapter")["result"]
    rows = [
        [
            r["decoding"],
            pct(r["accuracy"], " "),
            *(pct(r["accuracy_by_task"][t], " ") for t in TASKS),
            f"**{r['tokens_per_forward']:.2f}**",
            f"{r['nfe_per_example']:.2f}",
        ]
        for r in (run["default"], run["without"], run["with"])
    ]
    same = "identical" if run["replies_identical"] else "**not identical**"
    note = f"\n\nReplies of the three rows: {same}; adapter rank {run['rank']}, {run['examples']} training prompts."
    return table(["decoding", "accuracy", *TASKS, "TPF", "NFE / example"], rows) + note
