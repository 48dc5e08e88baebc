"""Where the bundled default model lives: the tiny Clover (`clover_moe`) checkpoint shipped inside the package, used by
`diffuserve serve | generate | chat | eval` when no model is given (`diffuserve.model.hub.resolve_model`), and its
draft adapter for verified decoding at block length 8 (scripts/train_draft_adapter.py)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL_DIR = Path(__file__).parents[1] / "assets" / "default-model"  # diffuserve/assets/
DEFAULT_DRAFT_ADAPTER_DIR = Path(__file__).parents[1] / "assets" / "default-draft-adapter"
DEFAULT_DRAFT_BLOCK_LENGTH = 8
"""The block length the bundled draft adapter drafts (serve it with --block-length 8)."""
