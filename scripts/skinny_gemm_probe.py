"""How fast this machine's GEMM library streams weights at the batch-1 expert shapes, against a plain streaming
read: the ceiling that any engine built on torch's CPU kernels meets at batch 1 (docs/benchmarks/latency.md, "Batch-1
speed").

The weights are those of sdar-moe-bench's routed experts (8 layers x 16 experts x gate / up / down, 512 x 256), so
that one pass reads every expert once from memory (201 MB in fp32, more than the caches) with M rows per expert,
as a batch-1 step does (block 32, top-2 of 16 experts: about 4 rows per expert). Each row of the table is one way
of computing the same products: `F.linear` per expert (the engine's loop backend), `torch.mm` on pre-transposed
weights, and one `torch.bmm` per layer and projection (the engine's bmm backend, no padding here).

    python scripts/skinny_gemm_probe.py --threads 1

Prints a table and a final JSON line (`scripts/render_docs.py --record` keeps it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

LAYERS, EXPERTS, HIDDEN, WIDTH, PROJECTIONS = 8, 16, 512, 256, 3


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def stream_rate(repeats: int) -> float:
    buffer = torch.ones(64 << 20, dtype=torch.float32)  # 256 MiB
    return buffer.numel() * 4 / median_seconds(buffer.sum, repeats)


def gemm_rates(dtype: torch.dtype, rows: int, repeats: int) -> dict[str, float]:
    """Bytes/s of weights read by each way of computing every expert's [rows, H] x [H, W] product once."""
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(EXPERTS, WIDTH, HIDDEN, generator=generator).to(dtype) for _ in range(LAYERS * PROJECTIONS)]
    transposed = [w.transpose(1, 2).contiguous() for w in weights]
    x = torch.randn(EXPERTS, rows, HIDDEN, generator=generator).to(dtype)
    total = sum(w.numel() * w.element_size() for w in weights)
    ways = {
        "F.linear per expert": lambda: [F.linear(x[e], w[e]) for w in weights for e in range(EXPERTS)],
        "mm per expert, W^T contiguous": lambda: [torch.mm(x[e], w[e]) for w in transposed for e in range(EXPERTS)],
        "bmm per layer, W^T contiguous": lambda: [torch.bmm(x, w) for w in transposed],
    }
    return {name: total / median_seconds(fn, repeats) for name, fn in ways.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 8, 32])
    parser.add_argument("--repeats", type=int, default=7)
    ns = parser.parse_args()
    torch.set_num_threads(ns.threads)
    stream = stream_rate(ns.repeats)
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        for rows in ns.rows:
            for way, rate in gemm_rates(dtype, rows, ns.repeats).items():
                results.append({"dtype": str(dtype)[6:], "rows": rows, "way": way, "bytes_per_s": rate})
                print(f"{str(dtype)[6:]:>9} M={rows:<3} {way:<32} {rate / 1e9:6.2f} GB/s  {100 * rate / stream:5.1f}%")
    print(f"streaming read (sum of 256 MiB): {stream / 1e9:.2f} GB/s")
    out = {"bench": "skinny-gemm", "threads": ns.threads, "stream_bytes_per_s": stream, "results": results}
    print(json.dumps({**out, "load_average": list(os.getloadavg())}))


if __name__ == "__main__":
    main()
