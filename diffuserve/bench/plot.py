"""PNG charts of a benchmark's JSON result (`--plot DIR`): throughput vs concurrency, latency percentiles,
tokens/s per compare variant, accuracy vs TPF. matplotlib is optional and imported only here; without it the
user gets one line saying how to install it. Knows nothing of how the numbers were measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PERCENTILE_KEYS = ("p50", "p90", "p99")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ValueError("plot: matplotlib is not installed; pip install 'diffuserve[plot]'") from None
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, out_dir: Path, name: str) -> Path:
    path = out_dir / name
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    fig.clf()
    return path


def _throughput(result: dict[str, Any], plt: Any, out: Path) -> list[Path]:
    runs = [r for r in result["results"] if r["mode"] == "concurrent"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for block in sorted({r["block_length"] for r in runs}):
        points = sorted((r["concurrency"], r["tokens_per_s"]) for r in runs if r["block_length"] == block)
        ax.plot(*zip(*points), marker="o", label=f"block {block}")
    ax.set_xscale("log", base=2)
    levels = sorted({r["concurrency"] for r in runs})
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.minorticks_off()
    ax.set(xlabel="concurrent requests", ylabel="generated tokens/s (aggregate)", title="diffuserve bench throughput")
    ax.legend()
    paths = [_save(fig, out, "throughput_vs_concurrency.png")]
    rows = [(f"b{r['block_length']} x{r['concurrency']}", r["latency"]) for r in runs]
    paths.append(_latency_bars(plt, out, rows, ("ttft_s", "e2e_s"), "latency_percentiles.png"))
    if result.get("accuracy"):
        paths.append(_accuracy(plt, out, result["accuracy"]))
    return paths


def _latency_bars(plt: Any, out: Path, rows: list[tuple[str, dict]], metrics: tuple[str, ...], name: str) -> Path:
    """One panel per metric: p50 / p90 / p99 bars for every labelled row."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 4), squeeze=False)
    width = 0.8 / len(PERCENTILE_KEYS)
    for ax, metric in zip(axes[0], metrics):
        for i, key in enumerate(PERCENTILE_KEYS):
            values = [(stats[metric][key] or 0.0) for _, stats in rows]
            ax.bar([x + i * width for x in range(len(rows))], values, width, label=key)
        ax.set_xticks([x + width for x in range(len(rows))], [label for label, _ in rows], rotation=45, ha="right")
        ax.set(ylabel="seconds", title=metric.removesuffix("_s").upper())
        ax.legend()
    return _save(fig, out, name)


def _accuracy(plt: Any, out: Path, accuracy: list[dict[str, Any]]) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for row in accuracy:
        ax.scatter(row["tokens_per_forward"], 100 * row["accuracy"])
        ax.annotate(row["decoding"], (row["tokens_per_forward"], 100 * row["accuracy"]), fontsize=7)
    ax.set(xlabel="tokens per forward (TPF)", ylabel="exact-match accuracy (%)", title="accuracy vs TPF")
    return _save(fig, out, "accuracy_vs_tpf.png")


def _compare(result: dict[str, Any], plt: Any, out: Path) -> list[Path]:
    fig, ax = plt.subplots(figsize=(6, 4))
    blocks = result["results"]
    names = list(blocks[0]["variants"])
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [r["variants"].get(name, {}).get("tokens_per_s", 0.0) for r in blocks]
        ax.bar([x + i * width for x in range(len(blocks))], values, width, label=name)
    ax.set_xticks(
        [x + width * (len(names) - 1) / 2 for x in range(len(blocks))], [f"block {r['block_length']}" for r in blocks]
    )
    ax.set(ylabel="generated tokens/s (batch 1)", title="diffuserve bench compare")
    ax.legend()
    return [_save(fig, out, "compare_tokens_per_s.png")]


def _serve(result: dict[str, Any], plt: Any, out: Path) -> list[Path]:
    runs = result["results"]
    labels = [f"c{r['concurrency']}" if r["concurrency"] else f"{r['request_rate']}/s" for r in runs]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(labels, [r["output_tokens_per_s"] for r in runs], marker="o", color="C0")
    ax.set(
        xlabel="load (c = concurrent requests, /s = request rate)",
        ylabel="output tokens/s",
        title="diffuserve bench serve",
    )
    goodput = ax.twinx()
    goodput.plot(labels, [r["goodput_requests_per_s"] for r in runs], marker="s", color="C1")
    goodput.set_ylabel("goodput (requests/s meeting the targets)", color="C1")
    paths = [_save(fig, out, "serve_throughput.png")]
    rows = list(zip(labels, runs))
    paths.append(
        _latency_bars(plt, out, rows, ("ttft_s", "tpot_s", "itl_token_s", "e2e_s"), "serve_latency_percentiles.png")
    )
    return paths


def accuracy_chart(rows: list[dict[str, Any]], out_dir: str | Path) -> Path:
    """accuracy_vs_tpf.png from `accuracy.accuracy_vs_tpf` rows."""
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = _accuracy(plt, out, rows)
    plt.close("all")
    return path


def write_plots(result: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Writes the charts of one benchmark result into `out_dir` (created); returns their paths."""
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    drawers = {
        "throughput": _throughput,
        "compare": _compare,
        "serve": _serve,
        "latency": lambda r, p, o: [
            _latency_bars(
                p, o, [("batch", r["result"]["latency"])], ("ttft_s", "tpot_s", "e2e_s"), "latency_percentiles.png"
            )
        ],
    }
    paths = drawers[result["bench"]](result, plt, out)
    plt.close("all")
    return paths
