#!/usr/bin/env bash
# Build the Lambda layer directory for Switchyard's functions:
#   layers/build/switchyard/python/   <- requirements.txt (manylinux x86_64, CPython 3.11) + switchyard/
# Usage: layers/build.sh [OUTPUT_DIR]   (default: layers/build/switchyard; LAYER_FORCE=1 rebuilds)
# Runs on any Linux machine with Python 3.11 and pip; downloads wheels only (pip's own cache,
# outside the repository, keeps them), compiles no C. Skips the build when its inputs (pins,
# the switchyard package, this script, the interpreter) are unchanged since the last one.
# Fails if the layer passes Lambda's 250 MB unzipped limit (layer + function code).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/layers/build/switchyard}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3.11 || command -v python3)"

TARGET="$OUT/python"
LIMIT_BYTES=$((250 * 1000 * 1000))

inputs_hash() {
    (
        "$PY" -c 'import sys; print(sys.version)'
        cd "$ROOT" && sha256sum requirements.txt constraints.txt layers/build.sh
        find switchyard -name '__pycache__' -prune -o -type f -print | LC_ALL=C sort | xargs sha256sum
    ) | sha256sum | cut -d' ' -f1
}

check_size() {
    local bytes functions
    bytes="$(du -sb "$OUT" | cut -f1)"
    functions="$(du -sb "$ROOT/functions" | cut -f1)"
    echo "layers: $OUT is $((bytes / 1000000)) MB unzipped, functions/ $((functions / 1000)) kB" \
        "(Lambda allows 250 MB for a function and its layers)"
    if [ $((bytes + functions)) -gt "$LIMIT_BYTES" ]; then
        echo "layers: error: layer + functions exceed Lambda's 250 MB unzipped limit" >&2
        exit 1
    fi
}

WANT="$(inputs_hash)"
if [ "${LAYER_FORCE:-0}" != 1 ] && [ -f "$OUT/.inputs.sha256" ] && [ "$(cat "$OUT/.inputs.sha256")" = "$WANT" ]; then
    echo "layers: $OUT is up to date (inputs unchanged; LAYER_FORCE=1 rebuilds)"
    check_size
    exit 0
fi

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

# Drop what Lambda never needs: this machine's caches, tests shipped in wheels. boto3/botocore
# stay pinned (the runtime's own copy may be older or newer than what we test against).
find "$TARGET" -name '__pycache__' -type d -prune -exec rm -rf {} +
find "$TARGET" -name '*.dist-info' -type d -path '*/tests/*' -prune -exec rm -rf {} + 2>/dev/null || true

# Ship bytecode: /opt is read-only in Lambda, so without it every cold start compiles every module.
# unchecked-hash pycs stay valid whatever mtimes the zip gives the sources.
echo "layers: compiling bytecode"
"$PY" -m compileall -q -j 0 --invalidation-mode unchecked-hash "$TARGET" >/dev/null

echo "$WANT" >"$OUT/.inputs.sha256"
check_size
