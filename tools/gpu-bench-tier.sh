#!/usr/bin/env bash
# The expert tier's, the partial chain's, the KV split's and a mixer's benchmarks on the GPU
# machine (docs/BENCHMARKS.md).
# Expects the release binary in devbin/coli, pymoe-22m in devbin/pymoe and the Vulkan loader
# packages in .gl/ (all git-ignored, carried by the device tool); makes the random-weight
# checkpoints with tools/make_random_checkpoint.py and appends every result to $OUT/bench.txt.
# Usage: bash tools/gpu-bench-tier.sh [pymoe] [profile] [olmoe] [chain] [kvsplit] [x2] [gptoss]
# (NO_COOP=1 / NO_INT_DOT=1 add the profile arm's comparison runs without those device features.)
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=./devbin/coli
log() { echo "### $*" >> "$OUT/bench.txt"; "$@" >> "$OUT/bench.txt" 2>&1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$OUT/bench.txt"
for what in "$@"; do
  case $what in
  pymoe)
    # A quarter of its 192 routed experts; the history from a prose prompt (the bench measures
    # synthetic ids).
    P=devbin/pymoe
    # Carried gzipped (the device tool's 64 MiB).
    [ -f $P/model.safetensors ] || gunzip -c devbin/pymoe.safetensors.gz > $P/model.safetensors
    $B exec --model $P --device vulkan -n 200 --tier-experts 48 --no-warm-start --tier-history /tmp/pymoe.h \
      --prompt "Once upon a time, a little girl named Lily found a red ball in the park. She" > /dev/null 2>> "$OUT/bench.txt"
    log $B bench --model $P --device vulkan -p 512 -n 128 -r 3 --tier-experts 48 --tier-history /tmp/pymoe.h
    log $B bench --model $P --device vulkan -p 512 -n 128 -r 3 --tier-experts 48 --no-warm-start
    log $B bench --model $P --device vulkan -p 512 -n 128 -r 3 --no-expert-tier
    log $B bench --model $P --device cpu -p 512 -n 128 -r 3
    ;;
  profile)
    # OLMoE-1B-7B geometry, int8, every expert resident: speeds and the device time per kernel.
    M=/tmp/olmoe-1b-7b
    [ -d $M ] || python3 tools/make_random_checkpoint.py olmoe-1b-7b $M >> "$OUT/bench.txt" 2>&1
    log $B bench --model $M --device vulkan --quantize i8 -p 512 -n 128 -r 3
    [ -n "${NO_COOP:-}" ] && log $B bench --model $M --device vulkan --quantize i8 -p 512 -n 128 -r 3 --no-coopmat
    [ -n "${NO_INT_DOT:-}" ] && log $B bench --model $M --device vulkan --quantize i8 -p 512 -n 128 -r 3 --no-int-dot
    log $B bench --model $M --device vulkan --quantize i8 -p 512 -n 64 -r 1 --profile
    ;;
  olmoe)
    M=/tmp/olmoe-1b-7b
    [ -d $M ] || python3 tools/make_random_checkpoint.py olmoe-1b-7b $M >> "$OUT/bench.txt" 2>&1
    IDS=$(python3 -c "print(','.join(str(10 + (i * 104729) % 50000) for i in range(256)))")
    $B exec --model $M --device vulkan --quantize i8 -n 64 --tier-experts 256 --no-warm-start --tier-history /tmp/olmoe.h \
      --prompt-ids "$IDS" > /dev/null 2>> "$OUT/bench.txt"
    log $B bench --model $M --device vulkan --quantize i8 -p 512 -n 128 -r 3
    log $B bench --model $M --device vulkan --quantize i8 -p 512 -n 128 -r 3 --tier-experts 256 --tier-history /tmp/olmoe.h
    log $B bench --model $M --device vulkan --quantize i8 -p 512 -n 128 -r 3 --no-expert-tier
    ;;
  chain)
    M=/tmp/smollm2-135m
    [ -d $M ] || python3 tools/make_random_checkpoint.py smollm2-135m $M >> "$OUT/bench.txt" 2>&1
    log $B bench --model $M --device vulkan -p 512 -n 128 -r 3
    # A device cap that holds half the layers (coli compile with the same context: 134 MiB -> 15).
    log $B bench --model $M --device vulkan -p 512 -n 128 -r 3 --device-mem-mib 134
    log $B bench --model $M --device cpu -p 512 -n 128 -r 3
    ;;
  kvsplit)
    # A 32K-token context (filled first, untimed; the split run's fill by the same model
    # without the split: the split's host part makes a 32K fill take many minutes), the split
    # keeping 4K positions on the device.
    M=/tmp/smollm2-135m-long
    [ -d $M ] || python3 tools/make_random_checkpoint.py smollm2-135m-long $M >> "$OUT/bench.txt" 2>&1
    log $B bench --model $M --device vulkan -d 32768 -p 512 -n 128 -r 1
    log timeout ${SPLIT_LIMIT:-480} $B bench --model $M --device vulkan -d 32768 -p 512 -n 128 -r 1 --kv-device-positions 4096 --fill-unsplit
    ;;
  x2)
    # Two GPUs (the nvidia-h200-x2 machine): SmolLM2 geometry with the primary capped at half
    # the layers and the rest on the second device; OLMoE-1B-7B int8 with 8 layers on each.
    nvidia-smi -L >> "$OUT/bench.txt"
    M=/tmp/smollm2-135m
    [ -d $M ] || python3 tools/make_random_checkpoint.py smollm2-135m $M >> "$OUT/bench.txt" 2>&1
    log $B bench --model $M --device vulkan -p 512 -n 128 -r 3 --devices 2 --device-mem-mib 134 --device2-mem-mib 65536
    M=/tmp/olmoe-1b-7b
    [ -d $M ] || python3 tools/make_random_checkpoint.py olmoe-1b-7b $M >> "$OUT/bench.txt" 2>&1
    log $B bench --model $M --device vulkan --quantize i8 -p 512 -n 128 -r 3 --devices 2 --device-layers 8
    log $B bench --model $M --device vulkan --quantize i8 -p 512 -n 128 -r 3
    ;;
  gptoss)
    # gpt-oss-20b geometry (sliding window with sinks, clamped SwiGLU, 32 experts top-4), bf16.
    M=/tmp/gpt-oss-20b
    [ -d $M ] || python3 tools/make_random_checkpoint.py gpt-oss-20b $M >> "$OUT/bench.txt" 2>&1
    log $B bench --model $M --device vulkan -p 512 -n 128 -r 3
    ;;
  esac
done
