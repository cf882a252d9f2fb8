#!/usr/bin/env bash
# Build the Lambda layer directory for Switchyard's functions:
#   layers/build/switchyard/python/   <- requirements.txt (manylinux x86_64, CPython 3.11) + switchyard/
# Usage: layers/build.sh [OUTPUT_DIR]   (default: layers/build/switchyard)
# Runs on any Linux machine with Python 3.11 and pip; downloads wheels only, compiles nothing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/layers/build/switchyard}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3.11 || command -v python3)"

TARGET="$OUT/python"
rm -rf "$OUT"
mkdir -p "$TARGET"

echo "layers: installing requirements.txt for manylinux x86_64 / CPython 3.11 into $TARGET"
"$PY" -m pip install --disable-pip-version-check --no-input -q \
    --target "$TARGET" \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --implementation cp --python-version 3.11 --abi cp311 \
    --only-binary=:all: \
    -r "$ROOT/requirements.txt" -c "$ROOT/constraints.txt"

echo "layers: adding the switchyard package"
# Copied, not pip-installed: the layer must not carry editable-install paths from this machine.
(cd "$ROOT" && find switchyard -name '__pycache__' -prune -o -type f -print | while read -r f; do
    mkdir -p "$TARGET/$(dirname "$f")"
    cp "$f" "$TARGET/$f"
done)

# Drop what Lambda never needs: caches, tests shipped in wheels. boto3/botocore stay pinned
# (the runtime's own copy may be older or newer than what we test against).
find "$TARGET" -name '__pycache__' -type d -prune -exec rm -rf {} +
find "$TARGET" -name '*.dist-info' -type d -path '*/tests/*' -prune -exec rm -rf {} + 2>/dev/null || true

size="$(du -sm "$OUT" | cut -f1)"
echo "layers: built $OUT (${size} MB unzipped; Lambda allows 250 MB for a function and its layers)"
