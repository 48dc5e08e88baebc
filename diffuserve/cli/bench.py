"""`diffuserve bench latency | throughput | compare | serve | moe | sweep`: argument parsing and dispatch only.

Each subcommand prints a human table and, last, one JSON line (git sha, hardware, dtype, model, workload,
results; latency and throughput add the planner's "calibration" object). The benchmark modules, and torch
with them, are imported inside `run`, so `diffuserve bench --help` stays instant.
"""

from __future__ import annotations

import argparse
import importlib

from diffuserve.cli.arg_types import positive_int
from diffuserve.cli.bench_sweep import add_sweep_arguments
from diffuserve.config import parse_bool
from diffuserve.model.quant.scheme import DEFAULT_TARGETS

MODULES = {
    "latency": "diffuserve.bench.latency",
    "throughput": "diffuserve.bench.throughput",
    "compare": "diffuserve.bench.compare",
    "serve": "diffuserve.bench.serve",
    "moe": "diffuserve.bench.moe",
    "sweep": "diffuserve.bench.sweep",
    "adapters": "diffuserve.bench.adapters",
}


def _add_output(parser: argparse.ArgumentParser, plot: bool = True) -> None:
    parser.add_argument("--json-out", default=None, metavar="PATH", help="also write the final JSON line here")
    if plot:
        parser.add_argument(
            "--plot",
            default=None,
            metavar="DIR",
            help="write PNG charts into DIR (needs: pip install 'diffuserve[plot]')",
        )


def _add_model(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model and machine")
    model.add_argument(
        "--model",
        default=None,
        help="model directory, or clover-moe-bench / diffusiongemma-bench / llada2-bench (random clover_moe / "
        "DiffusionGemma / LLaDA2 shapes, written on first use); default: the random sdar-moe-bench model, written on "
        "first use",
    )
    model.add_argument(
        "--model-cache-dir",
        default=None,
        metavar="DIR",
        help="where sdar-moe-bench is written (default: ~/.cache/diffuserve)",
    )
    model.add_argument("--model-seed", type=int, default=0, help="weight seed of sdar-moe-bench (default: 0)")
    model.add_argument(
        "--logit-scale",
        type=float,
        default=3.5,
        help="LM-head scale of sdar-moe-bench: sets its TPF (default 3.5: about 2.8 at block 32)",
    )
    model.add_argument("--dtype", default="auto", help="auto (the checkpoint's), float32, bfloat16, float16")
    model.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    model.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch CPU threads (default: torch's choice); recorded in the JSON",
    )
    model.add_argument(
        "--probe-seconds",
        type=float,
        default=1.0,
        help="time for each of the matmul-rate and bandwidth probes (default: 1.0)",
    )
    model.add_argument(
        "--moe-backend",
        default="auto",
        choices=("auto", "loop", "bmm", "grouped_mm"),
        help="how MoE layers compute their experts (default: auto; loop = the reference path)",
    )
    model.add_argument(
        "--block-expert-coreset",
        default=None,
        metavar="RULE",
        help="the block expert coreset rule (docs/models/coreset.md): C routes each denoised block within C experts "
        "(0 = off); cumulative:0.6[,min=16,window=32] is dMoE's rule (default: the model's config.json, else off)",
    )
    _add_weights_and_cache(model)
    _add_execution(model)


def _add_weights_and_cache(model: argparse._ArgumentGroup) -> None:
    """How the weights and K/V are stored: quantization and the K/V dtype."""
    model.add_argument(
        "--quantization",
        nargs="+",
        default=["none"],
        choices=("none", "fp8", "int8", "int4"),
        help="weights quantized on load (none = the --dtype weights); latency takes several and runs each in turn, "
        "one table of bytes per forward and decode tokens/s side by side (default: none)",
    )
    model.add_argument(
        "--quantization-targets",
        default=DEFAULT_TARGETS,
        help=f"which weights --quantization quantizes (default: {DEFAULT_TARGETS})",
    )
    model.add_argument(
        "--quantization-group-size", type=positive_int, default=128, help="int4 group size (default: 128)"
    )
    model.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=("auto", "fp8"),
        help="K/V pages' dtype: auto (the --dtype) or fp8 (e4m3); the GDN state stays fp32 (default: auto)",
    )


def _add_execution(model: argparse._ArgumentGroup) -> None:
    """How the forward runs: the attention backend, parallel ranks, eager or compiled."""
    model.add_argument(
        "--attention-backend",
        default="auto",
        choices=("auto", "loop", "batched", "flashinfer"),
        help="what computes paged attention (default: auto; loop = one SDPA per sequence, the reference)",
    )
    model.add_argument(
        "--tensor-parallel-size",
        type=positive_int,
        default=1,
        help="ranks the model is split over (worker processes on this machine; default: 1)",
    )
    model.add_argument(
        "--enable-expert-parallel",
        default=False,
        nargs="?",
        const=True,
        type=parse_bool,
        metavar="{true,false}",
        help="with --tensor-parallel-size N: whole experts per rank (default: false)",
    )
    model.add_argument(
        "--enforce-eager",
        default=None,
        nargs="?",
        const=True,
        type=parse_bool,
        metavar="{true,false}",
        help="run the forward eagerly (default: compiled on CUDA, eager on CPU; false compiles on "
        "CPU too, and the compile time is then part of the warm-up, not of the timed runs)",
    )


def _add_decoding(parser: argparse.ArgumentParser) -> None:
    decoding = parser.add_argument_group("decoding (default: the model's generation_config)")
    decoding.add_argument("--decoder", default=None, choices=("threshold", "fixed", "entropy"))
    decoding.add_argument("--threshold", type=float, default=None, help="confidence threshold (default 0.9)")
    decoding.add_argument("--temperature", type=float, default=0.0, help="0 = argmax (default)")
    decoding.add_argument("--seed", type=int, default=0, help="seed of prompts and sampling (default: 0)")


def _add_latency(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", type=positive_int, default=1, help="requests submitted at once (default: 1)")
    parser.add_argument("--prompt-tokens", type=positive_int, default=128, help="default: 128")
    parser.add_argument("--output-tokens", type=positive_int, default=128, help="default: 128")
    parser.add_argument("--block-length", type=positive_int, default=None, help="default: the model's")
    parser.add_argument("--num-iters", type=positive_int, default=3, help="measured iterations (default: 3)")
    parser.add_argument(
        "--num-iters-warmup",
        type=positive_int,
        default=1,
        help="warm-up iterations, also the calibration fit's data (default: 1)",
    )


def _add_throughput(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        nargs="+",
        default=[1, 4, 16, 64],
        help="concurrent requests per run (default: 1 4 16 64)",
    )
    parser.add_argument("--block-lengths", type=positive_int, nargs="+", default=[32, 4], help="default: 32 4")
    parser.add_argument(
        "--sequential",
        type=int,
        default=16,
        help="also run this many requests one after another, for the concurrent speed-up (default: 16; 0 = skip)",
    )
    parser.add_argument("--prompt-tokens", type=positive_int, default=128, help="default: 128")
    parser.add_argument("--output-tokens", type=positive_int, default=128, help="default: 128")
    parser.add_argument(
        "--accuracy-examples",
        type=int,
        default=0,
        metavar="N",
        help="also score N held-out examples per task at each decoding (models with checkable "
        "tasks, e.g. the bundled one): accuracy vs TPF (default: 0 = skip)",
    )


def _add_compare(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--block-lengths", type=positive_int, nargs="+", default=[32, 4], help="default: 32 4")
    parser.add_argument("--prompt-tokens", type=positive_int, default=512, help="default: 512")
    parser.add_argument("--output-tokens", type=positive_int, default=256, help="default: 256")
    parser.add_argument("--num-prompts", type=positive_int, default=1, help="prompts, each decoded alone (default: 1)")
    parser.add_argument(
        "--denoising-steps",
        type=positive_int,
        default=None,
        help="renoise canvases (DiffusionGemma): max_denoising_steps (default: the model's)",
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        help="interleaved rounds of the engine variants; tokens/s from the median (default: 3)",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["engine", "baseline", "reference", "transformers-kv", "separate-commit", "ar"],
        choices=(
            "engine",
            "baseline",
            "reference",
            "transformers-kv",
            "separate-commit",
            "ar",
            "engine-batched",
            "attention-loop",
            "recompute-state",
            "gdn-rescan",
            "verified",
            "verified-batched",
            "auto",
            "auto-batched",
            "ar-batched",
        ),
        help="(a) engine, (a0) baseline: the engine eager with the per-expert loop, (b) transformers "
        "recompute reference (clover_moe: the naive decode), (b2) transformers-kv: transformers "
        "with a KV cache and the SDAR scheme, (c) separate commit forward, (d) autoregressive "
        "baseline (block length 1), (e) engine-batched: the engine given all --num-prompts at "
        "once, (f) recompute-state: hybrid models recomputing the whole prefix every step (no cache), "
        "(g) gdn-rescan: hybrid models with K/V cached but the GDN state rebuilt every step by scanning the "
        "prefix's kept projections, (h) attention-loop: engine-batched with --attention-backend loop (one SDPA "
        "per sequence, the unbatched attention), (i) verified: the engine with decoder=verified (its "
        "tokens must equal ar's), verified-batched: the same given all --num-prompts at once, auto and auto-batched: "
        "the same with decoder=auto (--auto-draft-tokens switches its drafts per step), ar-batched: (d) "
        "given all --num-prompts at once; default: a, a0, b, b2, c, d",
    )


def _add_serve(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000 (OpenAI-compatible server)")
    parser.add_argument("--endpoint", default="/v1/completions", choices=("/v1/completions", "/v1/chat/completions"))
    parser.add_argument("--model", default=None, help="model name to send (default: the server's first model)")
    parser.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY if set)")
    parser.add_argument("--num-prompts", type=positive_int, default=32, help="requests per sweep point (default: 32)")
    parser.add_argument(
        "--prompt-words",
        type=positive_int,
        default=128,
        help="prompt length in common English words; the server's usage reports its tokens (default: 128)",
    )
    parser.add_argument("--output-tokens", type=positive_int, default=64, help="max_tokens, EOS ignored (default: 64)")
    parser.add_argument(
        "--shared-prefix-words",
        type=int,
        default=0,
        help="send the prompts as --prefix-groups conversations that open with this many shared words and resend "
        "their earlier turns (default: 0: independent prompts)",
    )
    parser.add_argument(
        "--prefix-groups",
        type=positive_int,
        default=8,
        help="conversations: prompt i is turn i // G of conversation i %% G (default: 8)",
    )
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        nargs="*",
        default=[1, 8, 32],
        help="closed-loop sweep: at most N requests in flight (default: 1 8 32)",
    )
    parser.add_argument(
        "--request-rate",
        type=float,
        nargs="*",
        default=[],
        help="open-loop sweep: requests/s (Poisson arrivals unless --fixed-rate); inf = all at once",
    )
    parser.add_argument("--fixed-rate", action="store_true", help="evenly spaced arrivals instead of Poisson")
    parser.add_argument(
        "--goodput",
        nargs="*",
        default=["ttft:2000", "tpot:200"],
        metavar="METRIC:MS",
        help="latency targets a request must meet to count as goodput: ttft, tpot, itl, e2e "
        "in milliseconds (default: ttft:2000 tpot:200)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    parser.add_argument("--seed", type=int, default=0, help="seed of prompts and arrivals (default: 0)")
    parser.add_argument("--temperature", type=float, default=0.0, help="default: 0")


def _add_moe(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset",
        default="sdar-moe-bench",
        help="random-weight model shape (default: sdar-moe-bench; clover-bench is its old name)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--num-requests", type=int, default=16, help="requests in the step (default: 16)")
    parser.add_argument("--block-length", type=int, default=32, help="diffusion block length (default: 32)")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per dispatch path (default: 7)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per request in the offload runs")
    parser.add_argument("--steps-per-block", type=int, default=8, help="fixed denoising steps per block")
    parser.add_argument("--skip-offload", action="store_true", help="only the dispatch benchmark")
    parser.add_argument(
        "--coreset-sizes",
        type=lambda text: [int(size) for size in text.split(",")],
        default=[],
        help="block expert coreset sizes C to measure against per-token routing on a random 256-expert shape at "
        "batch 1, comma-separated (e.g. 8,16,32,48): experts and bytes per forward, and the planner's bytes",
    )
    parser.add_argument(
        "--coreset-rules",
        nargs="+",
        default=[],
        metavar="RULE",
        help="cumulative coreset rules (dMoE's, e.g. cumulative:0.6 cumulative:0.3,min=8) to measure against "
        "per-token routing on a random 256-expert dMoE at batch 1: experts and bytes per forward, and the planner's",
    )


def _add_adapters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-prompts", type=int, default=16, help="concurrent requests in the batch (default: 16)")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="tokens per prompt (default: 32)")
    parser.add_argument("--output-tokens", type=int, default=32, help="tokens each request generates (default: 32)")
    parser.add_argument("--rank", type=int, default=16, help="the random adapters' rank r (default: 16)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per variant, best kept (default: 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts (default: 0)")
    parser.add_argument(
        "--adapter-dir", default=None, metavar="DIR", help="where the random adapters are written (default: cache)"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    specs = {
        "latency": ("latency of one batch: TTFT, TPOT, E2E percentiles", _add_latency),
        "throughput": ("aggregate tokens/s vs concurrency and block length, efficiency, calibration", _add_throughput),
        "compare": ("engine vs recompute reference vs separate commit vs AR, same prompts, one run", _add_compare),
        "serve": ("load generator for any OpenAI-compatible server: TTFT, TPOT, ITL, E2E, goodput", _add_serve),
        "moe": ("MoE layers: grouped dispatch vs per-expert loop, expert offload hit rates and bytes", _add_moe),
        "sweep": (
            "engine vs its family's batched peer at 1..128 concurrent, best-case and realistic",
            add_sweep_arguments,
        ),
        "adapters": ("tokens/s with 0, 1 and 4 LoRA adapters in the batch against the base model alone", _add_adapters),
    }
    for name, (help_text, add) in specs.items():
        subparser = sub.add_parser(name, help=help_text, description=help_text)
        add(subparser)
        if name in ("latency", "throughput", "compare", "sweep", "adapters"):
            _add_model(subparser)
        if name in ("latency", "throughput", "compare"):
            _add_decoding(subparser)
        if name != "moe":
            _add_output(subparser, plot=name not in ("sweep", "adapters"))


def run(args: argparse.Namespace) -> int:
    module = importlib.import_module(MODULES[args.bench_command])
    return int(module.run(args) or 0)
