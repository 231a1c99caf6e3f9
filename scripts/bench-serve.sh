#!/usr/bin/env bash
# Serving benchmark: starts upstream llama-server and bloomery-serve on the same model with the
# same flags, one after the other, and measures for each
#   - TTFT: time from sending a streamed /completion to its first token (median of single runs)
#   - aggregate decode tok/s: N concurrent greedy streams, generated tokens / wall time
# then prints both and the ratio ours/upstream.
#
# usage: scripts/bench-serve.sh [-m MODEL] [-c CTX] [-np SLOTS] [-t THREADS] [-n N_PREDICT]
#                               [--streams N] [--runs N]
# env:   BLOOMERY_CACHE (default ~/.cache/bloomery), UPSTREAM_BIN, BLOOMERY_BIN
set -euo pipefail

cd "$(dirname "$0")/.."
CACHE="${BLOOMERY_CACHE:-$HOME/.cache/bloomery}"
MODEL="$CACHE/models/gemma-3-270m-q4_k_m.gguf"
CTX=4096
SLOTS=4
THREADS=$(nproc)
N_PREDICT=64
STREAMS=4
RUNS=5
while [ $# -gt 0 ]; do
  case "$1" in
    -m) MODEL="$2"; shift 2 ;;
    -c) CTX="$2"; shift 2 ;;
    -np) SLOTS="$2"; shift 2 ;;
    -t) THREADS="$2"; shift 2 ;;
    -n) N_PREDICT="$2"; shift 2 ;;
    --streams) STREAMS="$2"; shift 2 ;;
    --runs) RUNS="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ -f "$MODEL" ] || { echo "model not found: $MODEL (run scripts/fetch-test-data.sh)" >&2; exit 1; }

UPSTREAM_BIN="${UPSTREAM_BIN:-$(scripts/upstream.sh)}"
if [ -z "${BLOOMERY_BIN:-}" ]; then
  cargo build --release --bin bloomery-serve >&2
  BLOOMERY_BIN=target/release/bloomery-serve
fi

PORT_BASE=$((20000 + RANDOM % 20000))
FLAGS=(-m "$MODEL" -c "$CTX" --parallel "$SLOTS" -t "$THREADS")
SERVER_PID=""
cleanup() { [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null || true; }
trap cleanup EXIT

# Starts a server, waits for /health, benchmarks it, stops it; prints "ttft_ms tok_s".
bench_one() {
  local bin="$1" port="$2" log="$3"
  "$bin" "${FLAGS[@]}" --host 127.0.0.1 --port "$port" >"$log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 300); do
    if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then echo "server exited, see $log" >&2; exit 1; fi
    sleep 0.2
  done
  python3 - "$port" "$N_PREDICT" "$STREAMS" "$RUNS" <<'PY'
import http.client, json, statistics, sys, threading, time

port, n_predict, streams, runs = (int(a) for a in sys.argv[1:5])
PROMPTS = [
    "The history of the printing press begins",
    "In a small village by the sea, there lived",
    "The main differences between rivers and canals are",
    "A recipe for a simple tomato soup:",
    "The theory of plate tectonics explains",
    "Once upon a time, in a kingdom far away,",
    "The three laws of motion state that",
    "When planning a long hike, remember to",
]

def stream(prompt, n):
    """Returns (ttft seconds, tokens generated, total seconds)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0,
                       "stream": True, "cache_prompt": False})
    t0 = time.perf_counter()
    c.request("POST", "/completion", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    ttft, n_tok = None, 0
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: "):
            continue
        ev = json.loads(line[6:])
        if ev.get("stop"):
            n_tok = ev.get("tokens_predicted", n_tok)
            break
        if ttft is None:
            ttft = time.perf_counter() - t0
    c.close()
    return ttft or 0.0, n_tok, time.perf_counter() - t0

stream(PROMPTS[0], 4)  # warm-up
ttfts = [stream(PROMPTS[i % len(PROMPTS)], 1)[0] for i in range(runs)]

results = [None] * streams
def worker(i):
    results[i] = stream(PROMPTS[i % len(PROMPTS)], n_predict)
t0 = time.perf_counter()
threads = [threading.Thread(target=worker, args=(i,)) for i in range(streams)]
for t in threads: t.start()
for t in threads: t.join()
wall = time.perf_counter() - t0
tokens = sum(r[1] for r in results)
print(f"{statistics.median(ttfts) * 1000:.1f} {tokens / wall:.2f}")
PY
  kill "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
}

echo "model: $MODEL  ctx: $CTX  slots: $SLOTS  threads: $THREADS  n_predict: $N_PREDICT  streams: $STREAMS"
read -r UP_TTFT UP_TPS < <(bench_one "$UPSTREAM_BIN" "$PORT_BASE" /tmp/bench-serve-upstream.log)
read -r OUR_TTFT OUR_TPS < <(bench_one "$BLOOMERY_BIN" "$((PORT_BASE + 1))" /tmp/bench-serve-bloomery.log)
python3 - "$UP_TTFT" "$UP_TPS" "$OUR_TTFT" "$OUR_TPS" <<'PY'
import sys
ut, us, ot, os_ = (float(x) for x in sys.argv[1:5])
print(f"{'':22}{'upstream':>12}{'bloomery':>12}{'ratio':>10}")
print(f"{'TTFT (ms, median)':22}{ut:12.1f}{ot:12.1f}{(ot / ut if ut else float('nan')):10.2f}")
print(f"{'decode tok/s (agg.)':22}{us:12.2f}{os_:12.2f}{(os_ / us if us else float('nan')):10.2f}")
PY
