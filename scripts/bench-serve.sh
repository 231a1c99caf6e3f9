#!/usr/bin/env bash
# Serving benchmark, as issue 6 sets it: upstream llama-server and bloomery-serve on the same
# model with the same flags, one after the other; for each, N concurrent streamed /completion
# requests (default 4), each a distinct prompt of P tokens (default 2000, no shared prefix,
# cache_prompt off) followed by M greedy tokens (default 128). Reported per server (median over
# --runs rounds):
#   - TTFT: the median over the concurrent streams of the time from sending a request to its
#     first token
#   - decode tok/s (aggregate): once every stream has its first token (all prompts done), the
#     tokens the streams emit per second together until the last one ends
#   - output tok/s: all generated tokens over the whole round's wall time (prompts included)
# then the speed-ups (upstream's TTFT over ours, our rates over upstream's: above 1 is faster).
#
# usage: scripts/bench-serve.sh [-m MODEL] [-c CTX] [-np SLOTS] [-t THREADS] [-n N_PREDICT]
#                               [-p PROMPT_TOKENS] [--streams N] [--runs N]
# env:   BLOOMERY_CACHE (default ~/.cache/bloomery), UPSTREAM_BIN, BLOOMERY_BIN
set -euo pipefail

cd "$(dirname "$0")/.."
CACHE="${BLOOMERY_CACHE:-$HOME/.cache/bloomery}"
MODEL="$CACHE/models/gemma-3-270m-q4_k_m.gguf"
SLOTS=4
THREADS=$(nproc)
N_PREDICT=128
PROMPT_TOKENS=2000
STREAMS=4
RUNS=1
CTX=""
while [ $# -gt 0 ]; do
  case "$1" in
    -m) MODEL="$2"; shift 2 ;;
    -c) CTX="$2"; shift 2 ;;
    -np) SLOTS="$2"; shift 2 ;;
    -t) THREADS="$2"; shift 2 ;;
    -n) N_PREDICT="$2"; shift 2 ;;
    -p) PROMPT_TOKENS="$2"; shift 2 ;;
    --streams) STREAMS="$2"; shift 2 ;;
    --runs) RUNS="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ -f "$MODEL" ] || { echo "model not found: $MODEL (run scripts/fetch-test-data.sh)" >&2; exit 1; }
# every slot holds its prompt and its answer (the context is divided among the slots)
[ -n "$CTX" ] || CTX=$(( SLOTS * ((PROMPT_TOKENS + N_PREDICT + 64 + 255) / 256 * 256) ))

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
  for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then echo "server exited, see $log" >&2; exit 1; fi
    sleep 0.2
  done
  python3 - "$port" "$N_PREDICT" "$STREAMS" "$RUNS" "$PROMPT_TOKENS" <<'PY'
import http.client, json, statistics, sys, threading, time

port, n_predict, streams, runs, n_prompt = (int(a) for a in sys.argv[1:6])

def request(path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1200)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = json.loads(r.read())
    c.close()
    return data

TOPICS = ["iron smelting", "river deltas", "printing presses", "glaciers", "tidal mills",
          "lighthouses", "bread ovens", "clock towers"]

def prompt_tokens(i):
    """A prompt of exactly n_prompt tokens, different from the others from its first words."""
    topic = TOPICS[i % len(TOPICS)]
    parts = [f"Report {i} on {topic}."]
    k = 0
    while True:
        text = " ".join(parts)
        ids = request("/tokenize", {"content": text, "add_special": True})["tokens"]
        if len(ids) >= n_prompt:
            return ids[:n_prompt]
        k += 1
        parts.append(f"Section {k} of the report on {topic} describes observation {k * 7 + i} "
                     f"and measurement {k * 13 + i}, recorded in notebook {k % 5} on page {k}.")

def stream(prompt, n):
    """Returns (send time, token event times, end time, tokens generated)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1200)
    body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0, "stream": True,
                       "cache_prompt": False, "ignore_eos": True})
    t0 = time.perf_counter()
    c.request("POST", "/completion", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    times, n_tok = [], 0
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: "):
            continue
        ev = json.loads(line[6:])
        if ev.get("stop"):
            n_tok = ev.get("tokens_predicted", n_tok)
            break
        times.append(time.perf_counter())
    c.close()
    return t0, times or [time.perf_counter()], time.perf_counter(), n_tok

prompts = [prompt_tokens(i) for i in range(streams)]
stream(prompts[0][:32], 4)  # warm-up
ttfts, rates, outs = [], [], []
for _ in range(runs):
    results = [None] * streams
    def worker(i):
        results[i] = stream(prompts[i], n_predict)
    t_start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(streams)]
    for t in threads: t.start()
    for t in threads: t.join()
    ttfts.append(statistics.median(r[1][0] - r[0] for r in results))
    all_started = max(r[1][0] for r in results)
    end = max(r[2] for r in results)
    after = sum(sum(1 for t in r[1] if t > all_started) for r in results)
    rates.append(after / (end - all_started))
    outs.append(sum(r[3] for r in results) / (end - t_start))
print(f"{statistics.median(ttfts) * 1000:.1f} {statistics.median(rates):.2f} {statistics.median(outs):.2f}")
PY
  kill "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
}

echo "model: $MODEL  ctx: $CTX  slots: $SLOTS  threads: $THREADS  streams: $STREAMS x ($PROMPT_TOKENS prompt + $N_PREDICT generated)  runs: $RUNS"
read -r UP_TTFT UP_TPS UP_OUT < <(bench_one "$UPSTREAM_BIN" "$PORT_BASE" /tmp/bench-serve-upstream.log)
read -r OUR_TTFT OUR_TPS OUR_OUT < <(bench_one "$BLOOMERY_BIN" "$((PORT_BASE + 1))" /tmp/bench-serve-bloomery.log)
python3 - "$UP_TTFT" "$UP_TPS" "$UP_OUT" "$OUR_TTFT" "$OUR_TPS" "$OUR_OUT" <<'PY'
import sys
ut, us, uo, ot, os_, oo = (float(x) for x in sys.argv[1:7])
q = lambda a, b: a / b if b else float("nan")
print(f"{'':26}{'upstream':>12}{'bloomery':>12}{'speed-up':>10}")
print(f"{'TTFT (ms, median)':26}{ut:12.1f}{ot:12.1f}{q(ut, ot):10.2f}")
print(f"{'decode tok/s (aggregate)':26}{us:12.2f}{os_:12.2f}{q(os_, us):10.2f}")
print(f"{'output tok/s (wall)':26}{uo:12.2f}{oo:12.2f}{q(oo, uo):10.2f}")
PY
