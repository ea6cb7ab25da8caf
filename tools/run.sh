#!/usr/bin/env bash
# The main job: install what coli needs, fetch the default model, build coli and answer a
# chat prompt with it. Usage: bash tools/run.sh ["prompt"] [more coli exec flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bash tools/fetch-model.sh >/dev/null
prompt="${1:-What is the capital of France? Answer in one sentence.}"
shift || true
echo "coli: building (the first build takes a few minutes on two cores)" >&2
cargo build --release -q
exec "${CARGO_TARGET_DIR:-target}/release/coli" exec --chat --prompt "$prompt" "$@"
