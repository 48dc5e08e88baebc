"""`diffuserve verify --trust-remote-code` against the official code of SDAR and LLaDA2, unmodified, on tiny
seeded checkpoints (CPU, float32).

For each model a tiny checkpoint is written with the official files beside its weights, registered in
config.json's `auto_map` as the released checkpoints register them (diffuserve.reference.official_checkpoints:
SDAR's training/model/SDAR-4B-Chat/ with its generate.py as the block loop; dFactory's models/llada2_moe/ and the
plain LLaDA2 files dMoE ships (evaluations/models/), whose models have their own `generate`), and `diffuserve
verify` runs on it. Prints verify's table for each, then a JSON
line {name: exit code}; exits 1 if any is not 0.

    python scripts/verify_official.py                       # ../shared/reference-code beside the repository
    python scripts/verify_official.py --reference-code DIR  # a folder of that layout (sdar/, llada2-dfactory/, dmoe/)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from diffuserve.cli.main import main as diffuserve_main
from diffuserve.reference.official_checkpoints import OFFICIAL, official_generate, write_official_checkpoint

DEFAULT_ROOT = Path(__file__).resolve().parents[1].parent / "shared" / "reference-code"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference-code", type=Path, default=DEFAULT_ROOT, metavar="DIR", help="official files")
    parser.add_argument("--models", nargs="+", choices=list(OFFICIAL), default=list(OFFICIAL))
    args = parser.parse_args()
    if not args.reference_code.is_dir():
        parser.error(f"--reference-code {args.reference_code}: no such folder; give the official files' folder")
    codes = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            model_dir = write_official_checkpoint(name, args.reference_code, Path(scratch) / name)
            generate = official_generate(name, args.reference_code, Path(scratch))
            flags = ["--reference-generate", str(generate)] if generate is not None else []
            print(f"== {name}: {args.reference_code / OFFICIAL[name].code_dir}", flush=True)
            command = ["verify", str(model_dir), "--trust-remote-code", "--dtype", "float32", *flags]
            codes[name] = diffuserve_main(command)
    print(json.dumps(codes))
    sys.exit(1 if any(code != 0 for code in codes.values()) else 0)


if __name__ == "__main__":
    main()
