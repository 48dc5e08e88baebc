"""Where the bundled default model lives: the tiny Clover (`clover_moe`) checkpoint shipped inside the package, used by
`diffuserve serve | generate | chat | eval` when no model is given (`diffuserve.model.hub.resolve_model`)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL_DIR = Path(__file__).parents[1] / "assets" / "default-model"  # diffuserve/assets/
