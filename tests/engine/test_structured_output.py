"""Grammar-constrained block decoding on tiny random checkpoints (whose free output is garbage): every output
matches its JSON schema, regex or choice list, at block lengths 4 and 32, batched in the same steps with
unconstrained requests whose tokens stay exactly what they are without the constrained neighbours."""

from __future__ import annotations

import json
import re

import jsonschema_rs
import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.decoding import grammar_walk as grammar_decoding
from diffuserve.decoding.grammar_state import GrammarState
from diffuserve.errors import GenerationFailed, RequestError
from diffuserve.structured_outputs import StructuredOutputsParams
from diffuserve.text.tool_format import call_grammar, parse_calls

SCHEMAS = [
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False},
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "size", "inner"],
        "properties": {
            "name": {"type": "string", "maxLength": 3},
            "size": {"type": "integer", "minimum": 2, "maximum": 7},
            "inner": {
                "type": "object",
                "properties": {"kind": {"enum": ["a", "bc", 3]}},
                "required": ["kind"],
                "additionalProperties": False,
            },
        },
    },
    {"type": "array", "items": {"type": "integer", "minimum": -3, "maximum": 3}, "minItems": 1, "maxItems": 3},
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["v"],
        "properties": {"v": {"type": "array", "maxItems": 2, "items": {"enum": ["x", "y"]}}},
    },
]
REGEXES = [r"[a-c]{2,4}", r"(yes|no)-\d"]
CHOICES = [["red", "green", "blue"], ["A", "B"]]
MAX_TOKENS = 64


def _specs() -> list[StructuredOutputsParams]:
    return (
        [StructuredOutputsParams(json=s) for s in SCHEMAS]
        + [StructuredOutputsParams(regex=r) for r in REGEXES]
        + [StructuredOutputsParams(choice=c) for c in CHOICES]
    )


def _matches(spec: StructuredOutputsParams, text: str) -> bool:
    if spec.json is not None:
        return jsonschema_rs.validator_for(spec.json).is_valid(json.loads(text))
    if spec.json_object:
        return isinstance(json.loads(text), dict)
    if spec.regex is not None:
        return re.fullmatch(spec.regex, text) is not None
    assert spec.choice is not None
    return text in spec.choice


def _prompts(n: int) -> list[list[int]]:
    return [[(i * 37 + j * 11) % 250 + 1 for j in range(3 + (i * 13) % 9)] for i in range(n)]


@pytest.mark.parametrize("block", [4, 32])
def test_constrained_outputs_match_and_leave_neighbours_unchanged(tiny_model_dir, tiny_model_dir_b32, block):
    llm = LLM(str(tiny_model_dir if block == 4 else tiny_model_dir_b32), num_pages=512, max_num_seqs=64)
    specs = _specs()
    prompts = _prompts(2 * len(specs))
    free = [SamplingParams(max_tokens=12, threshold=0.5, temperature=0.8 * (i % 2), seed=i) for i in range(len(specs))]
    constrained = [
        SamplingParams(
            max_tokens=MAX_TOKENS,
            threshold=0.5,
            temperature=0.8 * (i % 2),
            seed=i,
            decoder=("threshold", "fixed", "entropy")[i % 3],
            steps=2,
            structured_outputs=s,
        )
        for i, s in enumerate(specs)
    ]
    # constrained and free requests interleaved, so every step batches both
    mixed = [p for pair in zip(constrained, free) for p in pair]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], mixed)
    alone = llm.generate([{"prompt_token_ids": p} for p in prompts[1::2]], free)
    for spec, out in zip(specs, outs[::2]):
        completion = out.outputs[0]
        assert completion.finish_reason == "stop", (spec, completion.text)
        assert _matches(spec, completion.text), (spec, completion.text)
    assert [o.outputs[0].token_ids for o in outs[1::2]] == [o.outputs[0].token_ids for o in alone]


def test_length_inside_the_grammar_is_reported_as_length(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), num_pages=256)
    spec = StructuredOutputsParams(regex=r"a{10}")
    out = llm.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=5, structured_outputs=spec))[0]
    assert out.outputs[0].finish_reason == "length"
    assert out.outputs[0].text == "aaaaa"


def test_several_tokens_per_forward_under_a_forced_grammar(tiny_model_dir_b32):
    """A grammar that leaves one choice per position is committed many tokens a forward (the mask makes each
    position certain), not one: the walk accepts the selected run left to right."""
    llm = LLM(str(tiny_model_dir_b32), num_pages=256)
    spec = StructuredOutputsParams(choice=["abcdefghijklmnopqrst"])
    out = llm.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=40, structured_outputs=spec))[0]
    completion = out.outputs[0]
    assert completion.text == "abcdefghijklmnopqrst"
    assert completion.num_forwards <= 3


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (dict(json={"type": "frobnicate"}), "structured_outputs.json"),
        (dict(regex="[a-"), "structured_outputs.regex"),
        (dict(grammar="start: undefined_rule"), "structured_outputs.grammar"),
    ],
)
def test_a_grammar_that_does_not_compile_is_a_request_error_naming_it(tiny_model_dir, spec, field):
    llm = LLM(str(tiny_model_dir), num_pages=64)
    with pytest.raises(RequestError, match=re.escape(field)):
        llm.generate({"prompt_token_ids": [5, 6]}, SamplingParams(structured_outputs=StructuredOutputsParams(**spec)))
    assert not llm.engine.has_unfinished_requests()


def test_params_shape_is_checked():
    with pytest.raises(RequestError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])
    with pytest.raises(RequestError, match="decoder"):
        SamplingParams(decoder="edit", structured_outputs=StructuredOutputsParams(regex="a"))


def test_offline_chat_with_tools_and_a_forced_call(tiny_model_dir):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "add",
                "parameters": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["a"],
                    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
                },
            },
        }
    ]
    llm = LLM(str(tiny_model_dir), num_pages=256)
    spec = StructuredOutputsParams(grammar=call_grammar(tools, parallel=False))
    out = llm.chat(
        [{"role": "user", "content": "add"}], SamplingParams(max_tokens=64, structured_outputs=spec), tools=tools
    )
    content, calls = parse_calls(out.outputs[0].text)
    assert content == "" and [c.name for c in calls] == ["add"]
    assert 0 <= json.loads(calls[0].arguments)["a"] <= 99
    assert len(out.prompt_token_ids) > len(json.dumps(tools))  # the tools were rendered (system-prompt fallback)


def test_ignore_eos_never_feeds_eos_to_the_grammar_as_text(tiny_model_dir):
    """With ignore_eos the model's EOS is no stop id: the grammar forbids it until it is complete, then the
    request runs on (unconstrained) to max_tokens."""
    llm = LLM(str(tiny_model_dir), num_pages=256)
    spec = StructuredOutputsParams(choice=["ab", "cd"])
    out = llm.generate(
        {"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=12, ignore_eos=True, structured_outputs=spec)
    )[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 12
    assert out.text[:2] in ("ab", "cd")


def test_min_tokens_past_the_grammar_end_yields_to_the_grammar(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), num_pages=256)
    spec = StructuredOutputsParams(choice=["ab"])
    out = llm.generate(
        {"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=8, min_tokens=4, structured_outputs=spec)
    )[0].outputs[0]
    assert out.text.startswith("ab") and len(out.token_ids) >= 4


def test_a_failing_grammar_fails_its_request_only(tiny_model_dir, monkeypatch):
    llm = LLM(str(tiny_model_dir), num_pages=256)
    free = SamplingParams(max_tokens=8, ignore_eos=True)
    expected = llm.generate({"prompt_token_ids": [9, 8, 7]}, free)[0].outputs[0].token_ids

    def fail(self):
        raise RuntimeError("parser too complex")

    monkeypatch.setattr(GrammarState, "allowed", fail)
    spec = StructuredOutputsParams(regex="[a-z]+")
    with pytest.raises(GenerationFailed, match="parser too complex") as failed:
        llm.generate(
            [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [9, 8, 7]}],
            [SamplingParams(max_tokens=8, structured_outputs=spec), free],
        )
    outs = failed.value.outputs
    assert outs[0].outputs[0].finish_reason == "error" and "parser too complex" in outs[0].outputs[0].error
    assert outs[1].outputs[0].token_ids == expected


def test_preemption_keeps_the_grammar_in_step(tiny_model_dir):
    """A page budget that holds three requests at once: the others are preempted and recomputed, and their
    matchers follow the decided tokens back and forth; every output still matches, and equals a roomy run's."""
    long_array = {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 12,
        "maxItems": 12,
    }
    specs = [
        StructuredOutputsParams(regex=r"[a-c]{40}"),
        StructuredOutputsParams(regex=r"(ab|cd){20}"),
        StructuredOutputsParams(json=long_array),
    ] * 3
    prompts = [[(i * 7 + j) % 250 + 1 for j in range(30 + i % 7)] for i in range(len(specs))]
    params = [SamplingParams(max_tokens=MAX_TOKENS, threshold=0.7, structured_outputs=s) for s in specs]
    roomy = LLM(str(tiny_model_dir), num_pages=1024, max_num_seqs=32)
    expected = [o.outputs[0].text for o in roomy.generate([{"prompt_token_ids": p} for p in prompts], params)]
    # pages of 16 tokens: a request needs at most ceil((36 + 64) / 16) = 7 pages; 14 pages hold two at once
    tight = LLM(str(tiny_model_dir), num_pages=14, max_num_seqs=32, enable_prefix_caching=False)
    outs = tight.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert tight.engine.stats().num_preemptions > 0
    assert [o.outputs[0].text for o in outs] == expected
    assert all(_matches(s, t) for s, t in zip(specs, expected))


def test_the_schedule_count_is_kept_under_a_grammar(tiny_model_dir_b32):
    """decoder=fixed with steps=4 at block 32 commits exactly 8 tokens a step, taken from the left, even where the
    model is unconfident: 12 letters and EOS in the first block take 2 forwards, the rest of the block none."""
    llm = LLM(str(tiny_model_dir_b32), num_pages=256)
    spec = StructuredOutputsParams(regex=r"[a-z]{12}")
    params = SamplingParams(max_tokens=40, decoder="fixed", steps=4, structured_outputs=spec)
    out = llm.generate({"prompt_token_ids": [5, 6, 7]}, params)[0].outputs[0]
    assert re.fullmatch(r"[a-z]{12}", out.text) and out.finish_reason == "stop"
    assert out.num_forwards == 2


@pytest.mark.parametrize(
    ("decoder", "steps", "threshold"), [("threshold", None, 0.5), ("threshold", 2, 0.99), ("fixed", 4, 0.9)]
)
def test_the_early_stopped_walk_accepts_what_the_decoders_rule_accepts(
    tiny_model_dir_b32, monkeypatch, decoder, steps, threshold
):
    """Threshold and fixed stop walking once no later position can be accepted; walking every position and
    asking the decoder (the general path) gives the same tokens and forwards at temperature 0."""
    llm = LLM(str(tiny_model_dir_b32), num_pages=512, max_num_seqs=64)
    specs = _specs()
    prompts = [{"prompt_token_ids": p} for p in _prompts(len(specs))]
    params = [
        SamplingParams(max_tokens=MAX_TOKENS, decoder=decoder, steps=steps, threshold=threshold, structured_outputs=s)
        for s in specs
    ]

    def run() -> list:
        return [(o.outputs[0].token_ids, o.outputs[0].num_forwards) for o in llm.generate(prompts, params)]

    early = run()
    monkeypatch.setattr(grammar_decoding, "_early_stop", lambda *args: None)
    assert run() == early
