"""SamplingParams and structured-output specs drawn by hypothesis, as an API client could send them: each either
builds or raises one ValueError line that starts with the field it is about; one that builds is either accepted
by the engine or refused before any step (a RequestError), and an accepted one decodes to its end: no exception
inside a step, whatever the combination."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diffuserve import LLM, SamplingParams
from diffuserve.errors import RequestError
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.structured_outputs import StructuredOutputsParams

FIELDS = {
    "n": st.integers(-1, 3),
    "temperature": st.none() | st.floats(-1, 3, allow_nan=False),
    "top_p": st.floats(-0.5, 1.5, allow_nan=False),
    "top_k": st.integers(-2, 50),
    "seed": st.none() | st.integers(0, 2**31),
    "max_tokens": st.none() | st.integers(-1, 12),
    "min_tokens": st.integers(-1, 6),
    "stop": st.lists(st.text(max_size=3), max_size=2),
    "stop_token_ids": st.lists(st.integers(-1, 400), max_size=2),
    "ignore_eos": st.booleans(),
    "decoder": st.none() | st.sampled_from(["threshold", "fixed", "entropy", "edit", "renoise", "greedy"]),
    "threshold": st.none() | st.floats(-0.5, 1.5, allow_nan=False),
    "steps": st.none() | st.integers(0, 6),
    "entropy_bound": st.none() | st.floats(-1, 3, allow_nan=False),
    "logprobs": st.none() | st.integers(-1, 25),
    "prompt_logprobs": st.none() | st.integers(-1, 3),
    "t_min": st.none() | st.floats(-0.5, 2, allow_nan=False),
    "t_max": st.none() | st.floats(-0.5, 2, allow_nan=False),
}
SPECS = st.one_of(
    st.builds(StructuredOutputsParams, regex=st.sampled_from(["[a-z]{1,4}", "(ab|cd)+", "[", "x{2,1}", ""])),
    st.builds(StructuredOutputsParams, choice=st.lists(st.text(max_size=4), max_size=3)),
    st.builds(
        StructuredOutputsParams,
        json=st.sampled_from(
            [
                {"type": "integer"},
                {"type": "object", "properties": {"a": {"type": "string"}}},
                {"type": "nonsense"},
                "{",
                "[1]",
                {"enum": []},
            ]
        ),
    ),
    st.builds(StructuredOutputsParams, grammar=st.sampled_from(['start: "a"+', "start: ", "nonsense"])),
    st.builds(StructuredOutputsParams, json_object=st.just(True)),
)


def _one_line_naming_a_field(error: ValueError) -> None:
    message = str(error)
    assert "\n" not in message and message.split(":", 1)[0].replace(".", "_").isidentifier(), message


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.fixed_dictionaries({}, optional=FIELDS))
def test_sampling_params_build_or_name_the_field(fields):
    try:
        SamplingParams(**fields)
    except ValueError as e:
        _one_line_naming_a_field(e)


@st.composite
def _requests(draw):
    fields = draw(st.fixed_dictionaries({}, optional=FIELDS))
    try:
        spec = draw(SPECS) if draw(st.booleans()) else None
    except ValueError as e:
        _one_line_naming_a_field(e)
        spec = None
    return fields, spec


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(str(tiny_model_dir), num_pages=64, max_model_len=48)


@settings(max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(_requests())
def test_the_engine_accepts_or_refuses_before_any_step(llm: LLM, drawn):
    _accepted_or_refused(llm, *drawn)


def _accepted_or_refused(llm: LLM, fields: dict, spec: StructuredOutputsParams | None) -> None:
    try:
        params = SamplingParams(**fields, structured_outputs=spec)
    except ValueError as e:
        _one_line_naming_a_field(e)
        return
    try:
        outputs = llm.generate({"prompt_token_ids": [5, 9, 14, 2]}, params)
    except RequestError as e:
        _one_line_naming_a_field(e)
        assert not llm.engine.has_unfinished_requests()
        return
    assert all(c.finish_reason in ("stop", "length") for c in outputs[0].outputs)


@pytest.fixture(scope="module")
def clover(tmp_path_factory):
    """A tiny Clover with the block-diffusion tensors: the family that verifies (its causal path predicts the next
    token)."""
    config = make_clover_moe_config(block_length=4)
    model_dir = write_clover_moe_checkpoint(
        tmp_path_factory.mktemp("fuzz") / "clover", config, seed=3, logit_scale=10.0
    )
    return LLM(str(model_dir), num_pages=64, max_model_len=48)


@settings(max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(_requests())
def test_verified_decoding_accepts_or_refuses_before_any_step(clover: LLM, drawn):
    """The same draws under decoder=verified: logprobs, structured output, stops, min_tokens, sampling, n."""
    fields, spec = drawn
    _accepted_or_refused(clover, fields | {"decoder": "verified"}, spec)
