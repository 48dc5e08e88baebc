"""deploy/: every Kubernetes manifest is valid against the Kubernetes API schema (kubernetes-validate ships the
schemas, so this runs offline, strict: an unknown field fails); every `diffuserve serve` command line in the
manifests, the systemd units and the shell recipe parses with the CLI as it is now (a renamed flag fails
here, not at a user's); replica pods are probed on /health; the shell recipe is valid bash."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from diffuserve.cli.main import build_parser

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
KUBERNETES_VERSION = "1.37.0"


def _documents() -> list[dict[str, Any]]:
    return [doc for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def _containers() -> list[dict[str, Any]]:
    return [
        c
        for doc in _documents()
        if doc["kind"] in ("Deployment", "StatefulSet")
        for c in doc["spec"]["template"]["spec"]["containers"]
    ]


def _serve_args(words: list[str]) -> list[str]:
    """The arguments after `diffuserve serve` (or `-m diffuserve serve` under torchrun)."""
    start = next(i for i in range(len(words) - 1) if words[i].endswith("diffuserve") and words[i + 1] == "serve")
    return words[start + 1 :]


def _parses(serve_args: list[str]) -> None:
    args = build_parser("serve").parse_args(serve_args)
    assert args.command == "serve"


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifests_are_valid_kubernetes(path: Path):
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_serve_command_line_parses():
    lines = []
    for container in _containers():
        words = [*container.get("command", []), *container.get("args", [])]
        if words[:2] == ["sh", "-c"]:
            words = shlex.split(re.sub(r'"\$\{HOSTNAME##\*-\}"', "0", " ".join(words[2:])))
        if any(w.endswith("diffuserve") for w in words):
            lines.append(_serve_args(words))
    unit = (DEPLOY / "bare-metal" / "diffuserve@.service").read_text()
    exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M)
    assert exec_start
    lines.append(_serve_args(shlex.split(exec_start[1].replace("%i", "8001"))))
    assert len(lines) == 3  # replicas.yaml, multinode-replica.yaml, the systemd unit
    for serve_args in lines:
        _parses(serve_args)


def test_replica_pods_are_probed_on_health():
    for container in _containers():
        if container["name"] != "diffuserve":
            continue
        for probe in ("startupProbe", "readinessProbe"):
            spec = container[probe]
            target = spec["httpGet"]["path"] if "httpGet" in spec else " ".join(spec["exec"]["command"])
            assert "/health" in target, (container["name"], probe)


def test_the_shell_recipe_is_valid_bash():
    subprocess.run(["bash", "-n", str(DEPLOY / "bare-metal" / "replicas.sh")], check=True)
