#!/usr/bin/env bash
# Compiles shaders/*.comp into the committed SPIR-V under shaders/spirv/ (tools/shaders, shaderc
# built from its vendored glslang: cmake, ninja and g++, several minutes the first time).
# Needed only after changing a shader or shaders/variants.rs. `--check` compares instead.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo run --release -q --manifest-path tools/shaders/Cargo.toml -- "$@"
