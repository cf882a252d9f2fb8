#!/usr/bin/env bash
# scripts/spark35.sh pytest ARGS...: run pytest with EMR 7.9's Spark (pyspark 3.5.5) instead of .venv's 4.x.
#
# The venv .local/spark35-venv holds only requirements-spark35.txt; a .pth file then adds .venv's
# site-packages behind it, so Switchyard and its dependencies are the very ones .venv has and only
# pyspark and py4j differ. Created on first use (about a minute), rebuilt when the pins change.
set -euo pipefail
NAME=spark35
HOST=127.0.0.1
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

VENV="$ROOT/.local/spark35-venv"
PINS="$ROOT/requirements-spark35.txt"
BASE_PY="$ROOT/.venv/bin/python"

[ -x "$BASE_PY" ] || die "no $BASE_PY: run ./dev setup first"
if [ ! -f "$VENV/.pins" ] || ! cmp -s "$PINS" "$VENV/.pins"; then
    say "creating $VENV with $(grep -v '^#' "$PINS" | xargs) (once; about a minute)"
    rm -rf "$VENV"
    python="$("$BASE_PY" -c 'import sys, os; print(os.path.realpath(sys._base_executable))')"
    "$python" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q -r "$PINS" ||
        die "pip could not install $PINS (see above)"
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$BASE_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/zz-switchyard-venv.pth"
    cp "$PINS" "$VENV/.pins"
fi
version="$("$VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)')"
case "${1:-}" in
pytest)
    shift
    say "pytest with pyspark $version: python -m pytest $*"
    exec "$VENV/bin/python" -m pytest "$@"
    ;;
*)
    echo "usage: scripts/spark35.sh pytest ARGS...  (pyspark $version in $VENV)" >&2
    exit 2
    ;;
esac
