"""Where decoding meets the rest of the engine, checked on the code itself:

- a request delegates every decoder-specific choice to its block rule (core/block_rules.py): core/request.py
  never asks which decoder it has;
- the model runner makes two decoding calls per step, `plan` before the forward and `decode` after it, whatever
  mix of decoders the batch holds (masked, edited, penalised, grammar-constrained, verified with drafts checked
  and rejected);
- no code picks between decoder interfaces by probing attributes (`hasattr`): every decoder is a `Decoder`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import diffuserve
from diffuserve import LLM, SamplingParams
from diffuserve.core.block_rules import CANVASES, EDITED, MASKED, VERIFIED_DRAFTS, rule_for
from diffuserve.core.request import Request
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.sampling_params import SamplingParams as Params
from diffuserve.structured_outputs import StructuredOutputsParams

PACKAGE = Path(diffuserve.__file__).parent
DECODER_KINDS = {"is_verified", "is_renoise", "is_editing", "is_auto", "decoder"}
"""Attributes of the sampling parameters that name a decoder kind."""


def test_the_request_never_asks_for_its_decoder_kind():
    tree = ast.parse((PACKAGE / "core" / "request.py").read_text())
    asked = [
        f"line {node.lineno}: .{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in DECODER_KINDS
    ]
    assert not asked, f"core/request.py branches on a decoder kind: {asked}"


def test_each_decoder_kind_has_its_block_rule():
    rules = {name: rule_for(Params(decoder=name).with_defaults({})) for name in ("threshold", "edit", "verified")}
    assert rules == {"threshold": MASKED, "edit": EDITED, "verified": VERIFIED_DRAFTS}
    assert rule_for(Params(decoder="renoise").with_defaults({})) is CANVASES
    assert rule_for(Params(decoder="auto").with_defaults({})) is VERIFIED_DRAFTS
    request = Request("r", [1, 2, 3], Params(decoder="verified").with_defaults({}), block_length=4, mask_token_id=0)
    assert request.is_anchored and request.block_start == 3 and request.draft.end == 3


def test_no_dispatch_between_decoder_interfaces_by_attribute():
    probes = []
    for folder in ("decoding", "worker", "core", "engine"):
        for path in (PACKAGE / folder).rglob("*.py"):
            tree = ast.parse(path.read_text())
            calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "hasattr"]
            probes += [f"{path.relative_to(PACKAGE)}:{call.lineno}" for call in calls]
    assert not probes, f"hasattr dispatch: {probes}"


def _mixed_requests() -> list[tuple[list[int], SamplingParams]]:
    """A batch that exercises every decoding path the runner feeds: drafts kept and rejected, heads checked,
    penalised and grammar-walked blocks, threshold and edit policies."""
    base = dict(max_tokens=10, ignore_eos=True)
    grammar = StructuredOutputsParams(choice=["yes", "no"])
    return [
        ([5, 6, 7], SamplingParams(decoder="verified", **base)),
        ([8, 9, 10, 11, 12], SamplingParams(decoder="verified", presence_penalty=0.5, logprobs=1, **base)),
        ([13, 14], SamplingParams(decoder="threshold", **base)),
        ([15, 16, 17, 18], SamplingParams(decoder="edit", frequency_penalty=0.3, **base)),
        ([19, 20, 21], SamplingParams(decoder="verified", temperature=0.8, seed=3, **base)),
        ([22, 23], SamplingParams(decoder="fixed", structured_outputs=grammar, max_tokens=4)),
        ([24, 25, 26], SamplingParams(decoder="verified", structured_outputs=grammar, max_tokens=4)),
    ]


def test_the_runner_calls_decoding_twice_per_step(tmp_path):
    config = make_clover_moe_config(block_length=4)
    checkpoint = write_clover_moe_checkpoint(tmp_path / "m", config, seed=12, init_std=0.1, logit_scale=10.0)
    engine = LLM(str(checkpoint)).engine
    for i, (prompt, params) in enumerate(_mixed_requests()):
        engine.add_request(str(i), prompt, params)
    runner_file = str(PACKAGE / "worker" / "model_runner.py")
    decoding = str(PACKAGE / "decoding")
    calls: list[list[str]] = []  # per step: the decoding functions the runner called during `execute`
    stepping = False

    def profile(frame, event, _arg):
        nonlocal stepping
        code = frame.f_code
        if event in ("call", "return") and code.co_name == "execute" and code.co_filename == runner_file:
            stepping = event == "call"
            calls.extend([[]] if stepping else [])
        caller = frame.f_back
        from_runner = caller is not None and caller.f_code.co_filename == runner_file
        if event == "call" and stepping and from_runner and code.co_filename.startswith(decoding):
            calls[-1].append(code.co_name)

    sys.setprofile(profile)
    try:
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        sys.setprofile(None)
    stats = engine.stats().spec_decode
    assert stats.num_draft_tokens > stats.num_accepted_tokens > 0, "drafts both kept and rejected"
    assert calls and all(step == ["plan", "decode"] for step in calls), {tuple(c) for c in calls}
