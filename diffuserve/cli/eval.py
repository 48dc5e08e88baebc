"""`diffuserve eval`: held-out exact-match accuracy, TPF and NFE of a model on the synthetic tasks, for a sweep
of decoders and thresholds (the quality / speed trade-off of diffusion decoding). Prints a table, then one JSON
line. The sweep ends with verified decoding and the autoregressive reading (block length 1), whose replies must
be the same (the JSON counts the examples where they are). The model must speak the chat template the tasks were
trained in (the bundled default model does).
"""

from __future__ import annotations

import argparse
import json

from diffuserve.config import QUANTIZATION_FIELDS, add_quantization_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model directory (default: the bundled default model)")
    parser.add_argument("--num-per-task", type=int, default=100, help="held-out examples per task")
    parser.add_argument("--seed", type=int, default=1234, help="seed that picks the held-out examples")
    parser.add_argument(
        "--tasks", default=None, help="comma-separated tasks (default: the six evaluated ones; add_json is also known)"
    )
    parser.add_argument(
        "--thresholds",
        default="0.5,0.7,0.8,0.9,0.95",
        help="comma-separated confidence thresholds for the threshold decoder",
    )
    parser.add_argument("--default-only", action="store_true", help="score only the model's default decoding")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--dtype", default="auto", help="auto (the checkpoint's), float32, bfloat16 or float16")
    parser.add_argument(
        "--block-expert-coreset",
        default=None,
        metavar="RULE",
        help="the block expert coreset rule: C experts per denoised block (0 off) or cumulative:0.6[,min=16,"
        "window=32], dMoE's (docs/models/coreset.md; default: the model's)",
    )
    parser.add_argument(
        "--block-length", type=int, default=None, help="the engine's block length (default: the model's)"
    )
    parser.add_argument(
        "--draft-adapter",
        default=None,
        metavar="DIR",
        help="a PEFT adapter applied only where verified decoding drafts (docs/serving/adapters.md)",
    )
    add_quantization_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import torch

    from diffuserve import LLM
    from diffuserve.eval.harness import (
        AUTOREGRESSIVE,
        VERIFIED_ROWS,
        decoding_sweep,
        evaluate,
        evaluate_sweep,
        format_table,
        same_replies,
    )
    from diffuserve.eval.tasks import GENERATORS, TASKS, heldout_examples
    from diffuserve.model.hub import resolve_model
    from diffuserve.sampling_params import SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    tasks = args.tasks.split(",") if args.tasks else list(TASKS)
    unknown = [t for t in tasks if t not in GENERATORS]
    if unknown:
        raise ValueError(f"tasks: unknown {', '.join(unknown)}; available: {', '.join(GENERATORS)}")
    if args.num_per_task < 1:
        raise ValueError(f"num_per_task: got {args.num_per_task}, must be >= 1")
    thresholds = _parse_thresholds(args.thresholds)
    quantization = {k: v for k, v in vars(args).items() if k in QUANTIZATION_FIELDS}
    options = dict(dtype=args.dtype, block_expert_coreset=args.block_expert_coreset, **quantization)
    blocks = {} if args.block_length is None else {"block_length": args.block_length}
    llm = LLM(resolve_model(args.model), draft_adapter=args.draft_adapter, **blocks, **options)
    sweep = decoding_sweep(thresholds, llm.engine.args.block_length)
    if args.default_only:
        sweep = sweep[:1]
    examples = heldout_examples(args.num_per_task, args.seed, tasks)
    results = evaluate_sweep(llm, examples, sweep)
    if not args.default_only:
        autoregressive = LLM(resolve_model(args.model), block_length=1, **options)
        results.append(evaluate(autoregressive, examples, SamplingParams(), AUTOREGRESSIVE))
    print(format_table(results))
    print(
        json.dumps(
            {
                "model": llm.engine.config.model,
                "dtype": llm.engine.config.dtype,
                "quantization": llm.engine.config.quantization,
                "block_expert_coreset": llm.engine.config.block_expert_coreset,
                "block_length": llm.engine.args.block_length,
                "draft_adapter": args.draft_adapter,
                "num_examples": len(examples),
                "verified_replies_equal_autoregressive": same_replies(results, VERIFIED_ROWS, AUTOREGRESSIVE),
                "defaults": llm.engine.generation_defaults,
                "results": [r.summary() for r in results],
            }
        )
    )
    return 0


def _parse_thresholds(text: str) -> list[float]:
    """'0.5,0.9' -> [0.5, 0.9]; each must be a number in (0, 1]."""
    thresholds = []
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"thresholds: {item!r} is not a number; pass e.g. --thresholds 0.5,0.9") from None
        if not 0.0 < value <= 1.0:
            raise ValueError(f"thresholds: got {value:g}, each must be in (0, 1]")
        thresholds.append(value)
    return thresholds
