"""Hub model ids resolve through huggingface_hub's standard cache layout, offline (no network here): the
snapshot of a branch or commit, one-line errors for what is not cached, local paths untouched; and LLM takes a
Hub id as vLLM does."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from diffuserve.model.hub import looks_like_hub_id, resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def populate_hub_cache(cache: Path, repo_id: str, model_dir: Path, commit: str = COMMIT) -> Path:
    """Lays `model_dir` out as huggingface_hub caches a download of `repo_id` at `commit` (branch main)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(model_dir, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture()
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_a_cached_hub_id_resolves_offline(tmp_path: Path, tiny_model_dir: Path, offline):
    snapshot = populate_hub_cache(tmp_path / "hub", "org/tiny", tiny_model_dir)
    assert Path(resolve_model("org/tiny", download_dir=str(tmp_path / "hub"))) == snapshot
    assert Path(resolve_model("org/tiny", COMMIT, str(tmp_path / "hub"))) == snapshot


def test_what_is_not_cached_is_a_one_line_error(tmp_path: Path, tiny_model_dir: Path, offline):
    populate_hub_cache(tmp_path / "hub", "org/tiny", tiny_model_dir)
    for repo_id, revision in (("org/other", None), ("org/tiny", "v2")):
        with pytest.raises(ValueError, match="HF_HUB_OFFLINE") as missing:
            resolve_model(repo_id, revision, str(tmp_path / "hub"))
        assert repo_id in str(missing.value) and "\n" not in str(missing.value)


def test_local_paths_are_not_hub_ids(tmp_path: Path, tiny_model_dir: Path):
    assert resolve_model(str(tiny_model_dir)) == str(tiny_model_dir)
    assert not looks_like_hub_id(str(tiny_model_dir)) and not looks_like_hub_id("./org/name")
    assert looks_like_hub_id("inclusionAI/LLaDA2.0-mini")
    with pytest.raises(ValueError, match="revision"):
        resolve_model(str(tiny_model_dir), revision="main")


def test_no_model_is_the_bundled_one_and_its_absence_a_one_line_error(tmp_path: Path, monkeypatch):
    from diffuserve.model.default_model import DEFAULT_MODEL_DIR

    assert resolve_model(None) == resolve_model("") == str(DEFAULT_MODEL_DIR)
    with pytest.raises(ValueError, match="revision"):
        resolve_model(None, revision="main")
    monkeypatch.setattr("diffuserve.model.hub.DEFAULT_MODEL_DIR", tmp_path / "absent")
    with pytest.raises(ValueError, match="bundled default model is missing") as missing:
        resolve_model(None)
    assert "pass a model directory" in str(missing.value) and "\n" not in str(missing.value)


def test_llm_takes_a_hub_id(tmp_path: Path, tiny_model_dir: Path, offline, monkeypatch):
    from diffuserve.llm import LLM

    snapshot = populate_hub_cache(tmp_path / "hub", "org/tiny", tiny_model_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    llm = LLM("org/tiny", device="cpu", num_pages=16, max_model_len=64)
    assert Path(llm.engine.config.model) == snapshot
    assert llm.generate("hi")[0].outputs[0].token_ids
