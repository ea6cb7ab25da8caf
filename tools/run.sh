#!/usr/bin/env bash
# The main job: install what coli needs, fetch the default model, build coli and answer a
# chat prompt with it. Usage: bash tools/run.sh ["prompt"] [more coli exec flags]
# (COLI_BIN=path runs that binary instead of building one: the tests use it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bash tools/fetch-model.sh >/dev/null
prompt="${1:-What is the capital of France? Answer in one sentence.}"
shift || true
bin="${COLI_BIN:-}"
if [ -z "$bin" ]; then
  echo "coli: building (the first build takes a few minutes on two cores)" >&2
  cargo build --release -q
  bin="${CARGO_TARGET_DIR:-target}/release/coli"
fi
exec "$bin" exec --chat --prompt "$prompt" "$@"
