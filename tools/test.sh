#!/usr/bin/env bash
# The test command: every test of the workspace, CPU and Vulkan (on Lavapipe when there is
# no GPU), against the committed oracle fixtures. Ends with one summary line over all test
# binaries: "N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
cargo test --workspace --release "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
awk '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed\n", p, f }' "$log"
rm -f "$log"
exit "$rc"
