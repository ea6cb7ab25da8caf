#!/usr/bin/env bash
# Installs what coli needs on a Debian/Ubuntu machine: the Vulkan loader, Mesa's CPU Vulkan
# driver (Lavapipe) and the tools the build compiles shaderc's vendored glslang with (cmake,
# ninja, g++, python3). Idempotent; skips apt when everything is there.
set -euo pipefail
pkgs=(mesa-vulkan-drivers libvulkan-dev vulkan-tools spirv-tools cmake ninja-build g++ python3 python3-pip unzip)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "coli needs a Rust toolchain (cargo); install it with rustup: https://rustup.rs" >&2
  exit 1
fi
