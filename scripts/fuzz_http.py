"""The HTTP fuzz of tests/server/test_fuzz.py with a larger budget: the server on the bundled model, every
operation of its OpenAPI schema, requests that fit the schema and requests that violate it (schemathesis,
diffuserve/testing/http_fuzz.py). Prints one JSON line: operations, examples per operation and mode, the
statuses seen, and every answer that broke the rule (a 5xx, an error not in OpenAI's shape, an error frame in a
stream, /health not 200 after an operation).

    python scripts/fuzz_http.py --examples 100 --json-out /tmp/fuzz.json
    python scripts/render_docs.py --record fuzz-http /tmp/fuzz.json -- python scripts/fuzz_http.py --examples 100
    python scripts/render_docs.py
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diffuserve.model.default_model import DEFAULT_MODEL_DIR
from diffuserve.reference.http_fuzz import fuzz
from diffuserve.server.config import ServerConfig
from tests.server.conftest import LiveServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=100, help="examples per operation and mode")
    parser.add_argument("--json-out", type=Path, help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    server = LiveServer(DEFAULT_MODEL_DIR, ServerConfig(max_n=2), num_pages=256, max_num_seqs=8, max_model_len=48)
    server.start()
    started = time.perf_counter()
    try:
        counts = fuzz(server.app.openapi(), server.url, {}, args.examples)
    finally:
        server.stop()
    result = {**counts.as_json(), "examples_per_operation_and_mode": args.examples}
    line = json.dumps({**result, "seconds": round(time.perf_counter() - started, 1)})
    print(line)
    if args.json_out:
        args.json_out.write_text(line + "\n")
    return 1 if counts.problems else 0


if __name__ == "__main__":
    sys.exit(main())
