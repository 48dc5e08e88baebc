"""Where the bundled default model lives: the tiny Clover (`clover_moe`) checkpoint shipped inside the package, used by
`diffuserve serve | generate | chat | eval` when no model is given."""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL_DIR = Path(__file__).parent / "assets" / "default-model"


def resolve_model(model: str | None) -> str:
    """The given model directory, or the bundled one when none is given."""
    if model:
        return model
    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        raise ValueError(
            f"model: none given and the bundled default model is missing at {DEFAULT_MODEL_DIR}; "
            "pass a model directory (or rebuild it with scripts/train_tiny_model.py)"
        )
    return str(DEFAULT_MODEL_DIR)
