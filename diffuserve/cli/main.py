"""`diffuserve serve | generate | chat | bench | plan | eval | quantize | verify`: one entry point, one module per
subcommand.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int` and imports its heavy
dependencies (torch, the server) inside `run`. Only the chosen subcommand's module is imported, so
`diffuserve plan` stays torch-free and `--help` is instant. User and config errors (ValueError) print one
line, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from diffuserve import __version__

SUBCOMMANDS = {
    "serve": ("diffuserve.cli.serve", "start the OpenAI-compatible HTTP server"),
    "generate": ("diffuserve.cli.generate", "generate completions for prompts (offline)"),
    "chat": ("diffuserve.cli.chat", "interactive chat in the terminal"),
    "bench": ("diffuserve.cli.bench", "benchmarks: latency, throughput, compare, serve"),
    "plan": ("diffuserve.cli.plan", "capacity and cost planner"),
    "eval": ("diffuserve.cli.eval", "exact-match accuracy of a model on its checkable tasks"),
    "quantize": ("diffuserve.cli.quantize", "write a quantized (compressed-tensors) checkpoint of a 16-bit one"),
    "verify": ("diffuserve.cli.verify", "compare the engine with the checkpoint's reference code, layer by layer"),
}


def build_parser(command: str | None) -> argparse.ArgumentParser:
    """The full parser; only `command`'s arguments are loaded (the others show their one-line help)."""
    parser = argparse.ArgumentParser(
        prog="diffuserve", description="Serve block-diffusion MoE language models: exact, batched, OpenAI-compatible."
    )
    parser.add_argument("--version", action="version", version=f"diffuserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        subparser = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(subparser)
            subparser.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except ValueError as e:
        print(f"diffuserve {args.command}: error: {e}", file=sys.stderr)
        return int(getattr(e, "exit_code", 2))  # 2: a usage or input error; a config error may name its own
    except KeyboardInterrupt:
        return 130
