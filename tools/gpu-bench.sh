#!/usr/bin/env bash
# Benchmarks coli on the GPU machine (see docs/BENCHMARKS.md). Expects the release binary in
# devbin/coli and the Vulkan loader packages in .gl/ (both git-ignored, carried by the device
# tool), makes random-weight checkpoints with tools/make_random_checkpoint.py, and writes the
# results under $OUT.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
for g in "$@"; do
  python3 tools/make_random_checkpoint.py "$g" "/tmp/$g" 2>&1 | tail -1 | tee -a "$OUT/log.txt"
done
