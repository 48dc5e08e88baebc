#!/usr/bin/env bash
# Downloads the wheels the GPU machine lacks (it has torch with CUDA, Triton and transformers but no network) into
# wheels/gpu/ (ignored by git), for Python 3.12 on manylinux x86_64: flash-linear-attention (and fla-core, the
# kernels it splits into), causal-conv1d where a manylinux wheel exists, flashinfer-python when it fits (its wheel
# is ~100 MiB from 0.7: FLASHINFER names the requirement, e.g. an older, smaller release; the attention check
# reports it missing otherwise). Binary wheels only, no dependencies (the machine has them). Fails when the folder
# exceeds 64 MiB. `scripts/gpu_check.sh --smoke` installs whatever the folder holds.
# Usage: scripts/gpu_wheels.sh        (PYTHON: the pip to use; default python3)
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
DEST=wheels/gpu
LIMIT_MIB=64
mkdir -p "$DEST"
download() {
    "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        "$@"
}
size_mib() { echo $(( $(du -sk "$1" | cut -f1) / 1024 )); }
download --dest "$DEST" flash-linear-attention fla-core
download --dest "$DEST" causal-conv1d ||
    echo "gpu_wheels: no manylinux wheel of causal-conv1d (the GDN conv falls back to torch)" >&2
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
download --dest "$STAGE" "${FLASHINFER:-flashinfer-python}"
if (( $(size_mib "$DEST") + $(size_mib "$STAGE") <= LIMIT_MIB )); then
    mv "$STAGE"/*.whl "$DEST"/
else
    echo "gpu_wheels: left out $(ls "$STAGE") ($(size_mib "$STAGE") MiB): the folder would pass ${LIMIT_MIB} MiB" >&2
fi
ls -l "$DEST"
total=$(size_mib "$DEST")
echo "gpu_wheels: $DEST holds ${total} MiB (limit ${LIMIT_MIB})"
if (( total > LIMIT_MIB )); then
    echo "gpu_wheels: $DEST is ${total} MiB, over ${LIMIT_MIB} MiB; remove the largest wheel or drop a package" >&2
    exit 1
fi
