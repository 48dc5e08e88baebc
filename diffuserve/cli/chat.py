"""`diffuserve chat`: an interactive conversation in the terminal through the model's chat template.
Type a message and press enter; an empty line or EOF (Ctrl-D) ends the session; /reset clears the history."""

from __future__ import annotations

import argparse
import sys

from diffuserve.cli.generate import SAMPLING_SKIP, add_model_arguments, build_llm, sampling_params_from_args
from diffuserve.config import add_config_arguments
from diffuserve.sampling_params import SamplingParams


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--system", default=None, help="system message at the start of the conversation")
    add_model_arguments(parser)
    add_config_arguments(parser, SamplingParams, skip=SAMPLING_SKIP)


def run(args: argparse.Namespace) -> int:
    params = sampling_params_from_args(args)
    if "max_tokens" not in vars(args):
        params = params.replace(max_tokens=256)
    llm = build_llm(args)
    start = [{"role": "system", "content": args.system}] if args.system else []
    history = list(start)
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("you> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line.strip():
            return 0
        if line.strip() == "/reset":
            history = list(start)
            continue
        history.append({"role": "user", "content": line.rstrip("\n")})
        out = llm.chat(history, params, use_tqdm=False).outputs[0]
        history.append({"role": "assistant", "content": out.text})
        print(f"model> {out.text}" if interactive else out.text, flush=True)
        print(f"[NFE {out.num_forwards}, TPF {out.tokens_per_forward:.2f}]", file=sys.stderr)
