"""User and config errors: each names the field, the value and the fix; the CLI prints one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from diffuserve import LLM, EngineConfig, SamplingParams
from diffuserve.errors import ContextLengthExceeded, DuplicateRequestId, InvalidTokenIds, RequestError


def _edit_config(src, dst, **changes):
    import shutil

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_nonexistent_path():
    with pytest.raises(ValueError, match="does not exist"):
        LLM("/no/such/model")


def test_missing_config(tmp_path):
    with pytest.raises(ValueError, match=r"no config\.json"):
        LLM(str(tmp_path))


def test_unsupported_architecture(tiny_model_dir, tmp_path):
    path = _edit_config(tiny_model_dir, tmp_path / "m", architectures=["LlamaForCausalLM"])
    with pytest.raises(ValueError, match=r"'LlamaForCausalLM' is not supported; supported: SDARForCausalLM"):
        LLM(str(path))


def test_missing_mask_token_id(tiny_model_dir, tmp_path):
    path = _edit_config(tiny_model_dir, tmp_path / "m", mask_token_id=None)
    with pytest.raises(ValueError, match="missing field `mask_token_id`"):
        LLM(str(path))


def test_prompt_longer_than_max_model_len(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), max_model_len=32, num_pages=16)
    with pytest.raises(ValueError, match=r"40 tokens leave no room to generate within max_model_len 32"):
        llm.generate({"prompt_token_ids": [1] * 40})


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("temperature", -0.5, "temperature: got -0.5, must be >= 0"),
        ("top_p", 0.0, "top_p: got 0.0"),
        ("max_tokens", -1, "max_tokens: got -1, must be >= 0"),
        ("decoder", "beam", "decoder: got 'beam'"),
        ("threshold", 1.5, "threshold: got 1.5"),
        ("n", 0, "n: got 0"),
        ("output_kind", 1, r"output_kind: got 1, must be a RequestOutputKind \(\[0, 2\]\)"),
    ],
)
def test_invalid_sampling_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value})


def test_unknown_engine_option_lists_valid_ones():
    with pytest.raises(ValueError, match=r"unknown engine option 'max_num_seq'; valid options: .*max_num_seqs"):
        EngineConfig.from_kwargs("m", max_num_seq=4)


def test_bad_token_ids(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), num_pages=16)
    with pytest.raises(ValueError, match=r"prompt_token_ids: \[100000\] are not token ids"):
        llm.generate({"prompt_token_ids": [1, 100000]})
    mask = llm.engine.args.mask_token_id
    with pytest.raises(InvalidTokenIds, match=rf"prompt_token_ids: contains the mask token \(id {mask}\)"):
        llm.generate({"prompt_token_ids": [1, mask, 2]})
    assert not llm.engine.has_unfinished_requests()


def test_stop_token_ids_outside_the_vocabulary(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), num_pages=16)
    with pytest.raises(ValueError, match=r"stop_token_ids: \[5000\] are not token ids"):
        llm.generate("hi", SamplingParams(stop_token_ids=[5000], min_tokens=2))


def test_tiny_temperature_decodes_greedily(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), num_pages=16)
    greedy, tiny = (llm.generate("abc", SamplingParams(max_tokens=8, temperature=t))[0] for t in (0.0, 1e-9))
    assert greedy.outputs[0].token_ids == tiny.outputs[0].token_ids


def test_page_size_must_hold_whole_blocks(tiny_model_dir):
    message = r"page_size: 6 is not a multiple of the block length 4; use e\.g\. --page-size 8"
    with pytest.raises(ValueError, match=message):
        LLM(str(tiny_model_dir), page_size=6)


def test_cli_prints_one_line_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "diffuserve", "generate", "--model", str(tmp_path / "none"), "hi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert "does not exist" in result.stderr


def test_add_request_raises_typed_errors_and_queues_nothing(tiny_model_dir):
    engine = LLM(str(tiny_model_dir), max_model_len=64, num_pages=2).engine  # pages of 16 tokens
    engine.add_request("taken", [1, 2, 3], SamplingParams(max_tokens=2))
    cases = [
        (("taken", [1, 2]), DuplicateRequestId, "request_id", "duplicate_request_id", "'taken' is already in use"),
        (("p", [1, 100000]), InvalidTokenIds, "prompt_token_ids", "invalid_value", r"\[100000\]"),
        (
            ("p", [1, 2], SamplingParams(stop_token_ids=[5000])),
            InvalidTokenIds,
            "stop_token_ids",
            "invalid_value",
            r"\[5000\]",
        ),
        (
            ("p", [1] * 70),
            ContextLengthExceeded,
            "prompt",
            "context_length_exceeded",
            "70 tokens leave no room to generate within max_model_len 64; shorten the prompt or raise --max-model-len",
        ),
        (
            ("p", [1] * 8, SamplingParams(max_tokens=50)),
            ContextLengthExceeded,
            "max_tokens",
            "context_length_exceeded",
            r"prompt \(8 tokens\) \+ max_tokens \(50\) need .* KV pages .*--num-pages",
        ),
    ]
    for args, kind, param, code, message in cases:
        with pytest.raises(kind, match=message) as error:
            engine.add_request(*args)
        assert isinstance(error.value, ValueError)
        assert (error.value.param, error.value.code) == (param, code)
    assert list(engine.scheduler.requests) == ["taken"]
    with pytest.raises(RequestError) as error:
        SamplingParams(temperature=-1)
    assert (error.value.param, error.value.code) == ("temperature", "invalid_value")
