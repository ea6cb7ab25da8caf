#!/usr/bin/env bash
# The test command: every test of the workspace, CPU and Vulkan (on Lavapipe when there is
# no GPU), against the committed oracle fixtures.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --release "$@"
