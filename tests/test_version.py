"""`diffuserve --version` prints the installed distribution's version, which is pyproject.toml's (one source)."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

import diffuserve
from diffuserve.cli.main import main

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_version_flag_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"diffuserve {importlib.metadata.version('diffuserve')}\n"


def test_the_version_is_pyprojects():
    declared = re.search(r'^version = "([^"]+)"$', PYPROJECT.read_text(), re.MULTILINE)
    assert declared is not None, 'pyproject.toml: no `version = "..."` line'
    assert diffuserve.__version__ == importlib.metadata.version("diffuserve") == declared.group(1)
