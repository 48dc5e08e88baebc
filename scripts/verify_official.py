"""`diffuserve verify --trust-remote-code` against the official modeling code of SDAR and LLaDA2, on tiny random
checkpoints (CPU, fp32). Not run in CI: it needs copies of that code, which this repository does not carry.

For each code given, a tiny checkpoint of the family is written (diffuserve.reference: SDAR dense / SDAR-MoE shape,
LLaDA2's Hub layout), the official modules are copied next to its weights and registered in config.json's
`auto_map`, as the released checkpoints ship them, and `diffuserve verify` runs in this process (so that the
stand-ins for dFactory's `veomni` imports apply: scripts/llada2_greedy_sweep.py's). Prints verify's table for
each and a final JSON line {name: exit code}; exits 1 if any parts.

    # SDAR: JetAstra/SDAR, training/model/SDAR-4B-Chat/{configuration,modeling}_sdar.py
    # LLaDA2: dFactory's models/llada2_moe/ or the Hugging Face release's {configuration,modeling}_llada2_moe.py
    pip install --target /tmp/tf4 transformers==4.57.1        # the official files import names 5.x removed
    PYTHONPATH=/tmp/tf4:$PWD python scripts/verify_official.py --sdar /tmp/SDAR/training/model/SDAR-4B-Chat \\
        --llada2 /tmp/dFactory/models/llada2_moe [--sdar-moe DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from diffuserve.cli.main import main as diffuserve_main
from diffuserve.reference.llada2_checkpoint import write_llada2_checkpoint
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint

sys.path.insert(0, str(Path(__file__).parent))
from llada2_greedy_sweep import install_veomni_stand_ins

CODES = {
    # name: (module stem, auto_map entries)
    "sdar": (
        "sdar",
        {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
    ),
    "sdar_moe": (
        "sdar_moe",
        {
            "AutoConfig": "configuration_sdar_moe.SDARMoeConfig",
            "AutoModelForCausalLM": "modeling_sdar_moe.SDARMoeForCausalLM",
        },
    ),
    "llada2": (
        "llada2_moe",
        {
            "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
            "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM",
        },
    ),
}


def write_checkpoint(name: str, out: Path) -> Path:
    if name == "llada2":
        return write_llada2_checkpoint(out, seed=5, init_std=0.1)
    overrides = {"num_experts": 0, "first_k_dense_replace": 0} if name == "sdar" else {}
    return write_random_checkpoint(out, make_config("sdar-moe-tiny", **overrides), seed=5, init_std=0.1)


def with_official_code(model_dir: Path, code_dir: Path, name: str) -> Path:
    stem, auto_map = CODES[name]
    for kind in ("configuration", "modeling"):
        source = code_dir / f"{kind}_{stem}.py"
        if not source.is_file():
            sys.exit(f"--{name.replace('_', '-')} {code_dir}: no {source.name}")
        shutil.copy(source, model_dir / source.name)
    config = json.loads((model_dir / "config.json").read_text())
    config["auto_map"] = auto_map
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    return model_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in CODES:
        parser.add_argument(f"--{name.replace('_', '-')}", type=Path, metavar="DIR", help=f"{name}'s official code")
    args = parser.parse_args()
    given = {name: getattr(args, name) for name in CODES if getattr(args, name) is not None}
    if not given:
        parser.error("give at least one of --sdar, --sdar-moe, --llada2")
    install_veomni_stand_ins()
    codes = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, code_dir in given.items():
            model_dir = with_official_code(write_checkpoint(name, Path(scratch) / name), code_dir, name)
            print(f"== {name}: {code_dir}", flush=True)
            codes[name] = diffuserve_main(["verify", str(model_dir), "--trust-remote-code", "--dtype", "float32"])
    print(json.dumps(codes))
    sys.exit(1 if any(code != 0 for code in codes.values()) else 0)


if __name__ == "__main__":
    main()
