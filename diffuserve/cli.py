"""`diffuserve serve | generate | chat | bench | plan | eval`: one entry point, one module per subcommand.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int` and imports its heavy
dependencies (torch, the server) inside `run`, so `diffuserve plan` and `--help` stay fast and torch-free.
User and config errors (ValueError) print one line, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "serve": ("diffuserve.server.cli", "start the OpenAI-compatible HTTP server"),
    "generate": ("diffuserve.offline_cli", "generate completions for prompts (offline)"),
    "chat": ("diffuserve.chat_cli", "interactive chat in the terminal"),
    "bench": ("diffuserve.bench.cli", "benchmarks: latency, throughput, compare, serve"),
    "plan": ("diffuserve.planner.cli", "capacity and cost planner"),
    "eval": ("diffuserve.eval.cli", "exact-match accuracy of a model on its checkable tasks"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diffuserve", description="Serve block-diffusion MoE language models: exact, batched, OpenAI-compatible."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue  # subcommand not part of this build
        module.add_arguments(sub.add_parser(name, help=help_text, description=help_text))
        sub.choices[name].set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except ValueError as e:
        print(f"diffuserve {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
