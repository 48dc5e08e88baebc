"""lm-eval-harness against the server, unmodified: its `local-completions` model runs the local multiple-choice
task (loglikelihood requests: echo + logprobs on context + continuation) and the generate_until task of
examples/lm_eval on the bundled model, as the commands in docs/serving/logprobs.md do. Both score the model's held-out
prompts, which it answers well, so a broken prompt scoring (or generation) shows as a collapsed accuracy."""

from __future__ import annotations

from pathlib import Path

import pytest

from diffuserve.model.default_model import DEFAULT_MODEL_DIR
from diffuserve.server.config import ServerConfig
from tests.server.conftest import LiveServer

lm_eval = pytest.importorskip("lm_eval")

REPO = Path(__file__).resolve().parents[2]
MIN_ACCURACY = 0.8
"""Measured 0.95 on both tasks (docs/serving/logprobs.md); four choices by chance give about 0.27."""


@pytest.mark.slow
def test_lm_eval_local_completions_runs_multiple_choice_and_generation(monkeypatch, single_threaded_torch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(REPO)  # the task files name their data relative to the repository root
    server = LiveServer(DEFAULT_MODEL_DIR, ServerConfig(served_model_name="default-model")).start()
    model_args = (
        f"model=default-model,base_url={server.url}/v1/completions,tokenizer_backend=huggingface,"
        f"tokenizer={DEFAULT_MODEL_DIR},num_concurrent=4,max_retries=1"
    )
    try:
        results = lm_eval.simple_evaluate(
            model="local-completions",
            model_args=model_args,
            tasks=["diffuserve_mc", "diffuserve_gen"],
            task_manager=lm_eval.tasks.TaskManager(include_path=str(REPO / "examples" / "lm_eval")),
        )
    finally:
        server.stop()
    assert results["results"]["diffuserve_mc"]["acc,none"] >= MIN_ACCURACY
    assert results["results"]["diffuserve_gen"]["exact_match,none"] >= MIN_ACCURACY
