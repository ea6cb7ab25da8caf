#!/usr/bin/env bash
# Makes a Python virtual environment with the `openai` package, the client the server's tests
# drive `coli serve` with, in the user's cache. Prints the path of its python. Idempotent.
set -euo pipefail
venv="${XDG_CACHE_HOME:-$HOME/.cache}/coli/venv-openai"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import openai" >/dev/null 2>&1; then
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install -q "openai==3.57.0" >&2
fi
echo "$venv/bin/python"
