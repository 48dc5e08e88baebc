"""docs/architecture.md against the code it describes, so the map cannot go stale:

- every path in the package map exists, and a package whose modules the map lists has all of them listed;
- the torch-free list ("`core/`, `text/`, `cli/` and `planner/` import without torch, and `engine/` except ...")
  is what importing each module with torch blocked measures;
- the life of one offline request, hop by hop, names exactly the files a traced `LLM.generate` call runs code in,
  and the count the doc states is that number.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import diffuserve

PACKAGE = Path(diffuserve.__file__).parent
REPO = PACKAGE.parent
DOC = REPO / "docs" / "architecture.md"
ENTRY = re.compile(r"^(?P<indent> *)(?P<name>[\w.-]+(?:/[\w.-]+)*(?:\.py|/))(?:\s{2,}|$)")


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _package_map() -> tuple[list[str], str]:
    """(paths the map lists, relative to the repository root; the map's whole text)."""
    block = _section("Packages").split("```")[1]
    stack: list[tuple[int, str]] = []
    paths = []
    for line in block.splitlines():
        match = ENTRY.match(line)
        if match is None or len(match["indent"]) > 8:
            continue  # a description's continuation line
        indent = len(match["indent"])
        stack = [(i, p) for i, p in stack if i < indent]
        path = (stack[-1][1] if stack else "") + match["name"]
        paths.append(path)
        if path.endswith("/"):
            stack.append((indent, path))
    return paths, block


def test_every_mapped_path_exists():
    paths, _ = _package_map()
    assert paths, "docs/architecture.md: no package map found under '## Packages'"
    missing = [p for p in paths if not (REPO / p).exists()]
    assert not missing, f"docs/architecture.md lists paths that do not exist: {missing}"


def test_a_package_with_listed_modules_lists_them_all():
    paths, block = _package_map()
    listed_dirs = {str(Path(p).parent) for p in paths if p.endswith(".py")}
    unlisted = []
    for directory in sorted(listed_dirs):
        for module in sorted((REPO / directory).glob("*.py")):
            if module.name != "__init__.py" and module.name not in block:
                unlisted.append(f"{directory}/{module.name}")
    assert not unlisted, f"docs/architecture.md's package map does not mention: {unlisted}"


TORCH_FREE = ("diffuserve.core", "diffuserve.planner", "diffuserve.text", "diffuserve.cli")
"""Packages that import without torch, every module of them (the CLI imports the engine inside its commands)."""
TORCH_PROBE = f"""
import importlib, json, pkgutil, sys
TORCH_FREE = {TORCH_FREE!r}
sys.modules["torch"] = None  # any `import torch` now raises ImportError
needs = []
for package in TORCH_FREE + ("diffuserve.engine",):
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        try:
            importlib.import_module(info.name)
        except ImportError as e:
            if "torch" not in str(e):
                raise
            needs.append(info.name)
print(json.dumps(needs))
"""


def test_torch_free_list_is_measured():
    boundaries = _section("Packages").split("Boundaries:", 1)[1]
    exceptions = re.search(r"`engine/` \(except ([^)]*)\)", boundaries)
    assert exceptions, "docs/architecture.md: the Boundaries paragraph must say `engine/` (except ...)"
    documented = {f"diffuserve.engine.{name}" for name in re.findall(r"`([\w.]+)`", exceptions[1])}
    result = subprocess.run(
        [sys.executable, "-c", TORCH_PROBE],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    measured = set(json.loads(result.stdout))
    torch_free = {m for m in measured if m.startswith(TORCH_FREE)}
    assert not torch_free, f"modules of torch-free packages that need torch: {sorted(torch_free)}"
    assert measured == documented, (
        f"engine modules that need torch: measured {sorted(measured)}, documented {sorted(documented)}"
    )


def _documented_hops(title: str) -> tuple[set[str], int]:
    section = _section("The life of a request")
    hops = section.split(f"### {title}", 1)
    assert len(hops) == 2, f"docs/architecture.md: missing '### {title}'"
    text = hops[1].split("\n### ", 1)[0]
    files = set(re.findall(r"`([\w/]+\.py):[\w.]+`", text))
    count = re.search(r"touches \*\*(\d+) files\*\*", text)
    assert count, f"docs/architecture.md: '{title}' must state 'touches **N files**'"
    return files, int(count[1])


def _trace(model_dir: Path, decoder: str | None = None) -> set[str]:
    """The package files whose code runs while `LLM.generate` serves one prompt (with `decoder`, else the
    model's)."""
    from diffuserve import LLM, SamplingParams

    llm = LLM(str(model_dir))
    files: set[str] = set()
    root = str(PACKAGE) + os.sep

    def profile(frame, event, _arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            files.add(os.path.relpath(frame.f_code.co_filename, PACKAGE))

    sys.setprofile(profile)
    try:
        llm.generate(["What is 27+15?"], SamplingParams(max_tokens=8, decoder=decoder))
    finally:
        sys.setprofile(None)
    return files


def _check_hops(title: str, traced_files: set[str]) -> None:
    documented, count = _documented_hops(title)
    assert documented == traced_files, (
        f"{title}: hop list vs trace: only documented {sorted(documented - traced_files)}, "
        f"only traced {sorted(traced_files - documented)}"
    )
    assert count == len(traced_files), f"{title}: the doc says {count} files; the request touches {len(traced_files)}"


def test_the_hop_list_names_the_files_a_request_runs_in(tmp_path: Path):
    """An attention-only model: a tiny sdar MoE checkpoint (every layer MoE, no shared expert)."""
    from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint

    model_dir = write_random_checkpoint(tmp_path / "sdar", make_config("sdar-moe-tiny", block_length=4))
    _check_hops("One offline request, hop by hop", _trace(model_dir))


def test_the_clover_hop_list_names_the_files_a_request_runs_in():
    from diffuserve.model.default_model import DEFAULT_MODEL_DIR

    _check_hops("The same request on the bundled Clover, hop by hop", _trace(DEFAULT_MODEL_DIR))


VERIFICATION_FILES = {
    "core/verification.py",
    "core/draft_state.py",
    "decoding/verified.py",
    "decoding/verification.py",
    "decoding/head_checks.py",
    "decoding/draft_checks.py",
    "worker/verification.py",
    "engine/spec_decode_stats.py",
    "decoding/mask_batch.py",
    "decoding/propose_batch.py",
}
"""What verified decoding's path adds to the plain one: its bookkeeping and draft state, decoder, the step's
checks, worker side and counters, and the batched pass its one-forward drafts go through."""


def test_the_verified_hop_list_is_the_plain_one_and_the_verification_files():
    from diffuserve.model.default_model import DEFAULT_MODEL_DIR

    plain, verified = _trace(DEFAULT_MODEL_DIR), _trace(DEFAULT_MODEL_DIR, "verified")
    _check_hops("The same request with decoder=verified, hop by hop", verified)
    assert verified - plain == VERIFICATION_FILES and plain <= verified


TOKEN_STAGES = (  # (file prefix under diffuserve/, the stage a block's tokens are in there), in path order
    ("worker/model_runner.py", "logits"),
    ("decoding/", "decoder"),
    ("core/scheduler.py", "applied"),
    ("core/cache/", "applied"),
    ("engine/output_processor.py", "output"),
    ("engine/completion.py", "output"),
    ("engine/detokenizer.py", "output"),
    ("text/", "output"),
    ("core/outputs.py", "output"),
)
STATUS_ONLY = {"finish_requests", "release", "finish_block"}
"""Calls that carry no token: finishing (statuses set by stop strings, aborts) and freeing a finished request's or
block's per-request state. Left out of the path, as is core/request.py, the request itself, which every stage
reads."""


def _stage(frame) -> str | None:
    path = os.path.relpath(frame.f_code.co_filename, PACKAGE)
    if frame.f_code.co_name in STATUS_ONLY:
        return None
    return next((stage for prefix, stage in TOKEN_STAGES if path.startswith(prefix)), None)


def test_a_block_goes_from_logits_to_output_without_going_back(tmp_path: Path):
    """From the moment a step's logits exist (`ModelRunner._decode_blocks`) to the step's `RequestOutput`s, the
    code a block's tokens run through visits each stage once, in order: the runner, the request's decoder, the
    scheduler applying them, the output processor, the outputs. A design where the runner and the decoding
    code call each other back and forth (or the decoder is chosen in several places) fails here."""
    from diffuserve import LLM, SamplingParams
    from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint

    llm = LLM(str(write_random_checkpoint(tmp_path / "m", make_config("sdar-moe-tiny", block_length=4))))
    engine = llm.engine
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13]]
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=8, ignore_eos=True))
    sequences: list[list[str]] = []

    recording = False

    def profile(frame, event, _arg):
        nonlocal recording
        name = frame.f_code.co_name
        if event == "return" and name == "step" and frame.f_code.co_filename.endswith("llm_engine.py"):
            recording = False  # the step's outputs are built
        if event != "call":
            return
        if name == "_decode_blocks":
            recording = True
            sequences.append([])
        stage = _stage(frame) if recording else None
        if stage is not None and (not sequences[-1] or sequences[-1][-1] != stage):
            sequences[-1].append(stage)

    sys.setprofile(profile)
    try:
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        sys.setprofile(None)
    order = ["logits", "decoder", "applied", "output"]
    assert sequences, "no step decoded a block"
    for sequence in sequences:
        assert sequence == [s for s in order if s in sequence], f"a block's tokens went back: {sequence}"
        assert sequence[:3] == ["logits", "decoder", "applied"], sequence
