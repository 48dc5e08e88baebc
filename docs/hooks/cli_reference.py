"""MkDocs hook (mkdocs.yml `hooks:`): writes the command-line reference at build time from the CLI's own argparse
parsers, so the page cannot drift from `--help`. A page marks the place with `<!-- cli-reference -->`; the hook puts
there `diffuserve --help` and, for every subcommand of `diffuserve.cli.main.SUBCOMMANDS` (and every benchmark of
`diffuserve bench`), its `--help` under its own heading. Knows nothing of what the flags mean: that is the parsers'
help text. Importing the subcommand modules is cheap (each imports torch only inside `run`)."""

from __future__ import annotations

import argparse
import os
from typing import Any

MARKER = "<!-- cli-reference -->"
COLUMNS = "100"
"""The width `--help` wraps at on the page (argparse reads $COLUMNS), whatever the terminal building the site."""


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's subcommands by name (empty when it has none)."""
    for action in parser._actions:  # argparse exposes subcommands only through its private action list
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _block(title: str, parser: argparse.ArgumentParser, level: int) -> str:
    return f"{'#' * level} `{title}`\n\n```text\n{parser.format_help().rstrip()}\n```\n"


def cli_reference() -> str:
    """Markdown: the top-level help, then each subcommand's (and each benchmark's) under its heading."""
    from diffuserve.cli.main import SUBCOMMANDS, build_parser

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = COLUMNS
    try:
        parts = [_block("diffuserve", build_parser(None), 2)]
        for name in SUBCOMMANDS:
            subparser = _subparsers(build_parser(name))[name]
            parts.append(_block(f"diffuserve {name}", subparser, 2))
            for inner, innerparser in _subparsers(subparser).items():
                parts.append(_block(f"diffuserve {name} {inner}", innerparser, 3))
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, cli_reference())
