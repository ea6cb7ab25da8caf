#!/usr/bin/env bash
# The cooperative-matrix GEMMs' check on the GPU machine: runs the vk_coopmat test binary
# (built on the CPU machine: cargo test --release -p coli-runtime --test vk_coopmat --no-run)
# with the Vulkan loader from .gl/*.deb (see /work/shared/GPU.md), keeps its whole output in
# $OUT/coopmat.txt and prints one verdict line: PASS (the cooperative kernels ran and matched),
# SKIPPED (the device opened has no int8 cooperative-matrix shape: check the device line) or
# FAIL (with the failing lines). Exit status: the test binary's, 2 when skipped.
# Usage: bash tools/gpu-coopmat.sh path/to/vk_coopmat-<hash>
set -uo pipefail
bin=${1:?usage: tools/gpu-coopmat.sh path/to/vk_coopmat-binary}
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log=$OUT/coopmat.txt
# One test at a time, so the output of each stays together; --nocapture shows the errors and
# the times of every case.
"$bin" --test-threads=1 --nocapture > "$log" 2>&1
rc=$?
device=$(grep -o -m1 'vk_coopmat: .*' "$log" || echo "vk_coopmat: no device line")
if [ $rc -ne 0 ]; then
  echo "FAIL (rc $rc): $device; $(grep -E 'panicked|FAILED|failures:' "$log" | head -5 | tr '\n' ' ')"
elif grep -q 'SKIPPED' "$log"; then
  # Not what the GPU machine should give: exit 2.
  echo "SKIPPED: $device"
  rc=2
else
  worst=$(grep -o 'worst relative error [0-9.e+-]*' "$log" | awk '{print $4}' | sort -g | tail -1)
  echo "PASS: $device; $(grep -c 'worst relative error' "$log") comparisons, worst relative error ${worst:-?}"
fi
exit $rc
