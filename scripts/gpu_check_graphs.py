"""GPU check of CUDA graphs over bucketed steps (run by `scripts/gpu_check.sh --graphs`): the engine compiled as
CUDA runs it by default (`mode="reduce-overhead"`: a CUDA graph per piece between the graph breaks at attention,
the GDN step and the routed experts, recorded once per bucket of the step's token count; worker/executor.py)
against eager, on random bf16 checkpoints of both engine shapes: `sdar-moe-bench` (attention only) and
`clover-moe-bench` (GDN state slots beside gated attention).

Per family:
1. capture: a warm-up workload (mixed batches of 1 to 16 requests, prompts of 8 to 300 tokens, 48 output tokens)
   through the compiled engine: its compile time, the CUDA graphs it recorded and the buckets its steps used;
2. replay: another mixed workload through both engines: every forward the model saw had a bucket's token count
   (asserted), the graphs recorded during it (0 expected where it used no bucket new to it: both reported), the
   graph replays, the graphs dynamo traced during it (0: nothing recompiled), and whether its tokens equal
   eager's (reported, not asserted: inductor's fused bf16 kernels may round differently);
3. decode speed at 1 and 16 concurrent requests (128 prompt / 128 output tokens), eager vs compiled, and compiled
   with the outputs made beside the next forward (`--overlap-outputs`).

`--dry-run` runs the same code on the CPU at the tiny shapes with dynamo's capture only (`backend="eager"`:
inductor's code generation takes minutes there) and so records no CUDA graphs: the check of the script that CI
runs (tests/test_gpu_graphs.py). The last line printed is the JSON summary; `--out` writes it too.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.utils import counters

from diffuserve import LLM, SamplingParams
from diffuserve.engine.output_overlap import OutputOverlap
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint
from diffuserve.worker.executor import CompiledForward, bucket_size

BUDGET_S = 480
GRAPH_EVENTS: Counter[str] = Counter()
"""CUDA graphs recorded ("captures") and replayed ("replays") since the script started."""


def count_cuda_graphs() -> None:
    """Counts every CUDA graph capture and replay (torch's own, and so inductor's CUDA-graph trees')."""
    graph = torch.cuda.CUDAGraph
    begin, replay = graph.capture_begin, graph.replay

    def counted_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        GRAPH_EVENTS["captures"] += 1
        return begin(self, *args, **kwargs)

    def counted_replay(self: Any) -> Any:
        GRAPH_EVENTS["replays"] += 1
        return replay(self)

    graph.capture_begin, graph.replay = counted_begin, counted_replay  # type: ignore[method-assign]


def write_checkpoint(family: str, root: Path, tiny: bool) -> Path:
    size = "tiny" if tiny else "bench"
    if family == "clover-moe":
        return write_clover_moe_checkpoint(root / family, make_clover_moe_config(f"clover-moe-{size}"), seed=0)
    return write_random_checkpoint(root / family, make_config(f"sdar-moe-{size}"), seed=0, logit_scale=3.5)


class ShapeLog:
    """Wraps a compiled forward: the token count of every step (`steps`) and of what the model saw (`seen`)."""

    def __init__(self, forward: CompiledForward) -> None:
        self.steps: list[int] = []
        self.seen: list[int] = []
        self.forward, self._model = forward, forward._fn
        forward._fn = self._model_call

    def _model_call(self, input_ids: torch.Tensor, *rest: Any) -> Any:
        self.seen.append(input_ids.shape[0])
        return self._model(input_ids, *rest)

    def __call__(self, input_ids: torch.Tensor, *rest: Any) -> Any:
        self.steps.append(input_ids.shape[0])
        return self.forward(input_ids, *rest)


def engine(model_dir: Path, device: str, compiled: bool) -> tuple[LLM, ShapeLog | None]:
    llm = LLM(str(model_dir), dtype="bfloat16", device=device, enforce_eager=not compiled, max_num_seqs=16)
    if not compiled:
        return llm, None
    executor = llm.engine.runner.executor
    if device == "cpu":  # the dry run pads as CUDA does
        executor.run_model = CompiledForward(executor.model, True, torch.device("cpu"), bucketed=True)
    log = ShapeLog(executor.run_model)
    executor.run_model = log
    return llm, log


def generate(llm: LLM, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs], time.perf_counter() - started


def token_range(tiny: bool) -> tuple[int, int]:
    """Prompt token ids: ordinary tokens of the shape's vocabulary (the byte tokenizer's specials, the mask token
    among them, lie between)."""
    return (10, 250) if tiny else (300, 8000)


def mixed_batches(seed: int, tiny: bool) -> list[list[list[int]]]:
    rng = random.Random(seed)
    (low, high), longest = token_range(tiny), 40 if tiny else 300
    sizes = (1, 3, 8, 16, 5, 2, 12)
    return [[[rng.randrange(low, high) for _ in range(rng.randrange(8, longest))] for _ in range(n)] for n in sizes]


def check_family(family: str, root: Path, device: str, tiny: bool, started: float) -> dict[str, Any]:
    model_dir = write_checkpoint(family, root, tiny)
    eager, _ = engine(model_dir, device, False)
    compiled, log = engine(model_dir, device, True)
    assert log is not None
    output_tokens = 8 if tiny else 48
    result: dict[str, Any] = {}
    for batch in mixed_batches(0, tiny):
        generate(compiled, batch, output_tokens)
    result["compile_s"] = round(log.forward.compile_s, 1)
    result["warm_up"] = {"buckets": sorted(set(log.seen)), "graphs_recorded": GRAPH_EVENTS["captures"]}
    warm_buckets, captures, replays = set(log.seen), GRAPH_EVENTS["captures"], GRAPH_EVENTS["replays"]
    traced = counters["stats"]["unique_graphs"]
    log.steps.clear()
    log.seen.clear()
    batches = mixed_batches(1, tiny)
    same = [generate(compiled, b, output_tokens)[0] == generate(eager, b, output_tokens)[0] for b in batches]
    assert all(bucket_size(n) == n for n in log.seen), f"{family}: the model saw non-bucket shapes {set(log.seen)}"
    result["replay"] = {
        "steps": len(log.steps),
        "steps_padded": sum(bucket_size(n) != n for n in log.steps),
        "buckets_new": sorted(set(log.seen) - warm_buckets),
        "graphs_recorded": GRAPH_EVENTS["captures"] - captures,
        "graph_replays": GRAPH_EVENTS["replays"] - replays,
        "graphs_traced": counters["stats"]["unique_graphs"] - traced,
        "same_tokens_as_eager": same,
    }
    if time.perf_counter() - started < BUDGET_S:
        result["decode_tokens_per_s"] = decode_speed(eager, compiled, tiny)
    return result


def decode_speed(eager: LLM, compiled: LLM, tiny: bool) -> dict[str, dict[str, float]]:
    """Tokens/s at 1 and 16 requests: eager, compiled, and compiled with its outputs made beside the next forward
    (`--overlap-outputs`, which did not pay on a CPU: whether it pays where the step waits on the GPU)."""
    length = 16 if tiny else 128
    speeds: dict[str, dict[str, float]] = {}
    for batch in (1, 16):
        prompts = [[random.Random(i).randrange(*token_range(tiny)) for _ in range(length)] for i in range(batch)]
        times = {name: generate(llm, prompts, length)[1] for name, llm in (("eager", eager), ("compiled", compiled))}
        with outputs_overlapped(compiled):
            times["compiled_overlapped"] = generate(compiled, prompts, length)[1]
        speeds[f"batch_{batch}"] = {name: round(batch * length / s, 1) for name, s in times.items()}
    return speeds


@contextmanager
def outputs_overlapped(llm: LLM) -> Iterator[None]:
    """The idle engine with `overlap_outputs` on for a while (its compiled forward kept: no second compile)."""
    engine = llm.engine
    engine.overlap = OutputOverlap(engine.output_processor)
    try:
        yield
    finally:
        engine.overlap.shutdown()
        engine.overlap = None


def run(device: str) -> dict[str, Any]:
    tiny = device == "cpu"
    if tiny:
        torch.compile = functools.partial(torch.compile, backend="eager")  # type: ignore[assignment]
    else:
        count_cuda_graphs()
    started = time.perf_counter()
    result: dict[str, Any] = {"device": device, "torch": torch.__version__}
    with tempfile.TemporaryDirectory(prefix="diffuserve-graphs-") as tmp:
        for family in ("sdar-moe", "clover-moe"):
            result[family] = check_family(family, Path(tmp), device, tiny, started)
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for the dry run")
    parser.add_argument("--dry-run", action="store_true", help="the same code on the CPU at the tiny shapes")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON summary here")
    args = parser.parse_args(argv)
    line = json.dumps(run("cpu" if args.dry_run else args.device))
    if args.out is not None:
        args.out.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
