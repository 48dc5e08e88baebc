"""The command-line reference page is the CLI's own `--help` (docs/hooks/cli_reference.py, run by the site build):
every subcommand and every benchmark has its section with its parser's help, and the page's marker is replaced."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from diffuserve.cli.main import SUBCOMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "docs" / "hooks" / "cli_reference.py")
assert _spec is not None and _spec.loader is not None
hook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hook)


def test_every_subcommand_has_its_help_on_the_page():
    page = hook.cli_reference()
    for name in SUBCOMMANDS:
        assert f"## `diffuserve {name}`" in page and f"usage: diffuserve {name} " in page, name
        parser = hook._subparsers(build_parser(name))[name]
        flags = [action.option_strings[-1] for action in parser._actions if action.option_strings]
        missing = [flag for flag in flags if flag not in page]
        assert not missing, (name, missing)
    for benchmark in ("latency", "throughput", "compare", "serve", "moe", "sweep"):
        assert f"### `diffuserve bench {benchmark}`" in page, benchmark
    assert "--max-num-seqs" in page and "--threshold" in page


def test_the_hook_fills_only_the_marked_page():
    marked = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert hook.MARKER in marked
    filled = hook.on_page_markdown(marked, page=None)
    assert hook.MARKER not in filled and "## `diffuserve serve`" in filled
    assert hook.on_page_markdown("# Other page\n", page=None) == "# Other page\n"
