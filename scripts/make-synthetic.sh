#!/usr/bin/env bash
# Writes a synthetic GGUF model: scripts/make-synthetic.sh --preset tiny-qwen3moe --out m.gguf
# (--help lists the options). Upstream llama-server loads what it writes.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo run -q --release --example make-synthetic -- "$@"
