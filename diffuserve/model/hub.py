"""Where a model argument points: a local directory, the bundled default model, or a Hugging Face Hub model id
(`Org/Name`) fetched with huggingface_hub into its standard cache, as vLLM does.

Honours `HF_HUB_OFFLINE=1` (only what is already in the cache; no network), `--revision` (a branch, tag or
commit) and `--download-dir` (a cache directory other than `$HF_HUB_CACHE`). Only the files diffuserve reads are
downloaded (config, weights, tokenizer); never the checkpoint's Python code. Knows nothing of models beyond
file names.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from diffuserve.model.default_model import DEFAULT_MODEL_DIR

ALLOW_PATTERNS = ("*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken")
"""What a model directory needs: config/generation/tokenizer JSON, weights, sentencepiece or BPE files and
chat templates."""

TRUE_VALUES = ("1", "true", "yes", "on")


def add_hub_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--revision", default=None, help="Hub model ids: the branch, tag or commit to use (default: main)"
    )
    parser.add_argument(
        "--download-dir",
        default=None,
        metavar="DIR",
        help="Hub model ids: the cache directory to download to and read from "
        "(default: the Hugging Face cache, $HF_HUB_CACHE)",
    )


def is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE_VALUES


def looks_like_hub_id(model: str) -> bool:
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "~")) and not Path(model).exists()


def resolve_model(model: str | None, revision: str | None = None, download_dir: str | None = None) -> str:
    """The one place a model argument becomes a local model directory: itself if it is a path, the bundled model
    if None (or empty), else the Hub snapshot of that id (downloaded unless HF_HUB_OFFLINE is set). ValueError
    with the fix otherwise."""
    if model and looks_like_hub_id(model):
        return download(model, revision, download_dir)
    if revision is not None:
        target = model or "the bundled model"
        raise ValueError(f"revision: only applies to Hub model ids (Org/Name), not to {target}; remove it")
    return model or bundled_model_dir()


def bundled_model_dir() -> str:
    """The bundled default model's directory; ValueError if the package was installed without it."""
    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        raise ValueError(
            f"model: none given and the bundled default model is missing at {DEFAULT_MODEL_DIR}; "
            "pass a model directory (or rebuild it with scripts/train_tiny_model.py)"
        )
    return str(DEFAULT_MODEL_DIR)


def download(repo_id: str, revision: str | None, download_dir: str | None) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = is_offline()
    try:
        return snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=download_dir,
            allow_patterns=list(ALLOW_PATTERNS),
            local_files_only=offline,
        )
    except LocalEntryNotFoundError as e:
        where = download_dir or "the Hugging Face cache"
        hint = (
            "HF_HUB_OFFLINE is set, so nothing is downloaded; unset it or download the model first"
            if offline
            else "check the network, or pass a local model directory"
        )
        raise ValueError(f"model: {repo_id!r} (revision {revision or 'main'}) is not in {where}; {hint}") from e
    except HfHubHTTPError as e:
        raise ValueError(f"model: {repo_id!r} could not be downloaded from the Hub: {str(e).splitlines()[0]}") from e
