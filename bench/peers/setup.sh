#!/usr/bin/env bash
# Create the peers' own virtual environment (default .local/peers-venv) from requirements.txt.
# Kept apart from the project's .venv: the peers are measured, never imported by Switchyard.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${PEERS_VENV:-$ROOT/.local/peers-venv}"
PYTHON="${PYTHON:-python3.11}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/bench/peers/requirements.txt"
echo "$VENV"
