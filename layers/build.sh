#!/usr/bin/env bash
# Build the Lambda layer directory for Switchyard's functions:
#   layers/build/switchyard/python/   <- requirements.txt (manylinux wheels for the platform of
#                                        stacks/constants.py: PYTHON_VERSION, CPU_ARCHITECTURE) + switchyard/
# Usage: layers/build.sh [--plan] [OUTPUT_DIR]   (default: layers/build/switchyard; LAYER_FORCE=1 rebuilds)
#   --plan: print what a build would do (up to date, or build with which interpreter), build nothing
# Runs on any Linux machine with pip and an interpreter of the Lambda runtime's Python (it compiles
# the bytecode Lambda loads, and bench/layer_imports.py imports the handlers with it: its path is kept
# in OUTPUT_DIR/.python). LAYER_PYTHON names one; else python3.X on PATH, pyenv's, /usr/bin's, or one
# uv manages; with none of these but uv installed (on PATH or in .venv), `uv python install` gets one.
# Downloads wheels only (pip's own cache, outside the repository, keeps them), compiles no C. Skips
# the build when its inputs (pins, the switchyard package, this script, the interpreters) are unchanged.
# Fails if the layer passes Lambda's 250 MB unzipped limit (layer + function code).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PLAN=0
if [ "${1:-}" = --plan ]; then
    PLAN=1
    shift
fi
OUT="${1:-$ROOT/layers/build/switchyard}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3.11 || command -v python3)"

# The platform, from the one place the stack reads it too.
constant() { sed -n "s/^$1 = \"\(.*\)\".*/\1/p" "$ROOT/stacks/constants.py"; }
VERSION="$(constant PYTHON_VERSION)"
ARCH="$(constant CPU_ARCHITECTURE)"
[ -n "$VERSION" ] && [ -n "$ARCH" ] || { echo "layers: error: PYTHON_VERSION/CPU_ARCHITECTURE not found in stacks/constants.py" >&2; exit 1; }
case "$ARCH" in x86_64) WHEEL_ARCH=x86_64 ;; arm64) WHEEL_ARCH=aarch64 ;; *) echo "layers: error: CPU_ARCHITECTURE $ARCH" >&2; exit 1 ;; esac
ABI="cp${VERSION/./}"

UV="$(command -v uv || true)"
[ -n "$UV" ] || { [ -x "$ROOT/.venv/bin/uv" ] && UV="$ROOT/.venv/bin/uv"; } || true
runs_version() { [ -n "$1" ] && "$1" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$VERSION'.split('.'))))" 2>/dev/null; }
find_layer_python() {
    local cand
    for cand in "${LAYER_PYTHON:-}" "$(command -v "python$VERSION" || true)" \
        "$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$VERSION".*/bin/python"$VERSION" 2>/dev/null | sort -V | tail -1)" \
        "/usr/bin/python$VERSION" "/usr/local/bin/python$VERSION" \
        "$([ -z "$UV" ] || "$UV" python find --no-project "$VERSION" 2>/dev/null || true)"; do
        if runs_version "$cand"; then
            echo "$cand"
            return 0
        fi
    done
    return 1
}
NO_PYTHON="layers: error: no Python $VERSION (the Lambda runtime's) found: install one (pyenv install $VERSION, Debian 13's python$VERSION, or 'pip install uv' and rerun: this script then gets one with 'uv python install $VERSION'), or set LAYER_PYTHON"
if ! LAYER_PY="$(find_layer_python)"; then
    [ -n "$UV" ] || { echo "$NO_PYTHON" >&2; exit 1; }
    if [ "$PLAN" = 1 ]; then
        echo "layers: build $OUT, with a Python $VERSION that '$UV python install $VERSION' downloads first"
        exit 0
    fi
    echo "layers: no Python $VERSION found: installing one with uv ($UV python install $VERSION)" >&2
    "$UV" python install "$VERSION" >&2 || { echo "layers: error: '$UV python install $VERSION' failed (see above); install Python $VERSION yourself or set LAYER_PYTHON" >&2; exit 1; }
    LAYER_PY="$(find_layer_python)" || { echo "$NO_PYTHON" >&2; exit 1; }
fi
# Lambda's runtime is a Linux build of CPython on this architecture: the import check needs the same.
[ "$(uname -m)" = "$WHEEL_ARCH" ] || echo "layers: warning: building $WHEEL_ARCH wheels on $(uname -m): bench/layer_imports.py cannot import them here" >&2

TARGET="$OUT/python"
LIMIT_BYTES=$((250 * 1000 * 1000))

inputs_hash() {
    (
        "$PY" -c 'import sys; print(sys.version)'
        "$LAYER_PY" -c 'import sys; print(sys.version)'
        echo "$VERSION $ARCH"
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
UP_TO_DATE=0
if [ "${LAYER_FORCE:-0}" != 1 ] && [ -f "$OUT/.inputs.sha256" ] && [ "$(cat "$OUT/.inputs.sha256")" = "$WANT" ]; then
    UP_TO_DATE=1
fi
if [ "$PLAN" = 1 ]; then
    if [ "$UP_TO_DATE" = 1 ]; then
        echo "layers: $OUT is up to date (skipped)"
    else
        echo "layers: build $OUT with $LAYER_PY (bytecode) and pip's manylinux $WHEEL_ARCH wheels"
    fi
    exit 0
fi
if [ "$UP_TO_DATE" = 1 ]; then
    echo "layers: $OUT is up to date (inputs unchanged; LAYER_FORCE=1 rebuilds)"
    echo "$LAYER_PY" >"$OUT/.python"
    check_size
    exit 0
fi

rm -rf "$OUT"
mkdir -p "$TARGET"

echo "layers: installing requirements.txt for manylinux $WHEEL_ARCH / CPython $VERSION into $TARGET"
"$PY" -m pip install --disable-pip-version-check --no-input -q \
    --target "$TARGET" \
    --platform "manylinux2014_$WHEEL_ARCH" --platform "manylinux_2_28_$WHEEL_ARCH" \
    --implementation cp --python-version "$VERSION" --abi "$ABI" \
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
echo "layers: compiling bytecode with $LAYER_PY"
"$LAYER_PY" -m compileall -q -j 0 --invalidation-mode unchecked-hash "$TARGET" >/dev/null

echo "$LAYER_PY" >"$OUT/.python"  # the interpreter bench/layer_imports.py imports the handlers with
echo "$WANT" >"$OUT/.inputs.sha256"
check_size
