"""`diffuserve quantize SRC DST --quantization fp8|int8|int4`: writes a compressed-tensors checkpoint of a 16/32-bit
one (model/quant/writer.py), which then loads without `--quantization` and with no 16-bit copy in memory."""

from __future__ import annotations

import argparse
import json

from diffuserve.config import add_quantization_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC", help="16/32-bit model directory (config.json + safetensors)")
    parser.add_argument("dst", metavar="DST", help="new directory for the quantized checkpoint")
    add_quantization_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from diffuserve.model.quant.scheme import DEFAULT_TARGETS, make_scheme
    from diffuserve.model.quant.writer import quantize_checkpoint

    scheme = make_scheme(
        getattr(args, "quantization", None),
        getattr(args, "quantization_targets", DEFAULT_TARGETS),
        getattr(args, "quantization_group_size", 128),
    )
    summary = quantize_checkpoint(args.src, args.dst, scheme)
    ratio = summary["bytes_after"] / max(summary["bytes_before"], 1)
    print(
        f"wrote {args.dst}: {summary['format']}, {summary['bytes_before'] / 2**20:.1f} MiB -> "
        f"{summary['bytes_after'] / 2**20:.1f} MiB ({ratio:.2f}x)"
    )
    print(json.dumps(summary))
    return 0
