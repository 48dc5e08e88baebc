"""`diffuserve verify MODEL`: flags -> VerifyOptions -> the comparison -> a table or `--json`, and the exit code
(0 agree, 1 part, 2 no reference). Imports torch and transformers only inside `run`.
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="model directory (config.json, safetensors)")
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the checkpoint's own modeling code (config.json's auto_map) as the reference",
    )
    parser.add_argument(
        "--layers",
        type=int,
        metavar="K",
        help="build both sides with only the first K layers (and read only their tensors)",
    )
    parser.add_argument("--dtype", default="auto", help="auto (the checkpoint's), float32, bfloat16 or float16")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (both sides)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=8, help="greedy continuation length per prompt (default: 8)"
    )
    parser.add_argument(
        "--reference-generate",
        metavar="FILE[:FUNCTION]",
        help="the reference's block-diffusion loop outside the model (e.g. SDAR's generate.py), compared for one "
        "block; without it, a model `generate` taking block_length is used where the reference has one",
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON document")


def run(args: argparse.Namespace) -> int:
    from diffuserve.model.loader import read_model_config
    from diffuserve.verify.reference import refusal
    from diffuserve.verify.report import render_table, to_json
    from diffuserve.verify.session import VerifyOptions, verify

    if args.max_new_tokens < 0:
        raise ValueError(f"--max-new-tokens: must be >= 0, got {args.max_new_tokens}")
    if not args.trust_remote_code:
        line = refusal(read_model_config(args.model)[0])
        if line is not None:
            print(line, file=sys.stderr)
    options = VerifyOptions(
        args.model,
        args.layers,
        args.dtype,
        args.device,
        args.trust_remote_code,
        args.max_new_tokens,
        args.reference_generate,
    )
    result = verify(options)
    print(json.dumps(to_json(result), indent=2) if args.json else "\n".join(render_table(result)))
    return result.exit_code
