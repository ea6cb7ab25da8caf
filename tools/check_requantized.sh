#!/usr/bin/env bash
# The default model (SmolLM2-135M-Instruct, Q4_1) requantized by llama.cpp's llama-quantize into
# the popular GGUF types, each answering the README's chat prompt through coli (CPU, then the
# Vulkan device when there is one) and through llama.cpp's llama-cli on the same file, greedy.
# Prints the three answers per type; fails when coli's CPU answer is not llama-cli's. (Below
# 4 bits a weight, requantized from Q4_1, the two engines' 8-bit activations round apart and
# the answers part after a few words: Q2_K and IQ3_S do, and are not in the default list.)
# Needs the peer's binaries (../shared/peers/bin, unpacked into a scratch folder) and a release
# build of coli (cargo build --release). Usage: bash tools/check_requantized.sh [TYPE...]
set -uo pipefail
cd "$(dirname "$0")/.."
peers="${PEERS:-../shared/peers}"
model="${COLI_MODEL:-$HOME/.cache/coli/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf}"
prompt="What is the capital of France? Answer in one sentence."
types=("$@")
[ ${#types[@]} -gt 0 ] || types=(Q5_K_M Q3_K_M IQ4_XS Q4_K_M Q6_K Q8_0)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for b in llama-quantize llama-cli; do
  xz -dc "$peers/bin/$b.xz" >"$work/$b" && chmod +x "$work/$b" || { echo "no $peers/bin/$b.xz" >&2; exit 2; }
done
bad=0
for t in "${types[@]}"; do
  f="$work/smollm2-$t.gguf"
  "$work/llama-quantize" --allow-requantize "$model" "$f" "$t" 2 >"$work/q.log" 2>&1 || { echo "$t: llama-quantize failed" >&2; bad=1; continue; }
  cpu=$(target/release/coli exec -q -m "$f" --chat --prompt "$prompt" -n 32 --device cpu 2>&1)
  dev=$(target/release/coli exec -q -m "$f" --chat --prompt "$prompt" -n 32 --device auto 2>&1)
  peer=$("$work/llama-cli" -m "$f" -p "$prompt" -n 32 --temp 0 -st --simple-io -t 2 -dev none </dev/null 2>/dev/null |
    sed -n "/^> $prompt/{n;p;q}")
  echo "$t: coli cpu: $cpu | coli auto: $dev | llama-cli: $peer"
  [ "$cpu" = "$peer" ] || { echo "$t: coli's CPU answer is not llama-cli's" >&2; bad=1; }
done
exit $bad
