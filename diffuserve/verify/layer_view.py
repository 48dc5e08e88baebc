"""The first K layers of a checkpoint directory as a directory of their own, for `diffuserve verify --layers K`.

The view's config.json says K layers (`num_hidden_layers`, and `layer_types` / `mlp_only_layers` cut to them, at
the top level and under `text_config`); its safetensors hold only the tensors of layers 0..K-1 and the ones
outside the layer stack (embeddings, final norm, LM head), read tensor by tensor from the original, one shard at
a time, so a 35B checkpoint is verified in the memory of K layers. Every other file (tokenizer, generation
config, the checkpoint's own Python modules) is linked. Both the engine's loader and the reference then load the
view as they would load any checkpoint. Knows nothing of models beyond those config keys.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_WEIGHT_FILES = ("model.safetensors.index.json",)


def layer_of(name: str) -> int | None:
    """The decoder layer a tensor belongs to (None: outside the layer stack)."""
    match = _LAYER.search(name)
    return None if match is None else int(match[1])


def truncated_config(config: dict, num_layers: int) -> dict:
    """config.json of the first `num_layers` layers; a ValueError if the model has fewer."""
    out = dict(config)
    for scope in (out, out.get("text_config")):
        if not isinstance(scope, dict) or "num_hidden_layers" not in scope:
            continue
        total = int(scope["num_hidden_layers"])
        if num_layers > total:
            raise ValueError(f"--layers: {num_layers} exceeds the model's {total} layers; pass at most {total}")
        scope["num_hidden_layers"] = num_layers
        if isinstance(scope.get("layer_types"), list):
            scope["layer_types"] = scope["layer_types"][:num_layers]
        if isinstance(scope.get("mlp_only_layers"), list):
            scope["mlp_only_layers"] = [i for i in scope["mlp_only_layers"] if i < num_layers]
    if "text_config" in out:
        out["text_config"] = dict(out["text_config"])
    return out


def _shard_files(model_dir: Path) -> list[str]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        return sorted(set(json.loads(index.read_text())["weight_map"].values()))
    return sorted(p.name for p in model_dir.glob("*.safetensors"))


def write_layer_view(model_dir: str | Path, num_layers: int, out_dir: str | Path) -> Path:
    """Writes the view of `model_dir`'s first `num_layers` layers into `out_dir` (created); returns it."""
    if num_layers < 1:
        raise ValueError(f"--layers: must be at least 1, got {num_layers}")
    src, out = Path(model_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(truncated_config(config, num_layers), indent=2))
    for path in src.iterdir():
        if path.name != "config.json" and not path.name.endswith(".safetensors") and path.name not in _WEIGHT_FILES:
            (out / path.name).symlink_to(path.resolve())
    weight_map: dict[str, str] = {}
    for file in _shard_files(src):
        with safe_open(str(src / file), framework="pt") as f:
            kept = {n: f.get_tensor(n) for n in f.keys() if (layer_of(n) or 0) < num_layers}  # noqa: SIM118
        if kept:
            save_file(kept, str(out / file), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(kept, file))
    if len(set(weight_map.values())) > 1:
        index = {"metadata": {}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return out
